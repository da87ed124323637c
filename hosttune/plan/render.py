"""Plans as text (with file diffs) and as JSON."""

from __future__ import annotations

from hosttune.actions.base import FileWrite, KernelWrite, Op, Step, describe
from hosttune.plan.host_plan import HostPlan


def _step_lines(index: int, step: Step, plan: HostPlan) -> list[str]:
    reboot = "  [needs reboot]" if step.needs_reboot and not plan.is_image else ""
    lines = [f"  {index}. {', '.join(step.fixes)}: {step.summary}{reboot}"]
    for op in step.ops:
        lines.append(f"       {describe(op)}")
        if isinstance(op, FileWrite) and op.path in plan.diffs:
            lines += [f"         {line}" for line in plan.diffs[op.path].rstrip("\n").splitlines()]
    lines += [f"       note: {note}" for note in step.notes]
    return lines


def host_summary(plan: HostPlan) -> str:
    if not plan.reachable:
        return "UNREACHABLE"
    if plan.error:
        return "ERROR"
    files = sum(len(s.writes) for s in plan.steps)
    parts = [f"{len(plan.steps)} change{'s' if len(plan.steps) != 1 else ''}", f"{files} file{'s' if files != 1 else ''}"]
    if plan.blocked:
        parts.append(f"{len(plan.blocked)} not fixable here")
    if plan.needs_reboot:
        parts.append("reboot needed")
    return ", ".join(parts)


def render_host(plan: HostPlan) -> list[str]:
    root = f" (files under {plan.root})" if plan.root and plan.root != "/" else ""
    lines = [f"{plan.host.name} [{plan.host.group}] profile {plan.profile}{root}: {host_summary(plan)}"]
    if plan.error:
        lines.append(f"  {plan.error}")
    for index, step in enumerate(plan.steps, 1):
        lines += _step_lines(index, step, plan)
    if plan.preconditions:
        lines.append("  checked on the host before anything is sent:")
        lines += [f"    {line}" for line in plan.preconditions]
    for step in plan.blocked:
        lines.append(f"  - {', '.join(step.fixes)}: not fixed by apply: {step.blocked}")
    for step in plan.left_out:
        lines.append(f"  - {', '.join(step.fixes)}: {step.summary} (left out; pass --{step.opt_in})")
    lines += [f"  - {line}" for line in plan.not_done]
    if plan.pending_reboot:
        lines.append(f"  - pending reboot (configured, not active yet): {', '.join(plan.pending_reboot)}")
    return lines


def render(plans: list[HostPlan]) -> str:
    out: list[str] = []
    for plan in plans:
        out += render_host(plan) + [""]
    changes = sum(len(p.steps) for p in plans if not p.error)  # a host stopped at plan time gets none of its plan
    hosts = sum(1 for p in plans if p.steps and not p.error)
    out.append(f"plan: {changes} change{'s' if changes != 1 else ''} on {hosts} of {len(plans)} host{'s' if len(plans) != 1 else ''}")
    return "\n".join(out)


def op_dict(op: Op) -> dict:
    d = {"kind": type(op).__name__, "description": describe(op), "argv": list(op.argv)}
    if isinstance(op, FileWrite):
        d.update(path=op.path, mode=f"{op.mode:04o}")
    if isinstance(op, KernelWrite):
        d.update(paths=list(op.paths), value=op.value, live_kernel_write=True)
    return d


def step_dict(step: Step) -> dict:
    return {
        "fixes": list(step.fixes), "summary": step.summary, "needs_reboot": step.needs_reboot,
        "is_live_kernel_write": step.is_live_kernel_write, "ops": [op_dict(o) for o in step.ops],
        "notes": list(step.notes), "blocked": step.blocked, "opt_in": step.opt_in,
    }


def plan_dict(plan: HostPlan) -> dict:
    return {
        "host": plan.host.name, "group": plan.host.group, "profile": plan.profile,
        "reachable": plan.reachable, "error": plan.error, "root": plan.root,
        "steps": [step_dict(s) for s in plan.steps], "blocked": [step_dict(s) for s in plan.blocked],
        "left_out": [step_dict(s) for s in plan.left_out], "pending_reboot": list(plan.pending_reboot),
        "needs_reboot": plan.needs_reboot, "diffs": plan.diffs, "preconditions": list(plan.preconditions),
        "not_done": list(plan.not_done),
    }
