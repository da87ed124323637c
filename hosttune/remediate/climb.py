"""One host's ladders, climbed: for each fault the lowest rung first, a re-check (a new survey) after
each, higher only while the fault holds. Every step runs through the executor with a journal of its
own (`hosttune rollback --run RUN` undoes it); a reboot is apply's reboot.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from enum import Enum

from hosttune.actions.base import Step
from hosttune.actions.remediate import ledger_op
from hosttune.config.profile import Profile
from hosttune.errors import HosttuneError, TransportError
from hosttune.execute.perform import run_ops
from hosttune.execute.reboot import reboot_and_wait
from hosttune.execute.runner import execute_plan
from hosttune.fleet_runner import EXIT_DRIFT, EXIT_ERROR, EXIT_UNREACHABLE, Outcome
from hosttune.plan.host_plan import HostPlan
from hosttune.plan.state import read_state, requests_for
from hosttune.remediate.breaker import Breaker
from hosttune.remediate.faults import Fault
from hosttune.remediate.history import Ledger
from hosttune.remediate.rungs import Rung
from hosttune.remediate.steps import LadderOptions, gpus_of, reboot_skipped, restore_step, step_for
from hosttune.remediate.survey import Survey, survey_host
from hosttune.remediate.xid import XidPolicy
from hosttune.transport import open_transport


class End(str, Enum):
    """How one fault's ladder ended."""

    CLEARED = "cleared"
    LOGGED = "logged"
    CORDONED = "cordoned"
    STOPPED = "stopped"  # the circuit breaker
    LEFT = "left"  # every rung tried, the fault still holds
    PLANNED = "planned"  # a dry run

    def __str__(self) -> str:
        return self.value



@dataclass(frozen=True)
class RungOutcome:
    rung: Rung
    status: str  # done | failed | skipped | refused
    detail: str = ""
    run: str | None = None  # the journal of its step


@dataclass(frozen=True)
class FaultResult:
    fault: Fault
    end: End
    rungs: tuple[RungOutcome, ...] = ()

    @property
    def leaves_drift(self) -> bool:
        return self.end in (End.CORDONED, End.STOPPED, End.LEFT) or (self.end is End.PLANNED and self.fault.ladder != (Rung.LOG,))


@dataclass(frozen=True)
class Context:
    profiles: dict[str, Profile]
    options: LadderOptions
    policy: XidPolicy
    breaker: Breaker
    run: str


def _still(fault: Fault, survey: Survey) -> bool:
    """Whether the re-check still shows the fault (on a GPU: any fault of that GPU beyond a log)."""
    if not survey.reachable or survey.error or survey.facts is None:
        return True
    if fault.gpu is not None:
        lost = fault.gpu not in {g.index for g in survey.facts.gpu.gpus}  # a reset that "worked" on a GPU now gone
        return lost or any(f.gpu == fault.gpu and f.ladder != (Rung.LOG,) for f in survey.faults)
    return any(f.key == fault.key for f in survey.faults)


def execute_step(survey: Survey, step: Step, run: str, command: str = "remediate") -> tuple[bool, str]:
    with open_transport(survey.host.connection) as transport:
        state = read_state(transport, requests_for([step], None), root=None, manager=None)
        plan = HostPlan(survey.host, survey.profile, steps=(step,), state=state)
        result = execute_plan(transport, plan, run, command)
    return result.status is Outcome.CHANGED, result.error or ""


def _recovered(fault: Fault, survey: Survey, ledger: Ledger, now: float) -> Ledger:
    """A GPU reset, diagnosed or rebooted: its Xids so far are dealt with."""
    gpus = set(gpus_of(fault, survey.snapshot))
    bdfs = {g.bdf[:10] for g in survey.facts.gpu.gpus if g.index in gpus} if survey.facts else set()
    for o in ledger.xids:
        if o.bdf in bdfs or o.bdf == fault.unit:
            ledger = ledger.with_recovered(o.bdf, now)
    return ledger


