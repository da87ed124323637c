"""A kernel plan as text: the full table `hosttune-engine plan` prints, and the one line the server logs."""

from __future__ import annotations

from collections import Counter

from hosttune_engine.plan.kinds import Op, Reason
from hosttune_engine.plan.plan import Choice, KernelPlan, OpPlan

COLUMNS = ("rows", "kernel", "config", "why", "input / output fused")


def format_plan(plan: KernelPlan) -> str:
    """Every operation's choice per row bucket, with its config and the reason."""
    lines = [f"Kernel plan for {plan.model}", f"{_device(plan)}; weights {plan.weights}, activations {plan.dtype}; "
             f"tuned table: {plan.table}"]
    for op_plan in plan.ops:
        lines += ["", f"{op_plan.op.value}:{_shape(op_plan)}"]
        rows = [COLUMNS] + [_row(c) for c in op_plan.choices]
        widths = [max(len(r[i]) for r in rows) for i in range(len(COLUMNS))]
        lines += ["  " + "  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip() for r in rows]
    return "\n".join(lines)


def _shape(op_plan: OpPlan) -> str:
    return f" weight {op_plan.shape[0]}x{op_plan.shape[1]} (N x K)" if op_plan.shape else ""


def _device(plan: KernelPlan) -> str:
    if not plan.gpu.is_cuda:
        return "device: CPU (no GPU: the torch references run)"
    return f"GPU: {plan.gpu.name} (compute capability {'.'.join(map(str, plan.gpu.capability))})"


def _row(c: Choice) -> tuple[str, ...]:
    why = c.reason.value + (f" ({c.entry})" if c.entry else "") + (f"; {c.note}" if c.note else "")
    return (c.bucket.name, c.kernel.value, str(c.config), why, c.fusion.value)


def summary(plan: KernelPlan) -> str:
    """One line: how many choices are tuned, and what runs a one-row step and a prefill."""
    reasons = Counter(c.reason for p in plan.ops for c in p.choices)
    tuned = reasons[Reason.TUNED_SHAPE] + reasons[Reason.TUNED_BUCKET]
    counts = f"{tuned} choices tuned, {reasons[Reason.DEFAULT]} generic defaults, {reasons[Reason.FALLBACK]} fallbacks"
    one_row = ", ".join(f"{p.op.value} {p.at(1).kernel.value}" for p in plan.ops if p.op.is_projection)
    prefill = plan.choice(Op.QKV, 4096).kernel.value
    bits = any(c.config.bits for p in plan.ops for c in p.choices)  # before 8.9 (kernels/e4m3.py)
    decode = "; e4m3 weights decoded by integer operations" if bits else ""
    return (f"kernel plan on {plan.gpu.name}, {plan.weights} weights, tuned table {plan.table}: {counts}; "
            f"one row: {one_row}; prefill projections: {prefill}{decode}")
