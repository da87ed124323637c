"""Packages: the pinned NVIDIA driver installed and held, stack packages held, tools present."""

from __future__ import annotations

from hosttune.actions.base import Step, blocked
from hosttune.actions.platform import select
from hosttune.checks.driver import STACK_PACKAGE
from hosttune.probes.facts import Facts
from hosttune.config.inventory import Host
from hosttune.config.profile import Profile


def no_manager(facts: Facts) -> str:
    where = "in the image" if facts.image else "on this host"
    return f"no apt or dnf {where}: install and hold packages with its own package manager"


def driver_version(facts: Facts, profile: Profile, host: Host) -> list[Step]:
    """The driver packages at the pinned version, held; the new kernel module loads at the next boot."""
    pin = profile.driver.version
    if pin is None:
        return [blocked("driver.version", "kernel module and userspace library differ: reboot to load the installed module")]
    platform = select(facts)
    if platform.packages is None:
        return [blocked("driver.version", no_manager(facts))]
    names = profile.driver.packages or platform.packages.driver_packages(pin)
    op = platform.packages_op(names, pin, hold=profile.driver.held)
    return [Step(("driver.version",), f"NVIDIA driver {pin} installed" + (" and held" if profile.driver.held else ""),
                 (op,), needs_reboot=True)]


def driver_held(facts: Facts, profile: Profile, host: Host) -> list[Step]:
    """apt-mark hold (dnf versionlock add) every installed driver and CUDA package not held yet."""
    platform = select(facts)
    if platform.packages is None:
        return [blocked("driver.held", no_manager(facts))]
    unheld = tuple(sorted(p for p in facts.packages if STACK_PACKAGE.match(p) and p not in facts.held))
    steps = []
    if support := platform.packages.hold_support():
        steps.append(Step(("driver.held",), "package hold support installed", (platform.packages_op(support),)))
    steps.append(Step(("driver.held",), f"{len(unheld)} driver/CUDA packages held", (platform.packages_op(unheld, hold=True),)))
    return steps


def numactl(facts: Facts, profile: Profile, host: Host) -> list[Step]:
    """The numactl package installed (deploy binds engines to their GPU's NUMA node with it)."""
    platform = select(facts)
    if platform.packages is None:
        return [blocked("tools.numactl", no_manager(facts))]
    return [Step(("tools.numactl",), "numactl installed", (platform.packages_op(("numactl",)),))]


def python_version(facts: Facts, profile: Profile, host: Host) -> list[Step]:
    """The pinned Python interpreter installed from the distribution's repositories."""
    platform = select(facts)
    if platform.packages is None:
        return [blocked("python.version", no_manager(facts))]
    name = platform.packages.python_package(profile.tools.python)
    return [Step(("python.version",), f"{name} installed", (platform.packages_op((name,)),))]
