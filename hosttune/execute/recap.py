"""What apply and rollback did, per host: text for people, JSON for tools."""

from __future__ import annotations

import json

from hosttune.execute.rollback import RollbackResult
from hosttune.execute.rollout import HostOutcome
from hosttune.fleet_runner import Outcome, exit_code
from hosttune.checks.findings import Status
from hosttune.plan.render import plan_dict


def _detail(o: HostOutcome) -> str:
    parts = []
    if o.run is not None and o.run.steps:
        parts.append(f"{o.run.changed}/{len(o.run.steps)} steps done")
    if o.error:
        parts.append(o.error)
    if o.rebooted:
        parts.append("rebooted")
    if o.recheck is not None:
        failing = [f.check_id for f in o.recheck.findings if f.is_failing]
        parts.append("re-checked: " + (f"still failing {', '.join(failing)}" if failing else "clean"))
    elif o.plan.needs_reboot and o.state in (Outcome.CHANGED, Outcome.OK):
        parts.append("reboot pending")
    if o.plan.blocked and o.state in (Outcome.CHANGED, Outcome.OK):
        parts.append(f"{len(o.plan.blocked)} not fixable by apply")
    return "; ".join(parts)


def render(outcomes: list[HostOutcome], run: str | None) -> str:
    width = max((len(o.host.name) for o in outcomes), default=4)
    lines = [f"recap{f' (run {run})' if run else ''}:"]
    for o in outcomes:
        lines.append(f"  {o.host.name:<{width}}  {o.state:<11} {_detail(o)}".rstrip())
    states = (Outcome.CHANGED, Outcome.OK, Outcome.FAILED, Outcome.UNREACHABLE, Outcome.SKIPPED)
    counts = {s: sum(1 for o in outcomes if o.state is s) for s in states}
    lines.append("  " + ", ".join(f"{k}={v}" for k, v in counts.items()) + f", exit {exit_code(outcomes)}")
    return "\n".join(lines)


def outcome_dict(o: HostOutcome) -> dict:
    return {
        "host": o.host.name, "state": o.state, "error": o.error, "rebooted": o.rebooted,
        "changed": o.run.changed if o.run else 0, "journal": o.run.journal if o.run else None,
        "steps": [{"index": s.index, "fixes": list(s.fixes), "summary": s.summary, "status": s.status, "error": s.error}
                  for s in (o.run.steps if o.run else ())],
        "recheck": None if o.recheck is None else {f.check_id: f.status.value for f in o.recheck.findings
                                                  if f.status is not Status.NOT_APPLICABLE},
        "exit_bits": o.exit_bits, "plan": plan_dict(o.plan),
    }


def render_json(outcomes: list[HostOutcome], run: str | None, dry_run: bool) -> str:
    doc = {"run": run, "dry_run": dry_run, "hosts": [outcome_dict(o) for o in outcomes], "exit_code": exit_code(outcomes)}
    return json.dumps(doc, indent=2)


def render_rollback(results: list[RollbackResult]) -> str:
    lines = []
    for r in results:
        lines.append(f"{r.host.name}: {r.status}" + (f" (run {r.run})" if r.run else "") + (f": {r.error}" if r.error else ""))
        lines += [f"  {d}" for d in r.done]
    return "\n".join(lines)
