"""A run's undo list, as data: what rollback does for each operation a journal says ran.

Built in three phases: first what depends on files still being there (units enabled or disabled,
kernel values, package holds), in reverse order; then the files themselves, in reverse order (a file
changed since the run wrote it kept in the run's backups first); then the commands that rebuild state
from files (daemon-reload, update-grub), once each. Nothing here touches a host.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import PurePosixPath

from hosttune.actions.platform import is_refresh
from hosttune.execute.journal import Journal, JournalStep, OpRecord, backup_dir
from hosttune.plan.resolve import ACTIVE, ENABLED
from hosttune.probes.system import selected

FILE_KINDS = ("write", "link", "dir", "move")


@dataclass(frozen=True)
class Undo:
    description: str
    argv: tuple[str, ...] = ()  # a command, or
    hostop: tuple[str, ...] = ()  # a hostops.sh operation with its arguments
    stdin: bytes | None = None
    offline: bool = True  # meaningful under --root
    unless_holds: tuple[str, str] | None = None  # (kernel path, value): nothing to do when it reads so already
    if_active: str | None = None  # a unit: only when it runs now (a boot unit may never have started)
    unless_sha: tuple[str, str] | None = None  # (file, sha256): nothing to do while the file still holds this


def touched(journal: Journal) -> list[tuple[JournalStep, OpRecord]]:
    """Operations that ran or may have run: done or failed ones, and all of a step cut off mid-way."""
    out = []
    for step in journal.steps:
        for rec in step.ops:
            if rec.status in ("done", "failed") or (rec.status == "pending" and step.status == "running"):
                out.append((step, rec))
    return out


def _change_line(rec: OpRecord) -> str | None:
    """What one operation changed on the host, in words; None when it changed nothing."""
    if rec.kind == "write":
        return f"{'replaced' if rec.existed else 'created'} {rec.path}"
    if rec.kind == "link":
        return f"linked {rec.path} -> {rec.target}"
    if rec.kind == "dir":
        return f"made directories {', '.join(rec.created_dirs)}" if rec.created_dirs else None
    if rec.kind == "move":
        return f"moved {rec.path} aside"
    if rec.kind == "service":
        verbs = [v for v, on in (("enabled", rec.enabled is True), ("disabled", rec.enabled is False),
                                 ("started", rec.running is True), ("stopped", rec.running is False)) if on]
        return f"{' and '.join(verbs)} {rec.unit}"
    if rec.kind == "kernel":
        return f"wrote {rec.value!r} to {', '.join(rec.paths)}"
    return f"ran {' '.join(rec.argv)}"


def changes(journal: Journal) -> tuple[str, ...]:
    """What a run changed on the host (files, units, packages, kernel values), in order.

    Done operations changed it; one cut off by a lost connection may have ("perhaps"). A failed
    operation changed nothing: file writes are atomic, and a command that fails is reported as such.
    """
    out = []
    for step, rec in touched(journal):
        line = _change_line(rec) if rec.status != "failed" else None
        if line:
            out.append(line if rec.status == "done" else f"perhaps {line}")
    return tuple(out)


def _service_undo(rec: OpRecord) -> list[Undo]:
    out = []
    if rec.enabled is True and rec.before_enabled not in ENABLED + ("static", "indirect", "generated"):
        if rec.running is None and rec.before_active not in ACTIVE:
            # A boot unit apply only enabled has run at every boot since: stop it before its files go.
            out.append(Undo(f"stop {rec.unit} (it started since the apply)", ("systemctl", "stop", rec.unit), offline=False,
                            if_active=rec.unit))
        out.append(Undo(f"disable {rec.unit} again", ("systemctl", "disable", rec.unit)))
    if rec.enabled is False and rec.before_enabled in ENABLED:
        out.append(Undo(f"enable {rec.unit} again", ("systemctl", "enable", rec.unit)))
    if rec.running is True and rec.before_active not in ACTIVE:
        out.append(Undo(f"stop {rec.unit} again", ("systemctl", "stop", rec.unit), offline=False))
    if rec.running is False and rec.before_active in ACTIVE:
        out.append(Undo(f"start {rec.unit} again", ("systemctl", "start", rec.unit), offline=False))
    return out


def _kernel_undo(rec: OpRecord) -> list[Undo]:
    out = []
    for path, before in rec.before_values:
        if before is not None:
            value = selected(before) or before.strip()
            out.append(Undo(f"write {value!r} back to {path}", ("tee", "--", path), stdin=(value + "\n").encode(),
                            offline=False, unless_holds=(path, value)))
    return out


def _keep_edits(rec: OpRecord, run: str, where: str) -> list[Undo]:
    """A file the run wrote and someone changed since: its content now is copied into the run's backups first."""
    if rec.kind != "write" or not rec.sha_after or rec.status != "done":
        return []
    kept = f"{backup_dir(run)}/edited-{where}-{PurePosixPath(rec.path).name}"
    return [Undo(f"keep {rec.path} as it is now (changed since run {run} wrote it) in {kept}",
                 hostop=("keep", rec.path, kept), unless_sha=(rec.path, rec.sha_after))]


