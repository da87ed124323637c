"""Where distributions differ, chosen in one place: `select(facts)`.

A Platform bundles the package flavour (apt or dnf: install, hold, package names) and
the boot loader flavour (a grub drop-in plus update-grub, or grubby). Every action asks
the platform; no action tests the distribution itself.
"""

from __future__ import annotations

from dataclasses import dataclass

from hosttune.actions.base import Command, FileWrite, Packages, Step
from hosttune.rendering import render
from hosttune.probes.facts import Facts
from hosttune.probes.system import GRUB_DROPIN


def is_refresh(argv: tuple[str, ...]) -> bool:
    """A package list refresh (apt-get update, dnf makecache): it installs and removes nothing."""
    return tuple(argv) in (Apt().refresh(), Dnf().refresh())


def _major(version: str) -> str:
    return version.split(".")[0]


def _major_minor(version: str) -> str:
    return "-".join(version.split(".")[:2])


@dataclass(frozen=True)
class Apt:
    """Debian and Ubuntu: apt-get, apt-mark hold, NVIDIA's and Ubuntu's package names."""

    name: str = "apt"

    def install(self, specs: tuple[tuple[str, str | None], ...]) -> tuple[str, ...]:
        """Only an install to an exact pin may move held packages or downgrade; any other install that would
        fails, as apt-get does by default, rather than change the held driver stack unasked."""
        words = tuple(f"{n}={v}" if v else n for n, v in specs)
        pinned = ("--allow-downgrades", "--allow-change-held-packages") if any(v for _, v in specs) else ()
        return ("env", "DEBIAN_FRONTEND=noninteractive", "apt-get", "install", "-y", "-q",
                "--no-install-recommends", *pinned, *words)

    def refresh(self) -> tuple[str, ...]:
        return ("apt-get", "update", "-q")

    def hold(self, names: tuple[str, ...]) -> Command:
        return Command(("apt-mark", "hold", *names), undo=("apt-mark", "unhold", *names))

    def hold_support(self) -> tuple[str, ...]:
        return ()  # apt-mark ships with apt

    def driver_packages(self, pin: str) -> tuple[str, ...]:
        return (f"nvidia-driver-{_major(pin)}",)

    def cuda_packages(self, pin: str) -> tuple[str, ...]:
        return (f"cuda-toolkit-{_major_minor(pin)}",)

    def python_package(self, pin: str) -> str:
        return f"python{pin}"

    def venv_package(self, python: str) -> str:
        """What gives `python` (python3, python3.11) its venv module and ensurepip."""
        return f"{python}-venv"


@dataclass(frozen=True)
class Dnf:
    """RHEL, Rocky, Alma, Fedora: dnf, dnf versionlock, NVIDIA's RHEL repository names."""

    name: str = "dnf"

    def install(self, specs: tuple[tuple[str, str | None], ...]) -> tuple[str, ...]:
        """Only an install to an exact pin may erase conflicting packages (another driver stream)."""
        words = tuple(f"{n}-{v}" if v else n for n, v in specs)
        pinned = ("--allowerasing",) if any(v for _, v in specs) else ()
        return ("dnf", "install", "-y", "-q", *pinned, *words)

    def refresh(self) -> tuple[str, ...]:
        return ("dnf", "makecache", "-q")

    def hold(self, names: tuple[str, ...]) -> Command:
        return Command(("dnf", "versionlock", "add", *names), undo=("dnf", "versionlock", "delete", *names))

    def hold_support(self) -> tuple[str, ...]:
        return ("python3-dnf-plugin-versionlock",)

    def driver_packages(self, pin: str) -> tuple[str, ...]:
        return ("nvidia-driver", "nvidia-driver-cuda")

    def cuda_packages(self, pin: str) -> tuple[str, ...]:
        return (f"cuda-toolkit-{_major_minor(pin)}",)

    def python_package(self, pin: str) -> str:
        return f"python{pin}"

    def venv_package(self, python: str) -> str:
        """ensurepip's bundled pip wheel, which RHEL-likes package apart from the interpreter."""
        return f"{python}-pip-wheel"


