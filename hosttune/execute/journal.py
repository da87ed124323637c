"""The run journal kept on each host: /var/lib/hosttune/runs/<run>.json.

Written before the first step and after every step, so a run that stops half-way (a failed
step, a lost connection) still says which steps ran, what was there before each change
and where its backup lies. Rollback reads nothing else.
"""

from __future__ import annotations

import dataclasses
import json
import secrets
import time
from dataclasses import dataclass, replace
from pathlib import PurePosixPath

from hosttune import __version__
from hosttune.actions.base import Command, Directory, FileWrite, KernelWrite, Remove, Op, Service, Symlink, describe
from hosttune.plan.host_plan import HostPlan
from hosttune.plan.preconditions import RUNS_DIR  # the plan checks the folder before a run is started
from hosttune.plan.state import State, sha256


def new_run_id() -> str:
    """Unique across a fleet run, and named for its second: 20250102T030405Z-1a2b3c. Runs are ordered by when
    their journal was started (`now`), which tells apart two in one second, as the random part cannot."""
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(time.time())) + "-" + secrets.token_hex(3)


def now() -> str:
    """UTC to the microsecond, sortable as text: 2025-01-02T03:04:05.123456Z."""
    t = time.time()
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f".{int(t % 1 * 1_000_000):06d}Z"


def journal_path(run: str) -> str:
    return f"{RUNS_DIR}/{run}.json"


def backup_dir(run: str) -> str:
    return f"{RUNS_DIR}/{run}.backup"


@dataclass(frozen=True)
class OpRecord:
    """One operation of a step: what it does, what was there before, how it went."""

    kind: str  # write | link | dir | move | service | kernel | command
    description: str
    path: str | None = None
    target: str | None = None  # the link's target, or where a moved path went
    existed: bool | None = None
    sha_before: str | None = None  # "absent" when the file did not exist
    sha_after: str | None = None
    backup: str | None = None
    created_dirs: tuple[str, ...] = ()  # directories the write had to make, shallowest first
    unit: str | None = None
    enabled: bool | None = None
    running: bool | None = None
    before_enabled: str | None = None
    before_active: str | None = None
    paths: tuple[str, ...] = ()
    value: str | None = None
    before_values: tuple[tuple[str, str | None], ...] = ()
    argv: tuple[str, ...] = ()
    undo: tuple[str, ...] | None = None
    regenerate: bool = False
    status: str = "pending"  # pending | done | failed | skipped
    rc: int | None = None
    stderr: str = ""


@dataclass(frozen=True)
class JournalStep:
    index: int
    fixes: tuple[str, ...]
    summary: str
    needs_reboot: bool
    is_live_kernel_write: bool
    ops: tuple[OpRecord, ...]
    status: str = "pending"  # pending | running | done | failed
    error: str = ""


@dataclass(frozen=True)
class Journal:
    run: str
    host: str
    root: str
    started: str
    steps: tuple[JournalStep, ...]
    status: str = "running"  # running | done | failed; "running" on disk after a lost connection
    finished: str | None = None
    hosttune_version: str = __version__
    rolled_back: str | None = None
    rollback_status: str | None = None
    command: str = "apply"  # what made the run: apply, or a remediate or uncordon step (rolled back only by its id)

    def with_step(self, step: JournalStep) -> "Journal":
        steps = tuple(step if s.index == step.index else s for s in self.steps)
        return replace(self, steps=steps)

    def to_json(self) -> bytes:
        return (json.dumps(dataclasses.asdict(self), indent=1) + "\n").encode()

    @classmethod
    def from_json(cls, text: str) -> "Journal":
        doc = json.loads(text)
        steps = tuple(_step_from(s) for s in doc.pop("steps"))
        return _checked(cls(steps=steps, **doc))


def _checked(journal: Journal) -> Journal:
    """A journal rollback can order and act on: its run and times are text, and every path it names is absolute
    (a relative one would be undone in whatever folder the host's shell starts in)."""
    for name in ("run", "host", "root", "started"):
        if not isinstance(getattr(journal, name), str):
            raise TypeError(f"{name}: must be text, got {getattr(journal, name)!r}")
    for step in journal.steps:
        for op in step.ops:
            for path in (op.path, op.backup, *op.paths, *op.created_dirs):
                if path is not None and not (isinstance(path, str) and path.startswith("/")):
                    raise ValueError(f"step {step.index}: {path!r} is not an absolute path")
    return journal


def _step_from(doc: dict) -> JournalStep:
    ops = tuple(OpRecord(**{**o, "paths": tuple(o["paths"]), "argv": tuple(o["argv"]), "created_dirs": tuple(o["created_dirs"]),
                            "undo": tuple(o["undo"]) if o["undo"] else None,
                            "before_values": tuple(tuple(p) for p in o["before_values"])}) for o in doc.pop("ops"))
    return JournalStep(ops=ops, **{**doc, "fixes": tuple(doc["fixes"])})


def _backup_for(run: str, step: int, index: int, path: str) -> str:
    return f"{backup_dir(run)}/{step}-{index}-{PurePosixPath(path).name}"


def record_for(op: Op, state: State, run: str, step: int, index: int) -> OpRecord:
    """The journal entry of an operation, with the state it finds (from the plan's state read)."""
    description = describe(op)
    if isinstance(op, FileWrite):
        fs = state.files.get(op.path)
        existed = bool(fs and fs.kind == "file")
        return OpRecord("write", description, path=op.path, existed=existed,
                        sha_before=fs.sha256 if existed else "absent", sha_after=sha256(op.content),
                        backup=_backup_for(run, step, index, op.path) if existed else None)
    if isinstance(op, Symlink):
        fs = state.files.get(op.path)
        existed = bool(fs and fs.exists)
        return OpRecord("link", description, path=op.path, target=op.target, existed=existed,
                        backup=_backup_for(run, step, index, op.path) if existed else None)
    if isinstance(op, Directory):
        return OpRecord("dir", description, path=op.path)
    if isinstance(op, Remove):
        return OpRecord("move", description, path=op.path, target=_backup_for(run, step, index, op.path))
    if isinstance(op, Service):
        unit = state.units.get(op.unit)
        return OpRecord("service", description, unit=op.unit, enabled=op.enabled, running=op.running, argv=op.argv,
                        before_enabled=unit.enabled if unit else "", before_active=unit.active if unit else None)
    if isinstance(op, KernelWrite):
        return OpRecord("kernel", description, paths=op.paths, value=op.value, argv=op.argv,
                        before_values=tuple((p, state.kernel.get(p)) for p in op.paths))
    assert isinstance(op, Command), f"unresolved operation in a plan: {op!r}"
    return OpRecord("command", description, argv=op.argv, undo=op.undo, regenerate=op.regenerate)


def start_journal(run: str, plan: HostPlan, command: str = "apply") -> Journal:
    steps = tuple(
        JournalStep(i, step.fixes, step.summary, step.needs_reboot, step.is_live_kernel_write,
                    tuple(record_for(op, plan.state, run, i, j) for j, op in enumerate(step.ops)))
        for i, step in enumerate(plan.steps)
    )
    return Journal(run, plan.host.name, plan.root or "/", now(), steps, command=command)
