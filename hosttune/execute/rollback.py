"""Undo a run from its journal: files back byte for byte, units and kernel values as they were.

The undo list is data (`undo_list(journal)`), built in three phases: first what depends on
files still being there (units enabled or disabled, kernel values, package holds), in
reverse order; then the files themselves, in reverse order; then the commands that rebuild
state from files (daemon-reload, update-grub), once each.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import PurePosixPath

from hosttune.errors import HosttuneError, TransportError
from hosttune.execute.journal import RUNS_DIR, Journal, JournalStep, OpRecord, backup_dir, journal_path, now
from hosttune.execute.remote import hostops, read_journals, write_file
from hosttune.config.inventory import Host
from hosttune.fleet_runner import Outcome
from hosttune.plan.resolve import ACTIVE, ENABLED, kernel_value_holds
from hosttune.plan.state import rooted
from hosttune.probes.system import selected
from hosttune.transport.base import Transport


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


@dataclass(frozen=True)
class RollbackResult:
    host: Host
    run: str | None
    status: Outcome  # RESTORED, NOTHING, FAILED or UNREACHABLE
    done: tuple[str, ...] = ()
    error: str | None = None
    is_unknown_run: bool = False  # --run named a run this host has no journal of

    @property
    def exit_bits(self) -> int:
        return self.status.exit_bits


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


def _file_undo(rec: OpRecord, run: str = "", where: str = "") -> list[Undo]:
    if rec.kind == "move":
        return [Undo(f"move {rec.path} back", hostop=("move", rec.target, rec.path))]
    keep = _keep_edits(rec, run, where)
    if rec.backup:
        # A done operation made its backup first: only one cut off before it may have none (and changed nothing).
        optional = () if rec.status == "done" else ("optional",)
        return keep + [Undo(f"restore {rec.path} from {rec.backup}", hostop=("restore", rec.path, rec.backup, *optional))]
    undo = [] if rec.kind == "dir" else keep + [Undo(f"remove {rec.path} (hosttune created it)", hostop=("remove", rec.path))]
    if rec.created_dirs:
        undo.append(Undo(f"remove the directories made for it: {', '.join(rec.created_dirs)}",
                         hostop=("rmdirs", *reversed(rec.created_dirs))))
    return undo


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
                 if rec.kind == "command" and not rec.undo and not rec.regenerate and rec.status != "failed")


def _is_live(journal: Journal) -> bool:
    """A run that changed something and has not been rolled back."""
    return not journal.rolled_back and any(s.status != "pending" for s in journal.steps)


def pick_journal(journals: list[Journal], run: str | None) -> Journal | None:
    """The run asked for, else the latest apply that changed something and was not rolled back (a remediate or
    uncordon step since, a cordon say, is rolled back only by naming it)."""
    if run:
        return next((j for j in journals if j.run == run), None)
    applies = (j for j in journals if _is_live(j) and j.command == "apply")
    return max(applies, key=lambda j: (j.started, j.run), default=None)


def _subjects(journal: Journal) -> set[str]:
    """What a run changed or may have changed: its files, units and kernel values."""
    out: set[str] = set()
    for _, rec in touched(journal):
        out |= {s for s in (rec.path, rec.unit) if s} | set(rec.paths)
    return out


def later_runs(journals: list[Journal], journal: Journal) -> list[str]:
    """Later runs, not rolled back, that touched what this one did: undoing this one first would put its
    backups and old values over their changes."""
    mine = _subjects(journal)
    return sorted(j.run for j in journals
                  if _is_live(j) and (j.started, j.run) > (journal.started, journal.run) and mine & _subjects(j))


def load_journals(transport: Transport, root: str | None) -> list[Journal]:
    image = root if root and root != "/" else ""
    texts = read_journals(transport, rooted(root, RUNS_DIR), image)
    return [_journal(f"{RUNS_DIR}/{name}", text) for name, text in texts.items() if text]


def _journal(path: str, text: str) -> Journal:
    """One journal; a damaged one is the host's error (skipping it could roll another run back over its changes)."""
    try:
        return Journal.from_json(text)
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise HosttuneError(f"{path}: unreadable run journal ({type(exc).__name__}: {str(exc)[:200]}): move it out of "
                            f"{RUNS_DIR} to roll back this host's other runs") from None


