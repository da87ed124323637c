"""Carry out one host's plan: journal first, then each step's operations in order.

A failing operation stops the host's plan; its stderr goes into the result and the
journal. Every file write is atomic and backed up first (see hostops.sh).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import Enum

from hosttune.actions.base import Command, KernelWrite, Op, Step, describe
from hosttune.errors import TransportError
from hosttune.execute.journal import RUNS_DIR, Journal, JournalStep, OpRecord, journal_path, now, start_journal
from hosttune.execute.perform import failed, perform
from hosttune.execute.remote import hostops, write_file
from hosttune.execute.undo import changes
from hosttune.config.inventory import Host
from hosttune.fleet_runner import Outcome
from hosttune.plan.host_plan import HostPlan
from hosttune.plan.state import rooted, unrooted
from hosttune.transport.base import CommandResult, Transport


class StepStatus(str, Enum):
    """How one step of a host's plan went."""

    DONE = "done"
    FAILED = "failed"
    NOT_RUN = "not run"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class StepOutcome:
    index: int
    fixes: tuple[str, ...]
    summary: str
    status: StepStatus
    needs_reboot: bool = False
    error: str = ""
    num_ops: int = 0
    num_done: int = 0  # of its operations


@dataclass(frozen=True)
class HostRun:
    """What apply did on one host."""

    host: Host
    run: str
    status: Outcome  # CHANGED, OK, FAILED or UNREACHABLE
    steps: tuple[StepOutcome, ...] = ()
    error: str | None = None
    journal: str | None = None
    changes: tuple[str, ...] = ()  # what was changed on the host, from the journal (rollback undoes it)
    root: str | None = None

    @property
    def changed(self) -> int:
        return sum(1 for s in self.steps if s.status is StepStatus.DONE)


class JournalError(Exception):
    """The journal could not be written: nothing runs without one."""


class Executor:
    """Runs one plan over one transport; the only writer of hosts in hosttune."""

    def __init__(self, transport: Transport, plan: HostPlan, run: str, command: str = "apply"):
        self.transport = transport
        self.plan = plan
        self.run_id = run
        self.root = plan.root if plan.root != "/" else None
        self.journal: Journal = start_journal(run, plan, command)
        self.num_saves = 0

    # -- journal ---------------------------------------------------------------------

    def save(self) -> None:
        result = write_file(self.transport, rooted(self.root, journal_path(self.run_id)), self.journal.to_json(), 0o600,
                            root=self.root)
        if not result.ok:
            raise JournalError(f"cannot write the journal {journal_path(self.run_id)}: {result.stderr.strip()}")
        self.num_saves += 1

    # -- operations ------------------------------------------------------------------

    def _do(self, op: Op, rec: OpRecord) -> tuple[CommandResult | None, str]:
        """Run one operation; (result, why it was skipped)."""
        if isinstance(op, KernelWrite) and self.root:
            return None, "--root: live kernel write skipped"
        if isinstance(op, Command) and self.root and not op.offline:
            return None, "--root: acts on the running system; skipped"
        return perform(self.transport, op, rec, self.root), ""

    def _run_step(self, index: int, step: Step) -> JournalStep:
        jstep = self.journal.steps[index]
        records = list(jstep.ops)
        for j, op in enumerate(step.ops):
            result, skipped = self._do(op, records[j])
            if result is None:
                records[j] = replace(records[j], status="skipped", stderr=skipped)
                continue
            made = tuple(line[8:] for line in result.stdout.splitlines() if line.startswith("created:"))
            is_failed = failed(op, result)
            records[j] = replace(records[j], status="failed" if is_failed else "done", rc=result.rc,
                                 stderr=result.stderr.strip()[-2000:], created_dirs=tuple(unrooted(self.root, p) for p in made))
            if is_failed:
                error = f"{describe(op)} exited {result.rc}: {result.stderr.strip()[-1000:] or result.stdout.strip()[-500:]}"
                return replace(jstep, ops=tuple(records), status="failed", error=error)
        return replace(jstep, ops=tuple(records), status="done")

    def run(self) -> HostRun:
        host = self.plan.host
        outcomes: list[StepOutcome] = []
        made = hostops(self.transport, "runs-dir", rooted(self.root, RUNS_DIR), root=self.root)
        if not made.ok:
            raise JournalError(f"cannot create {RUNS_DIR}: {made.stderr.strip()}")
        self.save()
        status = "done"
        for index, step in enumerate(self.plan.steps):
            self.journal = self.journal.with_step(replace(self.journal.steps[index], status="running"))
            self.save()
            done = self._run_step(index, step)
            self.journal = self.journal.with_step(done)
            num_done = sum(1 for r in done.ops if r.status == "done")
            outcomes.append(StepOutcome(index, step.fixes, step.summary, StepStatus(done.status), step.needs_reboot,
                                        done.error, len(done.ops), num_done))
            if done.status == "failed":
                status = "failed"
                break
        self.journal = replace(self.journal, status=status, finished=now())
        self.save()
        outcomes += [StepOutcome(i, s.fixes, s.summary, StepStatus.NOT_RUN, s.needs_reboot)
                     for i, s in enumerate(self.plan.steps) if i >= len(outcomes)]
        error = next((o.error for o in outcomes if o.status is StepStatus.FAILED), None)
        state = Outcome.FAILED if status == "failed" else Outcome.CHANGED
        return HostRun(host, self.run_id, state, tuple(outcomes), error, journal_path(self.run_id),
                       changes(self.journal), self.root)


def execute_plan(transport: Transport, plan: HostPlan, run: str, command: str = "apply") -> HostRun:
    """Apply a plan; a lost connection ends it as failed (the journal on the host says where).

    command: what the journal says made the run (apply, remediate, uncordon).
    """
    if not plan.steps:
        return HostRun(plan.host, run, Outcome.OK)
    executor = Executor(transport, plan, run, command)
    try:
        return executor.run()
    except JournalError as exc:
        return HostRun(plan.host, run, Outcome.FAILED, error=str(exc))
    except TransportError as exc:
        if executor.num_saves == 0:
            return HostRun(plan.host, run, Outcome.UNREACHABLE, error=str(exc))
        ran = [s for s in executor.journal.steps if s.status != "pending"]
        where = f" during step {ran[-1].index + 1} ({ran[-1].summary})" if ran else ""
        return HostRun(plan.host, run, Outcome.FAILED, error=f"connection lost{where}: {exc}", journal=journal_path(run),
                       changes=changes(executor.journal), root=executor.root)