@dataclass(frozen=True)
class GrubDropIn:
    """Debian/Ubuntu grub: /etc/default/grub.d/90-hosttune.cfg, then update-grub."""

    name: str = "grub drop-in"

    def ops(self, params: tuple[str, ...], facts: Facts) -> tuple:
        content = render("grub-hosttune.cfg.j2", params=params)
        return (FileWrite(GRUB_DROPIN, content, 0o644), Command(("update-grub",), regenerate=True))

    def why_not(self, params: tuple[str, ...], facts: Facts) -> str:
        """A drop-in read after ours that sets the line anew would drop what ours appends."""
        if not facts.grub_overrides:
            return ""
        return (f"{facts.grub_overrides[0]} sets GRUB_CMDLINE_LINUX_DEFAULT after {GRUB_DROPIN} and would drop its "
                f"parameters: make it append ($GRUB_CMDLINE_LINUX_DEFAULT ...), or add {' '.join(params)} to it by hand")


@dataclass(frozen=True)
class Grubby:
    """RHEL-likes (BootLoaderSpec entries): grubby edits every installed kernel's arguments."""

    name: str = "grubby"

    def ops(self, params: tuple[str, ...], facts: Facts) -> tuple:
        keys = [p.partition("=")[0] for p in params]
        old = [f"{k}={v}" for k in keys if (v := facts.cmdline_param(k, configured=True)) is not None]
        undo = ("grubby", "--update-kernel=ALL", f"--remove-args={' '.join(keys)}") + ((f"--args={' '.join(old)}",) if old else ())
        return (Command(("grubby", "--update-kernel=ALL", f"--args={' '.join(params)}"), undo=undo),)

    def why_not(self, params: tuple[str, ...], facts: Facts) -> str:
        return ""


PackageFlavour = Apt | Dnf
BootFlavour = GrubDropIn | Grubby


@dataclass(frozen=True)
class Platform:
    packages: PackageFlavour | None
    boot: BootFlavour | None
    why_no_boot: str = ""

    def packages_op(self, names: tuple[str, ...], pin: str | None = None, hold: bool = False) -> Packages:
        assert self.packages is not None
        return Packages(self.packages.name, names, pin, hold)

    def kernel_params_step(self, fixes: tuple[str, ...], params: tuple[str, ...], facts: Facts) -> Step:
        assert self.boot is not None
        if why := self.boot.why_not(params, facts):
            return Step(fixes, "no automatic fix", blocked=why)
        return Step(fixes, f"kernel command line via {self.boot.name}: {' '.join(params)}",
                    self.boot.ops(params, facts), needs_reboot=True)


def _package_flavour(facts: Facts) -> PackageFlavour | None:
    flavours = {"apt": Apt(), "dnf": Dnf()}
    if facts.package_manager in flavours:
        return flavours[facts.package_manager]
    family = {facts.os_id, *facts.os_like}
    if family & {"debian", "ubuntu"}:
        return Apt()
    if family & {"rhel", "fedora", "centos"}:
        return Dnf()
    return None


def select(facts: Facts) -> Platform:
    """The one place that looks at the distribution and boot loader."""
    packages = _package_flavour(facts)
    if facts.cmdline_source == "grubby" or (isinstance(packages, Dnf) and facts.cmdline_source == "grub"):
        return Platform(packages, Grubby())
    if facts.cmdline_source == "grub":
        return Platform(packages, GrubDropIn())
    if facts.cmdline_source:
        return Platform(packages, None, f"boot loader configured through {facts.cmdline_source}, which hosttune does not edit")
    if facts.image:
        return Platform(packages, None, "the image has no boot loader configuration (no /etc/default/grub, grubby or "
                                        "/etc/kernel/cmdline)")
    return Platform(packages, None, "no boot loader configuration found (a VM or container whose kernel command line is set by its host)")
