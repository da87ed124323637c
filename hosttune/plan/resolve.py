"""Resolving a step against the host's current state: keep only the operations that change something.

Files with the wanted bytes, units already enabled, kernel values already set, packages
already at the pin: all dropped. Packages become exact install and hold commands. An
operation that cannot be done on the host as it is raises Blocked, with the reason.
"""

from __future__ import annotations

import re
from dataclasses import replace

from hosttune import cpulist
from hosttune.actions.base import (
    Command, CommentOut, FileWrite, KernelWrite, Remove, Op, Packages, Service, Step, Symlink,
)
from hosttune.actions.platform import Apt, Dnf
from hosttune.plan.state import FileState, PackageState, State, sha256
from hosttune.probes.system import selected

FILE_OPS = (FileWrite, CommentOut, Symlink, Remove)
ENABLED = ("enabled", "enabled-runtime", "alias", "linked", "linked-runtime")
ACTIVE = ("active", "activating", "reloading")


class Blocked(Exception):
    """An operation cannot be carried out on this host as it is; the reason goes in the plan."""


def matches_pin(version: str, pin: str) -> bool:
    """Package version 535.129.03-0ubuntu1 (or 3:535.129.03-1.el9) is pin 535.129.03, and in pin 535 (a branch)."""
    bare = version.split(":", 1)[1] if re.match(r"^\d+:", version) else version
    return bare == pin or any(bare.startswith(pin + sep) for sep in "-+~.")


def kernel_value_holds(path: str, current: str | None, want: str, *, exact: bool = False) -> bool:
    """Does the kernel file read as `want`? IRQ affinity holds within the wanted cores (exact: the same cores)."""
    if current is None:
        return False
    if path.endswith("/transparent_hugepage/enabled"):
        return (selected(current) or current.strip()) == want
    if path.endswith("/smp_affinity_list"):
        try:
            have, wanted = set(cpulist.parse(current)), set(cpulist.parse(want))
        except ValueError:
            return False
        return have == wanted if exact else have <= wanted
    return current.strip() == want.strip()


def comment_out(content: bytes, key: str) -> bytes:
    """Every active line setting sysctl `key` commented out, with a note saying who did it."""
    out = []
    for line in content.decode("utf-8", "surrogateescape").splitlines(keepends=True):
        name, sep, _ = line.partition("=")
        if sep and not line.lstrip().startswith(("#", ";")) and name.strip().replace("/", ".") == key:
            line = f"# {line.rstrip(chr(10))}  # disabled by hosttune (see /etc/sysctl.d/90-hosttune.conf)\n"
        out.append(line)
    return "".join(out).encode("utf-8", "surrogateescape")


def _file(state: State, path: str) -> FileState:
    return state.files.get(path) or FileState(path, "absent")


def _write_target(fs: FileState) -> str:
    """Writes go through a symbolic link to the file it names (the link stays)."""
    return fs.real if fs.link and fs.real else fs.path


def _resolve_write(op: FileWrite, state: State) -> list[Op]:
    fs = _file(state, op.path)
    if fs.kind in ("dir", "other"):
        raise Blocked(f"{op.path} is a {'directory' if fs.kind == 'dir' else 'special file'}, not a regular file")
    if fs.kind == "file" and fs.sha256 == sha256(op.content):
        return []
    return [replace(op, path=_write_target(fs))]


def _resolve_comment_out(op: CommentOut, state: State) -> list[Op]:
    fs = _file(state, op.path)
    if fs.kind != "file" or fs.content is None:
        return []
    new = comment_out(fs.content, op.key)
    return [] if new == fs.content else [FileWrite(_write_target(fs), new, fs.mode or 0o644)]


def _resolve_symlink(op: Symlink, state: State) -> list[Op]:
    fs = _file(state, op.path)
    if op.target in (fs.link, fs.real):
        return []  # also when it gets there through a chain of links (update-alternatives)
    if fs.kind == "dir" and not fs.link:
        raise Blocked(f"{op.path} is a directory, not a link; move it away by hand first")
    return [op]


def _resolve_service(op: Service, state: State, step: Step, offline: bool) -> list[Op]:
    unit = state.units.get(op.unit)
    enabled, active = (unit.enabled, unit.active) if unit else ("", None)
    created = any(isinstance(o, FileWrite) and o.path == f"/etc/systemd/system/{op.unit}" for o in step.ops)
    if enabled in ("", "not-found") and not created:
        if op.enabled or op.running:
            raise Blocked(f"{op.unit} is not installed")
        return []
    enable = None
    if op.enabled is True and enabled not in ENABLED + ("static", "indirect", "generated"):
        enable = True
    elif op.enabled is False and enabled in ENABLED:
        enable = False
    run = None
    if not offline and op.running is not None and (active in ACTIVE) != op.running:
        run = op.running
    if enable is not None and run is not None and enable != run:
        return [Service(op.unit, enable, None), Service(op.unit, None, run)]
    return [Service(op.unit, enable, run)] if (enable, run) != (None, None) else []


