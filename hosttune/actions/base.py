"""What an action yields: steps made of operations, as plain frozen data.

Actions never run anything. An operation says *what* should hold on the host (this file
with these bytes, this unit disabled, this value in this kernel file); `hosttune.plan`
drops the operations that already hold, and `hosttune.execute` is the only code that
carries the rest out, backing up and journalling as it goes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Union


@dataclass(frozen=True)
class FileWrite:
    """Make `path` hold exactly `content`. A new file gets `mode`; an existing one keeps owner and mode."""

    path: str
    content: bytes
    mode: int = 0o644

    @property
    def argv(self) -> tuple[str, ...]:
        return ("hosttune-write", self.path)


@dataclass(frozen=True)
class CommentOut:
    """Comment out the lines of the sysctl file `path` that set `key` (the planner reads the file and turns this into a FileWrite)."""

    path: str
    key: str

    @property
    def argv(self) -> tuple[str, ...]:
        return ("hosttune-comment-out", self.key, self.path)


@dataclass(frozen=True)
class Symlink:
    """Make `path` a symbolic link to `target`."""

    path: str
    target: str

    @property
    def argv(self) -> tuple[str, ...]:
        return ("ln", "-sfn", self.target, self.path)


@dataclass(frozen=True)
class MoveAside:
    """Take `path` out of the way: moved into the run's backup folder, so rollback can bring it back."""

    path: str

    @property
    def argv(self) -> tuple[str, ...]:
        return ("mv", self.path, "<run backup>/")


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


@dataclass(frozen=True)
class KernelWrite:
    """A live kernel write: `value` into every file in `paths` (/proc, /sys). Lost at reboot."""

    paths: tuple[str, ...]
    value: str

    @property
    def argv(self) -> tuple[str, ...]:
        return ("tee", *self.paths)


@dataclass(frozen=True)
class Command:
    """A command run as is.

    undo: the command that reverses it (rollback runs it), if any.
    regenerate: it rebuilds state from files (update-grub, daemon-reload); rollback runs it
    again after restoring those files.
    offline: it is meaningful on an image too (--root runs it inside the root with chroot);
    False: it acts on the running system only, and --root skips it.
    """

    argv: tuple[str, ...]
    undo: tuple[str, ...] | None = None
    regenerate: bool = False
    offline: bool = True


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


Op = Union[FileWrite, CommentOut, Symlink, MoveAside, Service, KernelWrite, Command, Packages]


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
