"""What deploy did, per host, as text."""

from __future__ import annotations

import textwrap

from hosttune.deploy.host import HostDeploy
from hosttune.fleet_runner import Outcome


def render(outcomes: list[HostDeploy]) -> str:
    width = max((len(o.host.name) for o in outcomes), default=4)
    lines = []
    for o in outcomes:
        detail = o.gate.summary() if o.gate and o.gate.ok else (o.error or "")
        if o.state is Outcome.DEPLOYED and o.error and detail != o.error:  # deployed, with what did not go as planned
            detail = f"{detail}; {o.error}"
        lines.append(f"{o.host.name:<{width}}  {o.state:<11} {o.release or '-':<20} {detail}".rstrip())
        if o.state in (Outcome.PLANNED, Outcome.DEPLOYED, Outcome.UNCHANGED):  # a failed host kept, or got back, what it had
            lines += [f"{'':<{width}}  ! {what}" for what in o.removals]
        if o.ops:
            lines += [f"{'':<{width}}    {op}" for op in o.ops]
        if o.checks and o.state in (Outcome.PLANNED, Outcome.FAILED):
            lines.append(f"{'':<{width}}  checked on the host before anything is sent:")
            lines += [f"{'':<{width}}    {check}" for check in o.checks]
        if o.journal:
            lines.append(f"{'':<{width}}  journal of the service (last lines):")
            lines.append(textwrap.indent(o.journal, " " * (width + 4)))
        if o.state is Outcome.FAILED and o.release:
            lines.append(f"{'':<{width}}  {_after_failure(o)}")
    return "\n".join(lines)


def _after_failure(o: HostDeploy) -> str:
    if o.restored:
        return f"previous release {o.restored} put back and serving" if o.serving else \
            f"previous release {o.restored} put back but NOT serving"
    return f"nothing live changed (the live release is still {o.serving})" if o.serving else "no release is serving on this host"


def batch_line(outcomes: list[HostDeploy]) -> str:
    """One line per finished batch (the recap at the end has the details)."""
    return "batch done: " + ", ".join(f"{o.host.name} {o.state}" for o in outcomes)


def rollout_line(units: list[list[str]], serial: int | None, canary: int, max_fail_percent: float | None,
                 slo: str | None) -> str | None:
    """In what order the run takes the hosts it deploys (units: a host, or a multi-node group, in roll order);
    None when it takes them all at once, or takes none."""
    if not units or not canary and (not serial or serial >= len(units)):
        return None
    names = [", ".join(unit) for unit in units]
    first, rest = names[:canary], names[canary:]
    order = " then ".join(", ".join(names_) for names_ in _batches(rest, serial)) + (
        f" (batches of {serial})" if serial and len(rest) > serial else "")
    if first:
        they = "it is" if len(first) == 1 else "they are"
        meet = f" and meet{'s' if len(first) == 1 else ''} --canary-slo {slo}" if slo else ""
        order = (f"the canar{'y' if len(first) == 1 else 'ies'} {', '.join(first)} first"
                 + (f"; {order} only once {they} deployed{meet}" if rest else ""))
    budget = f"; no batch starts once more than {max_fail_percent:g}% of the hosts tried failed" \
        if max_fail_percent is not None and len(rest) > (serial or len(rest)) else ""
    return f"rollout: {order}{budget}"


def _batches(names: list[str], serial: int | None) -> list[list[str]]:
    size = serial or len(names) or 1
    return [names[i:i + size] for i in range(0, len(names), size)]


def plan_line(plans: list[HostDeploy], verb: str = "deploy to") -> str:
    """The plan's last line: how many hosts it changes, and how many it takes something away from."""
    due = sum(1 for o in plans if o.state is Outcome.PLANNED)
    removing = sum(1 for o in plans if o.state is Outcome.PLANNED and o.removals)
    hosts = "host" if len(plans) == 1 else "hosts"
    refreshing = sum(1 for o in plans if is_refresh(o) and not o.removals)
    unfronting = sum(1 for o in plans if is_refresh(o) and o.removals)
    return (f"plan: {verb} {due} of {len(plans)} {hosts}"
            + (f"; {removing} of them lose what is marked !" if removing else "")
            + (f"; refresh the nginx front of {refreshing} unchanged {'host' if refreshing == 1 else 'hosts'}"
               if refreshing else "")
            + (f"; remove the nginx front left on {unfronting} unchanged {'host' if unfronting == 1 else 'hosts'} (!)"
               if unfronting else ""))


def is_refresh(o: HostDeploy) -> bool:
    """An unchanged release whose run writes its nginx front (or TLS files) again, or removes it: its operations."""
    return o.state is Outcome.UNCHANGED and bool(o.ops)