def _dirs_undo(rec: OpRecord) -> list[Undo]:
    if not rec.created_dirs:
        return []
    # rmdirs keeps a directory something was put in since: the plan says so, as the run does
    return [Undo(f"remove the directories made for it, each if still empty: {', '.join(rec.created_dirs)}",
                 hostop=("rmdirs", *reversed(rec.created_dirs)))]


def _file_undo(rec: OpRecord, run: str = "", where: str = "") -> list[Undo]:
    if rec.kind == "move":
        return [Undo(f"move {rec.path} back", hostop=("move", rec.target, rec.path))]
    if rec.kind == "write" and rec.status == "failed":
        # A write that failed never renamed its file into place: the file there (one made since, too) is not the run's.
        return _dirs_undo(rec)
    keep = _keep_edits(rec, run, where)
    if rec.backup:
        # A done operation made its backup first: only one cut off before it may have none (and changed nothing).
        optional = () if rec.status == "done" else ("optional",)
        return keep + [Undo(f"restore {rec.path} from {rec.backup}", hostop=("restore", rec.path, rec.backup, *optional))]
    undo = [] if rec.kind == "dir" else keep + [Undo(f"remove {rec.path} (hosttune created it)", hostop=("remove", rec.path))]
    return undo + _dirs_undo(rec)


def undo_list(journal: Journal) -> list[Undo]:
    ops = touched(journal)
    first: list[Undo] = []
    files: list[Undo] = []
    for step, rec in reversed(ops):
        if rec.kind == "service":
            first += _service_undo(rec)
        elif rec.kind == "kernel":
            first += _kernel_undo(rec)
        elif rec.kind == "command" and rec.undo:
            first.append(Undo(f"undo {' '.join(rec.argv)}", rec.undo))
        elif rec.kind in FILE_KINDS:
            files += _file_undo(rec, journal.run, f"{step.index}-{step.ops.index(rec)}")
    steps_with_files = {step.index for step, rec in ops if rec.kind in FILE_KINDS}
    regen: list[Undo] = []
    for step in journal.steps:
        for rec in step.ops:
            if rec.regenerate and step.index in steps_with_files and rec.argv not in [u.argv for u in regen]:
                regen.append(Undo(f"run {' '.join(rec.argv)} again", rec.argv, offline=rec.argv != ("systemctl", "daemon-reload")))
    return first + files + regen


def not_reversed(journal: Journal) -> tuple[str, ...]:
    """The commands a run ran that rollback has no reverse for (a package installed, say): what a run whose every
    change is such a command leaves, said rather than an empty plan."""
    return tuple(f"not undone: {rec.description} (rollback has no reverse for a command; undo it by hand)"
                 for _, rec in touched(journal)
                 if rec.kind == "command" and not rec.undo and not rec.regenerate and rec.status != "failed"
                 and not is_refresh(rec.argv))  # package lists read again: nothing to undo
