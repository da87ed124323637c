"""Text for remediate: the plan (each fault, its ladder, its first step's operations) and the recap."""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass

from hosttune.actions.base import describe
from hosttune.config.inventory import Host
from hosttune.execute.reboot import cannot_reboot
from hosttune.quoting import join
from hosttune.remediate.climb import FaultResult, HostRemediation, RungOutcome
from hosttune.remediate.cordon import uncordon_step
from hosttune.remediate.rungs import Rung
from hosttune.remediate.steps import LadderOptions, reboot_skipped, step_for
from hosttune.remediate.survey import Survey


def _when(at: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime(at))


def _ladder(rungs: tuple[Rung, ...], options: LadderOptions, host: Host) -> str:
    """The rungs in order, a reboot the climb would pass over marked as such."""
    if not options.reboot:
        mark = " (needs --reboot)"
    else:
        mark = " (skipped: this machine runs hosttune)" if cannot_reboot(host) else ""
    return " -> ".join(f"{r}{mark}" if r is Rung.REBOOT else str(r) for r in rungs)


def uncordon_command(host: str, inventory: str | None) -> str:
    return join(["hosttune", "uncordon", *(("-i", inventory) if inventory else ()), "-l", host])


def _header(survey: Survey, inventory: str | None = None) -> str | None:
    name = survey.host.name
    if not survey.reachable:
        return f"{name}: unreachable: {survey.error}"
    if survey.error:
        return f"{name}: error: {survey.error}"
    if survey.snapshot.cordon:
        c = survey.snapshot.cordon
        return f"{name}: cordoned since {_when(c.at)} ({c.reason}); {uncordon_command(name, inventory)} takes it back"
    if not survey.faults:
        blind = _unjudged(survey)
        return f"{name}: no fault found, but {blind}" if blind else f"{name}: ok, nothing to remediate"
    return None


def _unjudged(survey: Survey) -> str:
    """What remediate cannot see on this host (a check its faults come from that could not be judged), or ""."""
    if not survey.unjudged:
        return ""
    unread = [why for what, why in survey.unjudged if what == "probe"]
    parts = [f"{what} cannot be judged ({why})" for what, why in survey.unjudged if what != "probe"]
    parts += [f"the probe could not read all of the host ({'; '.join(unread)})"] if unread else []
    return "remediate cannot see all it acts on: " + "; ".join(parts)


@dataclass(frozen=True)
class FirstStep:
    """The first rung the climb would act on, as the plan shows it (text and JSON alike)."""

    summary: str | None  # None: no rung it would act on
    operations: tuple[str, ...] = ()  # each described on one line
    reboot_skipped: str | None = None  # why the climb passes over the reboot rung


def first_step(survey: Survey, result: FaultResult, options: LadderOptions) -> FirstStep:
    """A reboot the climb would skip is passed over, as the climb does."""
    skipped = None
    for rung in result.fault.ladder:
        if rung is Rung.LOG:
            return FirstStep("log it in the host's ledger", reboot_skipped=skipped)
        why = reboot_skipped(survey.host, options) if rung is Rung.REBOOT else None
        if why:
            skipped = why
            continue
        if rung is Rung.REBOOT:
            return FirstStep("reboot and wait", reboot_skipped=skipped)
        step = step_for(rung, result.fault, survey.snapshot, options)
        if step is not None:
            return FirstStep(step.summary, tuple(describe(op) for op in step.ops), skipped)
    return FirstStep(None, reboot_skipped=skipped)


def _first_step(survey: Survey, result: FaultResult, options: LadderOptions) -> list[str]:
    first = first_step(survey, result, options)
    lines = [f"    reboot: skipped: {first.reboot_skipped}"] if first.reboot_skipped else []
    if first.summary is not None:
        lines += [f"    first: {first.summary}", *(f"      {op}" for op in first.operations)]
    return lines


