"""Undo a run from its journal: files back byte for byte, units and kernel values as they were.

The undo list is data (`hosttune.execute.undo`); this module picks the run, refuses one a later run changed
over, and carries the undo list out over one transport, marking the journal rolled back.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from hosttune.errors import HosttuneError, TransportError
from hosttune.execute.journal import RUNS_DIR, Journal, journal_path, now
from hosttune.execute.remote import hostops, hostops_argv, read_journals, write_file
from hosttune.execute.undo import Undo, not_reversed, touched, undo_list
from hosttune.config.inventory import Host
from hosttune.fleet_runner import Outcome
from hosttune.plan.resolve import kernel_value_holds
from hosttune.plan.state import rooted, unrooted
from hosttune.quoting import join
from hosttune.transport.base import Transport

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


def image_option(root: str | None) -> list[str]:
    """`--root DIR` for a command that must act on the image again, none for the running system."""
    return ["--root", root] if root and root != "/" else []


def rollback_command(host: str, run: str, root: str | None, inventory: str | None, yes: bool = False) -> str:
    """The command line that rolls back `run` on this one host: the recap's undo line, a later run's hint."""
    argv = ["hosttune", "rollback", *(("-i", inventory) if inventory else ()), "--limit", host, "--run", run]
    return join(argv + image_option(root) + (["--yes"] if yes else []))


def load_journals(transport: Transport, root: str | None) -> list[Journal]:
    image = root if root and root != "/" else ""
    runs = rooted(root, RUNS_DIR)  # under --root, the image's folder: the one to move a damaged journal out of
    texts = read_journals(transport, runs, image)
    return [_journal(runs, name, text) for name, text in texts.items()]


def _journal(runs: str, name: str, text: str) -> Journal:
    """One journal; a damaged one is the host's error (skipping it could roll another run back over its changes)."""
    try:
        if not text:  # apply writes a journal whole (a temporary file renamed): an empty one was broken since
            raise ValueError("the file is empty")
        return Journal.from_json(text)
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise HosttuneError(f"{runs}/{name}: unreadable run journal ({type(exc).__name__}: {str(exc)[:200]}): move it "
                            f"out of {runs} to roll back this host's other runs") from None


def _is_due(transport: Transport, undo: Undo, root: str | None) -> bool:
    """Whether the undo has anything to do: read-only."""
    if undo.unless_sha:
        path, sha = undo.unless_sha
        current = transport.read(hostops_argv("sha", rooted(root, path), root=root))
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
        return hostops(transport, op, *args, root=root)
    if not _is_due(transport, undo, root):
        return None
    argv = undo.argv
    if offline:
        argv = ("systemctl", f"--root={root}", *argv[1:]) if argv[0] == "systemctl" else ("chroot", root, *argv)
    return transport.change(argv, stdin=undo.stdin, timeout=3600)


def _kept(stdout: str, root: str | None) -> str:
    """rmdirs' directories that are not empty (something was put in them since the run): kept, and said so."""
    kept = [unrooted(root, line[len("kept:"):]) for line in stdout.splitlines() if line.startswith("kept:")]
    return f" (kept {', '.join(kept)}: files were put in {'it' if len(kept) == 1 else 'them'} since)" if kept else ""


def rollback_journal(transport: Transport, host: Host, journal: Journal, root: str | None) -> RollbackResult:
    undos = undo_list(journal)
    done: list[str] = []
    errors: list[str] = []
    for undo in undos:
        result = _run_undo(transport, undo, root)
        if result is None and (undo.if_active or undo.unless_sha):
            continue  # the unit is not running, the file is as the run left it: nothing to do, and nothing to say
        if result is None:
            done.append(f"nothing to do: {undo.description} (already so, or --root)")
        elif result.ok:
            done.append(undo.description + _kept(result.stdout, root))
        else:
            errors.append(f"{undo.description}: {result.stderr.strip()[-500:]}")
    done += not_reversed(journal)  # the packages a run installed stay, beside whatever else it undid
    status = Outcome.FAILED if errors else Outcome.RESTORED
    # A failed rollback leaves the run live: what it could not undo is still on the host, and every undo is safe
    # to run again, so the next rollback takes this run again.
    marked = replace(journal, rolled_back=None if errors else now(), rollback_status=status.value)
    written = write_file(transport, rooted(root, journal_path(journal.run)), marked.to_json(), 0o600, root=root)
    if not written.ok and not errors:  # else the run stays live and the next rollback takes it again, as it should
        status = Outcome.FAILED
        errors.append(f"rolled back, but the journal {journal_path(journal.run)} could not be marked so "
                      f"({written.stderr.strip().removeprefix('hosttune: ')[-300:]}): the next rollback takes this run again")
    return RollbackResult(host, journal.run, status, tuple(done), "; ".join(errors) or None)


def rollback_host(transport: Transport, host: Host, run: str | None, root: str | None,
                  dry_run: bool = False, inventory: str | None = None) -> RollbackResult:
    """Undo the run on one host; dry_run: only what it would do (PLANNED, each undo described), read-only.

    inventory: the file the hosts came from, named in the command a refusal gives.
    """
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
                f"kernel values: roll those back first, the latest first, each by naming it: "
                f"{rollback_command(host.name, later[-1], root, inventory)}"))
        if dry_run:
            undos = undo_list(journal)
            due = [u.description for u in undos if _is_due(transport, u, root)]
            return RollbackResult(host, journal.run, Outcome.PLANNED, (*due, *not_reversed(journal)))
        return rollback_journal(transport, host, journal, root)
    except TransportError as exc:
        return RollbackResult(host, run, Outcome.UNREACHABLE, error=str(exc))
    except HosttuneError as exc:  # the journals could not be read: nothing is known, so nothing is undone
        return RollbackResult(host, run, Outcome.FAILED, error=str(exc))