class Climber:
    """Climbs the ladders of one host's faults, keeping its ledger."""

    def __init__(self, survey: Survey, ctx: Context):
        self.survey = survey
        self.ctx = ctx
        self.ledger = survey.ledger
        self.num_steps = 0
        self.error = ""  # the host stopped answering or refused a step: its ladders end here

    def _run_id(self) -> str:
        self.num_steps += 1
        return f"{self.ctx.run}-{self.num_steps}"

    def _recheck(self) -> Survey:
        self.survey = survey_host(self.survey.host, self.ctx.profiles[self.survey.host.name], self.ctx.policy, self.ledger)
        if self.survey.reachable and not self.survey.error:
            self.ledger = self.survey.ledger
        return self.survey

    def _execute(self, step: Step, run: str) -> tuple[bool, str]:
        """The step through the executor; a host that cannot be reached or read fails it and ends its ladders."""
        try:
            return execute_step(self.survey, step, run)
        except (HosttuneError, TransportError) as exc:
            self.error = str(exc)
            return False, self.error

    def _step(self, rung: Rung, fault: Fault) -> RungOutcome:
        step = step_for(rung, fault, self.survey.snapshot, self.ctx.options, self.ctx.run, time.time())
        if step is None:
            return RungOutcome(rung, "skipped", f"nothing to {rung} for {fault.where}")
        run = self._run_id()
        ok, error = self._execute(step, run)
        if ok and rung in (Rung.RESET, Rung.DIAGNOSE):
            self.ledger = _recovered(fault, self.survey, self.ledger, time.time())
        return RungOutcome(rung, "done" if ok else "failed", step.summary if ok else error, run)

    def _reboot(self) -> RungOutcome:
        skipped = reboot_skipped(self.survey.host, self.ctx.options)
        if skipped:
            return RungOutcome(Rung.REBOOT, "skipped", skipped)
        problem = reboot_and_wait(self.survey.host, self.ctx.options.reboot_timeout_s)
        return RungOutcome(Rung.REBOOT, "failed" if problem else "done", problem or "rebooted and back")

    def _cordon(self, fault: Fault) -> RungOutcome:
        why = self.ctx.breaker.cordon(self.survey.host.name)
        return RungOutcome(Rung.CORDON, "refused", why) if why else self._step(Rung.CORDON, fault)

    def _rung(self, rung: Rung, fault: Fault) -> RungOutcome:
        if rung is Rung.REBOOT:
            return self._reboot()
        if rung is Rung.CORDON:
            return self._cordon(fault)
        return self._step(rung, fault)

    def _restore(self, fault: Fault, rungs: list[RungOutcome]) -> None:
        """The replicas a done drain took out, started and back in (once: a unit fault's were before its re-check)."""
        drained = any(r.rung is Rung.DRAIN and r.status == "done" for r in rungs)
        if drained and not any(r.status == "restored" for r in rungs):
            step = restore_step(fault, self.survey.snapshot, self.ctx.options)
            if step is not None:
                run = self._run_id()
                ok, error = self._execute(step, run)
                rungs.append(RungOutcome(Rung.DRAIN, "restored" if ok else "failed", step.summary if ok else error, run))

    def climb(self, fault: Fault) -> FaultResult:
        if fault.ladder == (Rung.LOG,):
            self.ledger = _recovered(fault, self.survey, self.ledger, time.time())
            return FaultResult(fault, End.LOGGED, (RungOutcome(Rung.LOG, "done", fault.reason),))
        rungs: list[RungOutcome] = []
        for rung in fault.ladder:
            if self.ctx.breaker.is_open:
                return FaultResult(fault, End.STOPPED, (*rungs, RungOutcome(rung, "refused", self.ctx.breaker.why)))
            outcome = self._rung(rung, fault)
            rungs.append(outcome)
            if self.error:
                return FaultResult(fault, End.LEFT, tuple(rungs))
            if rung is Rung.CORDON:
                return FaultResult(fault, End.CORDONED if outcome.status == "done" else End.STOPPED if outcome.status == "refused" else End.LEFT, tuple(rungs))
            if outcome.status == "done":
                if rung is Rung.RESTART:
                    time.sleep(self.ctx.options.recheck_wait_s)
                if rung in (Rung.RESET, Rung.DIAGNOSE) and fault.gpu is None:
                    self._restore(fault, rungs)  # a unit's fault: the unit its drain stopped must run to be seen fixed
                if not _still(fault, self._recheck()):
                    self._restore(fault, rungs)
                    return FaultResult(fault, End.CLEARED, tuple(rungs))
        return FaultResult(fault, End.LEFT, tuple(rungs))

    def save_ledger(self) -> None:
        if self.ledger == self.survey.snapshot.ledger:
            return
        with open_transport(self.survey.host.connection) as transport:
            run_ops(transport, [ledger_op(self.ledger.to_json())])


@dataclass(frozen=True)
class HostRemediation:
    survey: Survey
    results: tuple[FaultResult, ...] = ()
    error: str | None = None

    @property
    def exit_bits(self) -> int:
        if not self.survey.reachable:
            return EXIT_UNREACHABLE
        bits = EXIT_ERROR if self.error or self.survey.error or self.survey.unjudged else 0
        if self.survey.is_cordoned or any(r.leaves_drift for r in self.results):
            bits |= EXIT_DRIFT
        return bits


def remediate_host(survey: Survey, ctx: Context) -> HostRemediation:
    """Climb every fault's ladder on one host; its ledger is written at the end."""
    if not survey.reachable or survey.error or survey.is_cordoned:
        return HostRemediation(survey)
    climber = Climber(survey, ctx)
    results = []
    try:
        for fault in survey.faults:
            results.append(climber.climb(fault))
            if results[-1].end is End.CORDONED or climber.error:
                break  # a cordoned host takes no further steps; one that stopped answering cannot
        if not climber.error:
            climber.save_ledger()
    except (HosttuneError, TransportError) as exc:
        return HostRemediation(survey, tuple(results), str(exc))
    return HostRemediation(survey, tuple(results), climber.error or None)


def planned(survey: Survey) -> HostRemediation:
    return HostRemediation(survey, tuple(FaultResult(f, End.PLANNED) for f in survey.faults))