def _is_due(transport: Transport, undo: Undo, root: str | None) -> bool:
    """Whether the undo has anything to do: read-only."""
    if undo.unless_sha:
        path, sha = undo.unless_sha
        current = transport.read(["sha256sum", "--", rooted(root, path)])
        return current.ok and current.stdout.split()[:1] != [sha]
    if undo.hostop:
        return True
    if bool(root) and root != "/" and not undo.offline:
        return False
    if undo.if_active:
        return transport.read(["systemctl", "is-active", "--quiet", undo.if_active]).ok
    if undo.unless_holds:
        path, value = undo.unless_holds
        current = transport.read(["head", "-n1", "--", path])
        return not (current.ok and kernel_value_holds(path, current.stdout, value, exact=True))
    return True


def _run_undo(transport: Transport, undo: Undo, root: str | None):
    offline = bool(root) and root != "/"
    if undo.unless_sha and not _is_due(transport, undo, root):
        return None
    if undo.hostop:
        op, *paths = undo.hostop
        args = [rooted(root, p) if p.startswith("/") else p for p in paths]
        return hostops(transport, op, *args)
    if not _is_due(transport, undo, root):
        return None
    argv = undo.argv
    if offline:
        argv = ("systemctl", f"--root={root}", *argv[1:]) if argv[0] == "systemctl" else ("chroot", root, *argv)
    return transport.change(argv, stdin=undo.stdin, timeout=3600)


def rollback_journal(transport: Transport, host: Host, journal: Journal, root: str | None) -> RollbackResult:
    undos = undo_list(journal)
    done, errors = ([] if undos else list(not_reversed(journal))), []
    for undo in undos:
        result = _run_undo(transport, undo, root)
        if result is None and (undo.if_active or undo.unless_sha):
            continue  # the unit is not running, the file is as the run left it: nothing to do, and nothing to say
        if result is None:
            done.append(f"nothing to do: {undo.description} (already so, or --root)")
        elif result.ok:
            done.append(undo.description)
        else:
            errors.append(f"{undo.description}: {result.stderr.strip()[-500:]}")
    status = Outcome.FAILED if errors else Outcome.RESTORED
    # A failed rollback leaves the run live: what it could not undo is still on the host, and every undo is safe
    # to run again, so the next rollback takes this run again.
    marked = replace(journal, rolled_back=None if errors else now(), rollback_status=status.value)
    written = write_file(transport, rooted(root, journal_path(journal.run)), marked.to_json(), 0o600)
    if not written.ok and not errors:  # else the run stays live and the next rollback takes it again, as it should
        status = Outcome.FAILED
        errors.append(f"rolled back, but the journal {journal_path(journal.run)} could not be marked so "
                      f"({written.stderr.strip().removeprefix('hosttune: ')[-300:]}): the next rollback takes this run again")
    return RollbackResult(host, journal.run, status, tuple(done), "; ".join(errors) or None)


def rollback_host(transport: Transport, host: Host, run: str | None, root: str | None,
                  dry_run: bool = False) -> RollbackResult:
    """Undo the run on one host; dry_run: only what it would do (PLANNED, each undo described), read-only."""
    try:
        journals = load_journals(transport, root)
        journal = pick_journal(journals, run)
        if journal is None:
            what = f"no run {run}" if run else "no run left to roll back"
            return RollbackResult(host, run, Outcome.NOTHING, error=f"{what} in {rooted(root, RUNS_DIR)}",
                                  is_unknown_run=bool(run))
        if journal.rolled_back and run:
            return RollbackResult(host, run, Outcome.NOTHING, error=f"run {run} was already rolled back at {journal.rolled_back}")
        if later := later_runs(journals, journal):
            return RollbackResult(host, run, Outcome.FAILED, error=(
                f"run {run} was followed by {', '.join(later)}, not rolled back, which changed the same files, units or "
                f"kernel values: roll those back first, the latest first, each by naming it: hosttune rollback --run {later[-1]}"))
        if dry_run:
            undos = undo_list(journal)
            due = [u.description for u in undos if _is_due(transport, u, root)] if undos else not_reversed(journal)
            return RollbackResult(host, journal.run, Outcome.PLANNED, tuple(due))
        return rollback_journal(transport, host, journal, root)
    except TransportError as exc:
        return RollbackResult(host, run, Outcome.UNREACHABLE, error=str(exc))
    except HosttuneError as exc:  # the journals could not be read: nothing is known, so nothing is undone
        return RollbackResult(host, run, Outcome.FAILED, error=str(exc))
