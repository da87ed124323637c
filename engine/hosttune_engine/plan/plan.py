"""The kernel plan's values: a choice per (operation, row bucket), the choices of one operation, the plan."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from hosttune_engine.plan.gpus import GpuInfo
from hosttune_engine.plan.kinds import Fusion, Kernel, Op, Reason, RowBucket

OWN_KERNEL = {Op.NORM: Kernel.RMSNORM, Op.POST_NORM: Kernel.RMSNORM, Op.ACTIVATION: Kernel.SWIGLU}
from hosttune_engine.plan.launch import LaunchConfig


@dataclass(frozen=True)
class Choice:
    """What runs one operation for one row bucket, with which config, and why."""

    op: Op
    bucket: RowBucket
    kernel: Kernel
    config: LaunchConfig = LaunchConfig()
    reason: Reason = Reason.RULE
    fusion: Fusion = Fusion.NONE
    entry: str = ""  # the tuned-table entry it came from ("fp8_gemv bfloat16-le1-4608x3584"), if any
    note: str = ""
    args: dict = field(default_factory=dict, compare=False, repr=False)  # config.kernel_args(), made once

    def __post_init__(self):
        object.__setattr__(self, "args", self.config.kernel_args())

    @property
    def runs_reference(self) -> bool:
        return self.kernel is Kernel.TORCH


@dataclass(frozen=True)
class OpPlan:
    """One operation's choices, one per row bucket in ascending rows (the last holds every larger count)."""

    op: Op
    choices: tuple[Choice, ...]
    shape: tuple[int, int] | None = None  # a projection's weight on one rank, (N, K)
    _by_kind: dict = field(init=False, compare=False, repr=False)  # prefill -> its choices, looked up per call

    def __post_init__(self):
        object.__setattr__(self, "_by_kind", {prefill: tuple(c for c in self.choices if c.bucket.is_prefill == prefill)
                                              or self.choices for prefill in (False, True)})

    def at(self, rows: int, prefill: bool = False) -> Choice:
        """The choice for a step of `rows` rows (attention: a prompt of `rows` tokens when `prefill`)."""
        choices = self._by_kind[prefill]
        for choice in choices:
            if rows <= choice.bucket.hi:
                return choice
        return choices[-1]


@dataclass(frozen=True)
class KernelPlan:
    """Every operation's choices for one model on one GPU."""

    gpu: GpuInfo
    dtype: str  # activations: "bfloat16"
    weights: str  # the plain weights' dtype ("bfloat16"), or the quantized layout ("fp8-channel", "awq", ...)
    table: str  # where tuned entries came from ("none" when no table has this GPU)
    ops: tuple[OpPlan, ...]
    model: str = ""  # the model's shape, in words

    def op(self, op: Op) -> OpPlan:
        return next(p for p in self.ops if p.op is op)

    def choice(self, op: Op, rows: int, prefill: bool = False) -> Choice:
        return self.op(op).at(rows, prefill)

    @property
    def is_tuned(self) -> bool:
        return any(c.reason in (Reason.TUNED_SHAPE, Reason.TUNED_BUCKET) for p in self.ops for c in p.choices)

    def with_kernel(self, op: Op, kernel: Kernel) -> "KernelPlan":
        """This plan with `kernel` (no config, no fusion) for every row bucket of `op`: by hand, e.g. the torch
        reference for one projection while checking it."""
        choices = tuple(Choice(op, c.bucket, kernel, reason=Reason.OVERRIDE) for c in self.op(op).choices)
        changed = OpPlan(op, choices, self.op(op).shape)
        return replace(self, ops=tuple(changed if p.op is op else p for p in self.ops))

    def unfused(self) -> "KernelPlan":
        """This plan with every norm and activation run by its own kernel (to check what fusion changes)."""
        return replace(self, ops=tuple(OpPlan(p.op, tuple(_unfused(c) for c in p.choices), p.shape) for p in self.ops))


def _unfused(c: Choice) -> Choice:
    if c.kernel is Kernel.IN_CONSUMER:
        return replace(c, kernel=OWN_KERNEL[c.op], note="")
    return replace(c, fusion=Fusion.NONE) if c.fusion is not Fusion.NONE else c