def render_plan(results: list[HostRemediation], options: LadderOptions, inventory: str | None = None) -> str:
    lines = []
    for r in results:
        header = _header(r.survey, inventory)
        if header:
            lines.append(header)
            continue
        blind = _unjudged(r.survey)
        lines.append(f"{r.survey.host.name}: {len(r.results)} fault(s)" + (f"; {blind}" if blind else ""))
        for f in r.results:
            lines += [f"  {f.fault.check_id}  {f.fault.reason}",
                      f"    ladder: {_ladder(f.fault.ladder, options, r.survey.host)}", *_first_step(r.survey, f, options)]
    return "\n".join(lines)


def render_uncordon_plan(surveys: list[Survey]) -> str:
    """What uncordon would do on each host: the operations of its step, or why there is none."""
    lines = []
    for survey in surveys:
        header = _header(survey)
        if not survey.reachable or survey.error:
            lines.append(header)
        elif not survey.is_cordoned:
            lines.append(f"{survey.host.name}: not cordoned, nothing to do")
        else:
            step = uncordon_step(survey)
            c = survey.snapshot.cordon
            lines += [f"{survey.host.name}: cordoned since {_when(c.at)} ({c.reason})", f"    {step.summary}",
                      *(f"      {describe(op)}" for op in step.ops)]
    return "\n".join(lines)


def _rung_line(o: RungOutcome) -> str:
    run = f" (run {o.run})" if o.run else ""
    return f"    {o.rung}: {o.status}{run}" + (f": {o.detail}" if o.detail else "")


def render_recap(results: list[HostRemediation], run: str, inventory: str | None = None) -> str:
    lines = [f"remediation run {run}"]
    for r in results:
        header = _header(r.survey, inventory)
        if header:
            lines.append(header)
            continue
        lines.append(f"{r.survey.host.name}:" + (f" error: {r.error}" if r.error else ""))
        for f in r.results:
            lines.append(f"  {f.fault.check_id}  {f.fault.where}: {f.end}")
            lines += [_rung_line(o) for o in f.rungs]
    return "\n".join(lines)


def _fault_doc(f: FaultResult, first: FirstStep | None) -> dict:
    return {"check_id": f.fault.check_id, "kind": f.fault.kind.value, "where": f.fault.where, "gpu": f.fault.gpu,
            "unit": f.fault.unit, "reason": f.fault.reason, "ladder": [str(r) for r in f.fault.ladder], "end": f.end.value,
            "first": asdict(first) if first else None,
            "rungs": [{"rung": str(o.rung), "status": o.status, "detail": o.detail, "run": o.run} for o in f.rungs]}


def _host_doc(r: HostRemediation, options: LadderOptions | None) -> dict:
    """options: the plan's, for a host the plan climbs (not cordoned, no error): each fault's first step."""
    options = options if _header(r.survey) is None else None
    cordon = r.survey.snapshot.cordon
    return {"host": r.survey.host.name, "reachable": r.survey.reachable, "error": r.error or r.survey.error,
            "cordoned": {"at": cordon.at, "reason": cordon.reason, "run": cordon.run} if cordon else None,
            "cannot_judge": [{"check_id": what, "detail": why} for what, why in r.survey.unjudged],
            "faults": [_fault_doc(f, first_step(r.survey, f, options) if options else None) for f in r.results],
            "exit_bits": r.exit_bits}


def render_json(results: list[HostRemediation], run: str | None, breaker: str = "", room: int | None = None,
                dry_run: bool | None = None, options: LadderOptions | None = None) -> str:
    """The plan (run None) or the recap as JSON, for automation; room: the cordons the breaker allows (the plan's);
    dry_run: whether nothing was to change (default: a plan), False for a --yes run that found nothing to do;
    options: the plan's, whose first step of each fault it carries as the text plan shows it."""
    return json.dumps({"run": run, "dry_run": run is None if dry_run is None else dry_run, "breaker": breaker or None,
                       "breaker_room": room, "hosts": [_host_doc(r, options) for r in results]}, indent=1)
