"""Apply and roll back across a fleet: batches (--serial), a failure budget (--max-fail-percent),
reboots of pending hosts a batch at a time (--reboot), and a recap per host."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable

from hosttune.execute.reboot import reboot_and_wait
from hosttune.execute.rollback import RollbackResult, rollback_host
from hosttune.execute.runner import HostRun, execute_plan
from hosttune.fleet import EXIT_DRIFT, EXIT_ERROR, EXIT_UNREACHABLE, HostReport, check_host
from hosttune.config.inventory import Host, Inventory
from hosttune.plan.host_plan import HostPlan, PlanOptions, plan_host
from hosttune.config.profile import Profile
from hosttune.transport import open_transport

DEFAULT_FORKS = 50


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
    state: str  # changed | ok | failed | unreachable | skipped
    run: HostRun | None = None
    error: str | None = None
    rebooted: bool = False
    recheck: HostReport | None = None

    @property
    def host(self) -> Host:
        return self.plan.host

    @property
    def exit_bits(self) -> int:
        if self.state == "unreachable":
            return EXIT_UNREACHABLE
        if self.state == "failed":
            return EXIT_ERROR
        if self.state == "skipped":
            return EXIT_DRIFT if (self.plan.steps or self.plan.blocked or self.plan.needs_reboot) else 0
        if self.recheck is not None:
            return self.recheck.exit_bits
        return EXIT_DRIFT if (self.plan.blocked or self.plan.needs_reboot) else 0


def _parallel(fn, items: list, forks: int) -> list:
    if not items:
        return []
    with ThreadPoolExecutor(max_workers=max(1, min(forks, len(items)))) as pool:
        return list(pool.map(fn, items))


def plan_fleet(inventory: Inventory, profiles: dict[str, Profile], options: ApplyOptions,
               on_done: Callable[[HostPlan], None] | None = None) -> list[HostPlan]:
    """Every host's plan, in inventory order; read-only."""
    def one(host: Host) -> HostPlan:
        plan = plan_host(host, profiles[host.name], options.plan_options())
        if on_done:
            on_done(plan)
        return plan

    return _parallel(one, list(inventory.hosts), options.forks)


def dry_run_outcome(plan: HostPlan) -> HostOutcome:
    if not plan.reachable:
        return HostOutcome(plan, "unreachable", error=plan.error)
    if plan.error:
        return HostOutcome(plan, "failed", error=plan.error)
    return HostOutcome(plan, "changed" if plan.steps else "ok")


def _execute(plan: HostPlan, run: str) -> HostOutcome:
    if not plan.reachable or plan.error:
        return dry_run_outcome(plan)
    if not plan.steps:
        return HostOutcome(plan, "ok")
    transport = open_transport(plan.host.connection)
    try:
        result = execute_plan(transport, plan, run)
    finally:
        transport.close()
    return HostOutcome(plan, result.status, result, result.error)


def _reboot(outcome: HostOutcome, profiles: dict[str, Profile], options: ApplyOptions) -> HostOutcome:
    due = outcome.state in ("changed", "ok") and outcome.plan.needs_reboot and not options.root
    if not due:
        return outcome
    problem = reboot_and_wait(outcome.host, options.reboot_timeout_s)
    if problem:
        return HostOutcome(outcome.plan, "failed", outcome.run, f"reboot: {problem}")
    recheck = check_host(outcome.host, profiles[outcome.host.name])
    return HostOutcome(outcome.plan, outcome.state, outcome.run, outcome.error, True, recheck)


def batches(plans: list[HostPlan], serial: int | None) -> list[list[HostPlan]]:
    size = serial or len(plans) or 1
    return [plans[i:i + size] for i in range(0, len(plans), size)]


def over_budget(outcomes: list[HostOutcome], max_fail_percent: float | None) -> bool:
    tried = [o for o in outcomes if o.state != "skipped"]  # skipped hosts must not dilute the budget
    if max_fail_percent is None or not tried:
        return False
    failed = sum(1 for o in tried if o.state in ("failed", "unreachable"))
    return failed * 100.0 / len(tried) > max_fail_percent


def apply_plans(plans: list[HostPlan], profiles: dict[str, Profile], run: str, options: ApplyOptions,
                on_batch: Callable[[list[HostOutcome]], None] | None = None) -> list[HostOutcome]:
    """Execute the plans batch by batch; once the failure budget is spent, later batches are skipped."""
    outcomes: list[HostOutcome] = []
    for batch in batches(plans, options.serial):
        if over_budget(outcomes, options.max_fail_percent):
            outcomes += [HostOutcome(p, "skipped", error=f"not run: more than {options.max_fail_percent:g}% of hosts failed")
                         for p in batch]
            continue
        done = _parallel(lambda p: _execute(p, run), batch, options.forks)
        if options.reboot:
            done = _parallel(lambda o: _reboot(o, profiles, options), done, options.forks)
        if on_batch:
            on_batch(done)
        outcomes += done
    return outcomes


def fleet_exit_code(outcomes: list[HostOutcome]) -> int:
    code = 0
    for outcome in outcomes:
        code |= outcome.exit_bits
    return code


def rollback_fleet(inventory: Inventory, run: str | None, root: str | None, forks: int = DEFAULT_FORKS) -> list[RollbackResult]:
    def one(host: Host) -> RollbackResult:
        transport = open_transport(host.connection)
        try:
            return rollback_host(transport, host, run, root)
        finally:
            transport.close()

    return _parallel(one, list(inventory.hosts), forks)
