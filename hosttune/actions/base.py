"""The one vocabulary of host changes: operations, and the steps `apply` groups them into.

Actions never run anything. An operation says *what* should hold on the host (this file
with these bytes, this unit disabled, this value in this kernel file). `apply` and `deploy`
both build lists of these operations; `hosttune.plan` drops the ones that already hold,
and `hosttune.execute` is the only code that carries them out (backing up and journalling
an apply as it goes). The vocabulary sits at the actions layer so that plan, deploy and
execute, which all sit above it, can share it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from posixpath import dirname
from typing import ClassVar, Union

from hosttune.actions.needs import Need, NeedCommand, NeedDir, NeedSpace, parents, program
from hosttune.quoting import join


@dataclass(frozen=True)
class FileWrite:
    """Make `path` hold exactly `content` (or the bytes of the local file `source`, e.g. a wheel).

    A new file gets `mode`; an existing one keeps owner and mode. The write is atomic and its
    hash is checked on arrival.
    """

    path: str
    content: bytes = b""
    mode: int = 0o644
    source: Path | None = None

    @property
    def argv(self) -> tuple[str, ...]:
        return ("hosttune-write", self.path)

    def body(self) -> bytes:
        return self.source.read_bytes() if self.source is not None else self.content

    @property
    def num_bytes(self) -> int:
        return self.source.stat().st_size if self.source is not None else len(self.content)

    @property
    def needs(self) -> tuple[Need, ...]:
        return (NeedSpace(self.path, self.num_bytes),)

    @property
    def provides(self) -> tuple[Need, ...]:
        return tuple(NeedDir(d) for d in parents(self.path))  # the write makes its directories


@dataclass(frozen=True)
class CommentOut:
    """Comment out the lines of the sysctl file `path` that set `key` (the planner reads the file and turns this into a FileWrite)."""

    path: str
    key: str

    @property
    def argv(self) -> tuple[str, ...]:
        return ("hosttune-comment-out", self.key, self.path)

    needs: ClassVar[tuple[Need, ...]] = ()
    provides: ClassVar[tuple[Need, ...]] = ()


@dataclass(frozen=True)
class Symlink:
    """Make `path` a symbolic link to `target`."""

    path: str
    target: str

    @property
    def argv(self) -> tuple[str, ...]:
        return ("ln", "-sfn", self.target, self.path)

    @property
    def needs(self) -> tuple[Need, ...]:
        return (NeedDir(dirname(self.path) or "/"),)  # the new link is renamed into place beside it

    provides: ClassVar[tuple[Need, ...]] = ()


@dataclass(frozen=True)
class Directory:
    """Make the directory `path` and any missing above it (a journalled run removes what it made on rollback)."""

    path: str

    @property
    def argv(self) -> tuple[str, ...]:
        return ("mkdir", "-p", "--", self.path)

    needs: ClassVar[tuple[Need, ...]] = ()

    @property
    def provides(self) -> tuple[Need, ...]:
        return tuple(NeedDir(d) for d in (self.path, *parents(self.path)))


@dataclass(frozen=True)
class Remove:
    """Take `path` off the host. A journalled run (apply) moves it into the run's backup folder,
    so rollback can bring it back; a deploy removes it (its releases are how deploy goes back)."""

    path: str

    @property
    def argv(self) -> tuple[str, ...]:
        return ("rm", "-rf", "--", self.path)

    needs: ClassVar[tuple[Need, ...]] = ()
    provides: ClassVar[tuple[Need, ...]] = ()


@dataclass(frozen=True)
class Service:
    """A systemd unit's boot-time (`enabled`) and current (`running`) state; None leaves it as it is."""

    unit: str
    enabled: bool | None = None
    running: bool | None = None

    @property
    def argv(self) -> tuple[str, ...]:
        if self.enabled is not None:
            verb = "enable" if self.enabled else "disable"
            now = ("--now",) if self.running is self.enabled else ()
            return ("systemctl", verb, *now, self.unit)
        return ("systemctl", "start" if self.running else "stop", self.unit)

    needs: ClassVar[tuple[Need, ...]] = (NeedCommand("systemctl", on_machine=True),)  # --root: systemctl --root
    provides: ClassVar[tuple[Need, ...]] = ()


@dataclass(frozen=True)
class KernelWrite:
    """A live kernel write: `value` into every file in `paths` (/proc, /sys). Lost at reboot."""

    paths: tuple[str, ...]
    value: str

    @property
    def argv(self) -> tuple[str, ...]:
        return ("tee", *self.paths)

    needs: ClassVar[tuple[Need, ...]] = ()
    provides: ClassVar[tuple[Need, ...]] = ()


