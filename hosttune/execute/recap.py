"""What apply and rollback did, per host: text for people, JSON for tools."""

from __future__ import annotations

import json
from dataclasses import dataclass

from hosttune.execute.reboot import cannot_reboot
from hosttune.execute.rollback import RollbackResult, rollback_command
from hosttune.execute.runner import HostRun, StepStatus
from hosttune.execute.rollout import HostOutcome
from hosttune.fleet_runner import Outcome, exit_code
from hosttune.checks.findings import Status
from hosttune.plan.host_plan import HostPlan
from hosttune.plan.render import plan_dict


def _steps_done(run: HostRun) -> str:
    text = f"{run.changed} of {len(run.steps)} steps done"
    failed = next((s for s in run.steps if s.status is StepStatus.FAILED), None)
    if failed is not None:
        text += f", step {failed.index + 1} failed after {failed.num_done} of its {failed.num_ops} operations"
    return text


def undo_command(run: HostRun, inventory: str | None) -> str:
    """The exact command that undoes this run on this host."""
    return rollback_command(run.host.name, run.run, run.root, inventory, yes=True)


def _failure_lines(o: HostOutcome, inventory: str | None, indent: str) -> list[str]:
    """A failed host: what was changed on it before the failure, and how to undo it."""
    if o.state is not Outcome.FAILED or o.run is None or not o.run.journal:
        return []
    if not o.run.changes:
        return [f"{indent}nothing was changed on it"]
    return [f"{indent}changed before the failure: {', '.join(o.run.changes)}",
            f"{indent}undo: {undo_command(o.run, inventory)}"]


def _detail(o: HostOutcome) -> str:
    parts = []
    if o.run is not None and o.run.steps:
        parts.append(_steps_done(o.run))
    if o.error:
        parts.append(o.error)
    if o.rebooted:
        parts.append("rebooted")
    if o.recheck is not None:
        failing = [f.check_id for f in o.recheck.findings if f.is_failing]
        parts.append("re-checked: " + (f"still failing {', '.join(failing)}" if failing else "clean"))
    elif o.reboot_skipped:
        parts.append(f"reboot pending: {o.reboot_skipped}")
    elif o.plan.needs_reboot and o.state in (Outcome.CHANGED, Outcome.OK):
        parts.append("reboot pending")
    if o.plan.blocked and o.state in (Outcome.CHANGED, Outcome.OK):
        parts.append(f"{len(o.plan.blocked)} not fixable by apply")
    return "; ".join(parts)


def render(outcomes: list[HostOutcome], run: str | None, inventory: str | None = None) -> str:
    width = max((len(o.host.name) for o in outcomes), default=4)
    lines = [f"recap{f' (run {run})' if run else ''}:"]
    for o in outcomes:
        lines.append(f"  {o.host.name:<{width}}  {o.state:<11} {_detail(o)}".rstrip())
        lines += _failure_lines(o, inventory, " " * (width + 4))
    states = (Outcome.CHANGED, Outcome.OK, Outcome.FAILED, Outcome.UNREACHABLE, Outcome.SKIPPED)
    counts = {s: sum(1 for o in outcomes if o.state is s) for s in states}
    lines.append("  " + ", ".join(f"{k}={v}" for k, v in counts.items()) + f", exit {exit_code(outcomes)}")
    return "\n".join(lines)


@dataclass(frozen=True)
class RebootPlan:
    """apply --reboot, before it runs: the hosts it reboots once their changes are made, and those it leaves to
    their operator, each with why (as the recap would say)."""

    rebooted: tuple[str, ...]
    left: tuple[tuple[str, str], ...]


def reboot_plan(plans: list[HostPlan]) -> RebootPlan:
    pending = [p for p in plans if p.reachable and not p.error and p.needs_reboot]
    return RebootPlan(tuple(p.host.name for p in pending if not cannot_reboot(p.host)),
                      tuple((p.host.name, why) for p in pending if (why := cannot_reboot(p.host))))


def reboot_note(plan: RebootPlan) -> str:
    """apply --dry-run --reboot as text."""
    lines = [f"--reboot: would reboot {', '.join(plan.rebooted)} once its changes are made, a batch at a time, wait "
             "for each to come back and re-check it"] if plan.rebooted else []
    lines += [f"--reboot: would not reboot {host}: {why}" for host, why in plan.left]
    return "\n".join(lines) or "--reboot: no host would be rebooted (none needs it)"


def reboot_dict(plan: RebootPlan | None) -> dict | None:
    """apply --dry-run --reboot as JSON; None without --reboot (or under --root), where a run reboots nothing."""
    if plan is None:
        return None
    return {"would_reboot": list(plan.rebooted),
            "would_not_reboot": [{"host": host, "reason": why} for host, why in plan.left]}


def outcome_dict(o: HostOutcome, inventory: str | None = None) -> dict:
    failed = o.state is Outcome.FAILED and o.run is not None and bool(o.run.changes)
    return {
        "host": o.host.name, "state": o.state, "error": o.error, "rebooted": o.rebooted,
        "reboot_skipped": o.reboot_skipped,
        "changed": o.run.changed if o.run else 0, "journal": o.run.journal if o.run else None,
        "steps": [{"index": s.index, "fixes": list(s.fixes), "summary": s.summary, "status": s.status, "error": s.error,
                   "num_ops": s.num_ops, "num_done": s.num_done}
                  for s in (o.run.steps if o.run else ())],
        "recheck": None if o.recheck is None else {f.check_id: f.status.value for f in o.recheck.findings
                                                  if f.status is not Status.NOT_APPLICABLE},
        "exit_bits": o.exit_bits, "plan": plan_dict(o.plan),
        "changes": list(o.run.changes) if o.run else [], "undo": undo_command(o.run, inventory) if failed else None,
    }


def render_json(outcomes: list[HostOutcome], run: str | None, dry_run: bool, inventory: str | None = None,
                reboot: RebootPlan | None = None) -> str:
    """The recap as JSON; `reboot`: what a dry run's --reboot would do."""
    doc = {"run": run, "dry_run": dry_run, "hosts": [outcome_dict(o, inventory) for o in outcomes],
           "reboot": reboot_dict(reboot), "exit_code": exit_code(outcomes)}
    return json.dumps(doc, indent=2)


def render_rollback(results: list[RollbackResult]) -> str:
    lines = []
    for r in results:
        lines.append(f"{r.host.name}: {r.status}" + (f" (run {r.run})" if r.run else "") + (f": {r.error}" if r.error else ""))
        lines += [f"  {d}" for d in r.done]
    return "\n".join(lines)