def _resolve_kernel(op: KernelWrite, state: State) -> list[Op]:
    paths = tuple(p for p in op.paths if not kernel_value_holds(p, state.kernel.get(p), op.value))
    return [KernelWrite(paths, op.value)] if paths else []


def _flavour(manager: str) -> Apt | Dnf:
    return Apt() if manager == "apt" else Dnf()


def _version_key(version: str) -> tuple[int, ...]:
    """Numbers in order, epoch first: enough to find the newest release of one package's pin."""
    return tuple(int(n) for n in re.findall(r"\d+", version))


def _install_spec(op: Packages, pkg: PackageState) -> tuple[str, str | None] | None:
    """(name, exact version or None) to install, or None when what is installed already fits."""
    if pkg.installed and (op.pin is None or matches_pin(pkg.installed, op.pin)):
        return None
    if op.pin is None:
        if not pkg.available:
            raise Blocked(f"no installation candidate for {pkg.name} in the configured repositories")
        return pkg.name, None
    version = max((v for v in pkg.available if matches_pin(v, op.pin)), key=_version_key, default=None)
    if version is None:
        seen = f" (available: {', '.join(pkg.available[:4])})" if pkg.available else ""
        raise Blocked(f"no {pkg.name} {op.pin} in the package lists{seen}; refresh them or add the repository that has it")
    return pkg.name, version


def _resolve_packages(op: Packages, state: State) -> list[Op]:
    flavour = _flavour(op.manager)
    specs = [s for n in op.names if (s := _install_spec(op, state.packages.get(n) or PackageState(n, None)))]
    ops: list[Op] = []
    if specs:
        ops += [Command(flavour.refresh()), Command(flavour.install(tuple(specs)))]
    to_hold = tuple(n for n in op.names if op.hold and n not in state.held)
    if to_hold:
        ops.append(flavour.hold(to_hold))
    return ops


def _resolve_op(op: Op, state: State, step: Step, offline: bool) -> list[Op]:
    if isinstance(op, FileWrite):
        return _resolve_write(op, state)
    if isinstance(op, CommentOut):
        return _resolve_comment_out(op, state)
    if isinstance(op, Symlink):
        return _resolve_symlink(op, state)
    if isinstance(op, Remove):
        return [op] if _file(state, op.path).exists else []
    if isinstance(op, Service):
        return _resolve_service(op, state, step, offline)
    if isinstance(op, KernelWrite):
        return [] if offline else _resolve_kernel(op, state)
    if isinstance(op, Packages):
        return _resolve_packages(op, state)
    return [op]


def _offline_notes(step: Step) -> tuple[str, ...]:
    notes = []
    for op in step.ops:
        if isinstance(op, KernelWrite):
            notes.append(f"--root: live kernel write skipped ({op.value!r} to {', '.join(op.paths[:3])}{' …' if len(op.paths) > 3 else ''})")
        elif isinstance(op, Command) and not op.offline:
            notes.append(f"--root: skipped {' '.join(op.argv)} (acts on the running system)")
        elif isinstance(op, Service) and op.running is not None:
            notes.append(f"--root: {op.unit} not {'started' if op.running else 'stopped'} (no running system)")
    return tuple(notes)


def resolve_step(step: Step, state: State, offline: bool = False) -> Step | None:
    """The step with only the operations that change something; None when nothing does.

    offline (--root): live kernel writes and running-system commands are left out, with a note.
    Raises Blocked when an operation cannot be done on this host as it is.
    """
    ops: list[Op] = []
    for op in step.ops:
        if isinstance(op, Command) and op.regenerate:
            ops.append(op)  # kept below only if a file it rebuilds from changes
            continue
        if isinstance(op, Command) and offline and not op.offline:
            continue
        # two edits through links of one file (99-sysctl.conf -> ../sysctl.conf) are one write of it
        ops += [o for o in _resolve_op(op, state, step, offline) if o not in ops]
    changes_files = any(isinstance(o, FILE_OPS) for o in ops)
    ops = [o for o in ops if not (isinstance(o, Command) and o.regenerate and (not changes_files or (offline and not o.offline)))]
    if not ops:
        return None
    notes = step.notes + (_offline_notes(step) if offline else ())
    return replace(step, ops=tuple(ops), notes=notes)