@dataclass(frozen=True)
class Command:
    """A command run as is.

    undo: the command that reverses it (rollback runs it), if any.
    regenerate: it rebuilds state from files (update-grub, daemon-reload); rollback runs it
    again after restoring those files.
    offline: it is meaningful on an image too (--root runs it inside the root with chroot);
    False: it acts on the running system only, and --root skips it.
    fail_on_stderr: an exit 0 still fails when stderr mentions any of these.
    fail_on_stdout: ... or when stdout does (a report printed as a table, such as dcgmi diag's).
    requires: what it needs on the host besides its program (e.g. a virtualenv-capable Python).
    meets: what it gives later operations (e.g. installing python3-venv).
    """

    argv: tuple[str, ...]
    undo: tuple[str, ...] | None = None
    regenerate: bool = False
    offline: bool = True
    timeout: float = 3600.0
    fail_on_stderr: tuple[str, ...] = ()
    fail_on_stdout: tuple[str, ...] = ()
    requires: tuple[Need, ...] = ()
    meets: tuple[Need, ...] = ()

    @property
    def needs(self) -> tuple[Need, ...]:
        name = program(self.argv)
        return ((NeedCommand(name),) if name and "/" not in name else ()) + self.requires

    @property
    def provides(self) -> tuple[Need, ...]:
        return self.meets


@dataclass(frozen=True)
class Packages:
    """These packages installed (at `pin` when given, matching `version == pin` or `pin-…`) and held.

    The planner resolves it against the host's package database into install and hold
    commands, using the platform that `actions.platform.select` chose.
    """

    manager: str  # "apt" | "dnf"
    names: tuple[str, ...]
    pin: str | None = None
    hold: bool = False

    @property
    def argv(self) -> tuple[str, ...]:
        specs = tuple(f"{n}={self.pin}" if self.pin else n for n in self.names)
        return (f"{self.manager}-install", *specs) + (("+hold",) if self.hold else ())

    needs: ClassVar[tuple[Need, ...]] = ()  # those of the commands the planner resolves it into
    provides: ClassVar[tuple[Need, ...]] = ()


Op = Union[FileWrite, CommentOut, Symlink, Directory, Remove, Service, KernelWrite, Command, Packages]


def describe(op: Op) -> str:
    """One line per operation, shell-like where there is a command: what dry runs, journals and errors print."""
    if isinstance(op, FileWrite):
        if op.source is not None:
            return f"upload {op.source.name} to {op.path}"
        return f"write {op.path} ({len(op.content)} bytes, new files get mode {op.mode:04o})"
    if isinstance(op, CommentOut):
        return f"comment out {op.key} in {op.path}"
    if isinstance(op, Symlink):
        return f"link {op.path} -> {op.target}"
    if isinstance(op, Directory):
        return f"make directory {op.path}"
    if isinstance(op, Remove):
        return f"remove {op.path}"
    if isinstance(op, KernelWrite):
        shown = ", ".join(op.paths[:4]) + (f" and {len(op.paths) - 4} more" if len(op.paths) > 4 else "")
        return f"live kernel write: {op.value!r} to {shown}"
    if isinstance(op, Command) and op.undo:
        return f"$ {join(op.argv)}    (undo: {join(op.undo)})"
    return f"$ {join(op.argv)}"


@dataclass(frozen=True)
class Step:
    """One coherent change, fixing one or more findings.

    ops run in order. `blocked` says why hosttune cannot fix the finding itself (no ops then).
    `opt_in` names the apply flag without which the step is left out (e.g. "prune-cuda").
    """

    fixes: tuple[str, ...]
    summary: str
    ops: tuple[Op, ...] = ()
    needs_reboot: bool = False
    notes: tuple[str, ...] = ()
    blocked: str = ""
    opt_in: str = ""

    @property
    def commands(self) -> tuple[tuple[str, ...], ...]:
        return tuple(op.argv for op in self.ops)

    @property
    def writes(self) -> tuple[FileWrite, ...]:
        return tuple(op for op in self.ops if isinstance(op, FileWrite))

    @property
    def is_live_kernel_write(self) -> bool:
        return any(isinstance(op, KernelWrite) for op in self.ops)


def blocked(check_id: str, reason: str) -> Step:
    return Step((check_id,), "no automatic fix", blocked=reason)


MANAGED = "# Managed by hosttune ({what}). Changes here are overwritten by `hosttune apply`.\n"


def managed_header(what: str) -> str:
    return MANAGED.format(what=what)
