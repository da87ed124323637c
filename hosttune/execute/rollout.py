"""Apply and roll back across a fleet: batches (--serial), a failure budget (--max-fail-percent),
reboots of pending hosts a batch at a time (--reboot), and a recap per host."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

from hosttune.execute.reboot import cannot_reboot, reboot_and_wait
from hosttune.execute.rollback import RollbackResult, rollback_host
from hosttune.execute.runner import HostRun, execute_plan
from hosttune.fleet import HostReport, check_host
from hosttune.fleet_runner import DEFAULT_FORKS, EXIT_DRIFT, FleetRunner, Outcome
from hosttune.config.inventory import Host, Inventory
from hosttune.plan.host_plan import HostPlan, PlanOptions, plan_host
from hosttune.config.profile import Profile
from hosttune.transport import open_transport


@dataclass(frozen=True)
class ApplyOptions:
    root: str | None = None
    prune_cuda: bool = False
    serial: int | None = None  # hosts per batch; None: one batch of every host
    max_fail_percent: float | None = None  # stop further batches once more than this share failed
    reboot: bool = False
    forks: int = DEFAULT_FORKS
    reboot_timeout_s: float = 600.0

    def plan_options(self) -> PlanOptions:
        return PlanOptions(root=self.root, opt_ins=frozenset({"prune-cuda"} if self.prune_cuda else ()))


@dataclass(frozen=True)
class HostOutcome:
    """One host's line in the recap."""

    plan: HostPlan
    state: Outcome  # CHANGED, OK, FAILED, UNREACHABLE or SKIPPED
    run: HostRun | None = None
    error: str | None = None
    rebooted: bool = False
    recheck: HostReport | None = None
    reboot_skipped: str | None = None  # why a reboot it needs, asked for, was left to its operator

    @property
    def host(self) -> Host:
        return self.plan.host

    @property
    def exit_bits(self) -> int:
        if self.state.is_failure:
            return self.state.exit_bits
        if self.state in (Outcome.SKIPPED, Outcome.PLANNED):  # not tried, or a dry run: all its drift is left
            return EXIT_DRIFT if (self.plan.steps or self.plan.blocked or self.plan.needs_reboot) else 0
        if self.recheck is not None:
            return self.recheck.exit_bits
        return EXIT_DRIFT if (self.plan.blocked or self.plan.needs_reboot) else 0


def runner_for(options: ApplyOptions, on_host_done: Callable[[str, object], None] | None = None) -> FleetRunner:
    return FleetRunner(options.forks, options.serial, options.max_fail_percent, on_host_done)


def plan_fleet(inventory: Inventory, profiles: dict[str, Profile], options: ApplyOptions,
               on_host_done: Callable[[str, object], None] | None = None) -> list[HostPlan]:
    """Every host's plan, in inventory order; read-only."""
    return runner_for(options, on_host_done).map(lambda h: plan_host(h, profiles[h.name], options.plan_options()),
                                                 list(inventory.hosts), name=lambda h: h.name)


def dry_run_outcome(plan: HostPlan) -> HostOutcome:
    """A host's plan as an outcome that changed nothing: planned where it has steps."""
    if not plan.reachable:
        return HostOutcome(plan, Outcome.UNREACHABLE, error=plan.error)
    if plan.error:
        return HostOutcome(plan, Outcome.FAILED, error=plan.error)
    return HostOutcome(plan, Outcome.PLANNED if plan.steps else Outcome.OK)


def _execute(plan: HostPlan, run: str) -> HostOutcome:
    if not plan.reachable or plan.error:
        return dry_run_outcome(plan)
    if not plan.steps:
        return HostOutcome(plan, Outcome.OK)
    with open_transport(plan.host.connection) as transport:
        result = execute_plan(transport, plan, run)
    return HostOutcome(plan, result.status, result, result.error)


def _reboot(outcome: HostOutcome, profiles: dict[str, Profile], options: ApplyOptions) -> HostOutcome:
    due = outcome.state in (Outcome.CHANGED, Outcome.OK) and outcome.plan.needs_reboot and not options.root
    if not due:
        return outcome
    if why := cannot_reboot(outcome.host):
        return replace(outcome, reboot_skipped=why)
    problem = reboot_and_wait(outcome.host, options.reboot_timeout_s)
    if problem:
        return HostOutcome(outcome.plan, Outcome.FAILED, outcome.run, f"reboot: {problem}")
    recheck = check_host(outcome.host, profiles[outcome.host.name])
    return HostOutcome(outcome.plan, outcome.state, outcome.run, outcome.error, True, recheck)


def apply_plans(plans: list[HostPlan], profiles: dict[str, Profile], run: str, options: ApplyOptions,
                on_host_done: Callable[[str, object], None] | None = None) -> list[HostOutcome]:
    """Execute the plans batch by batch; once the failure budget is spent, later batches are skipped."""
    runner = runner_for(options, on_host_done)
    host_name = lambda item: item.host.name  # noqa: E731 (a plan or an outcome)

    def run_batch(batch: list[HostPlan]) -> list[HostOutcome]:
        done = runner.map(lambda p: _execute(p, run), batch, name=None if options.reboot else host_name)
        if options.reboot:  # the batch's pending hosts reboot together, once all of it ran
            done = runner.map(lambda o: _reboot(o, profiles, options), done, name=host_name)
        return done

    return runner.rollout(plans, run_batch, lambda p, why: [HostOutcome(p, Outcome.SKIPPED, error=why)])


def rollback_fleet(inventory: Inventory, run: str | None, root: str | None, forks: int = DEFAULT_FORKS,
                   on_host_done: Callable[[str, object], None] | None = None, dry_run: bool = False,
                   inventory_path: str | None = None) -> list[RollbackResult]:
    """Each host's rollback; dry_run: what each would undo, read-only. inventory_path: named in a refusal's command."""
    def one(host: Host) -> RollbackResult:
        with open_transport(host.connection) as transport:
            return rollback_host(transport, host, run, root, dry_run, inventory_path)

    return FleetRunner(forks, on_host_done=on_host_done).map(one, list(inventory.hosts), name=lambda h: h.name)
