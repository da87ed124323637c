"""The vocabulary of a kernel plan: operations, kernels, row buckets and the reasons for a choice."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class Op(Enum):
    """An operation of a decoder step the plan chooses a kernel for."""

    QKV = "qkv_proj"
    O = "o_proj"
    GATE_UP = "gate_up_proj"
    DOWN = "down_proj"
    LM_HEAD = "lm_head"
    ATTENTION = "attention"
    NORM = "norm (input_layernorm)"  # before qkv_proj
    POST_NORM = "norm (post_attention_layernorm)"  # before gate_up_proj (the final norm: always its own kernel)
    ACTIVATION = "activation"
    SAMPLER = "sampler"

    @property
    def is_projection(self) -> bool:
        return self in PROJECTIONS


PROJECTIONS = (Op.QKV, Op.O, Op.GATE_UP, Op.DOWN, Op.LM_HEAD)


class Kernel(Enum):
    """What computes an operation."""

    TORCH = "torch reference"
    CUBLAS = "cuBLAS"
    GEMV = "Triton GEMV"
    FP8_GEMV = "Triton FP8 GEMV"
    INT4_GEMV = "Triton 4-bit GEMV"
    W8A16_GEMM = "Triton W8A16 GEMM"
    W4A16_GEMM = "Triton W4A16 GEMM"
    W4A16_WGMMA = "W4A16 GEMM on Hopper's warpgroup MMA"
    W4A16_DEQUANT = "4-bit weight dequantized, then cuBLAS"
    FP8_MM_UNIT = "torch._scaled_mm (unit scales, our epilogue)"
    FP8_MM_ROWWISE = "torch._scaled_mm (row-wise scales)"
    FP8_GEMM = "Triton FP8 GEMM"
    DECODE_ATTENTION = "Triton paged decode attention"
    PREFILL_ATTENTION = "Triton prefill attention"
    RMSNORM = "Triton RMSNorm"
    SWIGLU = "Triton SwiGLU"
    IN_CONSUMER = "computed by the next projection"
    RACE_SAMPLER = "Triton race sampler"


class Fusion(Enum):
    """What a projection computes on its input on the way in (or its output on the way out)."""

    NONE = "-"
    RMSNORM = "RMSNorm + residual in the prologue"
    SWIGLU = "SwiGLU in the prologue"
    RMSNORM_FP8 = "RMSNorm + residual + e4m3 per token, one kernel"
    SWIGLU_FP8 = "SwiGLU + e4m3 per token, one kernel"
    SWIGLU_IN_GATE_UP = "SwiGLU in gate_up's GEMM epilogue, then e4m3"


class Reason(Enum):
    """Why the plan chose what it chose."""

    TUNED_SHAPE = "tuned for this shape"
    TUNED_BUCKET = "tuned for this row bucket"
    DEFAULT = "generic default"
    RULE = "engine rule"
    FALLBACK = "fallback"
    OVERRIDE = "set by hand"


@dataclass(frozen=True)
class RowBucket:
    """Row counts [lo, hi] that take the same kernel and config; `table` is the tuned tables' bucket key, and
    `fallback` the key read where a kernel has no entry under it."""

    name: str
    lo: int
    hi: int
    table: str
    is_prefill: bool = False
    fallback: str = ""

    @property
    def keys(self) -> tuple[str, ...]:
        return (self.table, self.fallback) if self.fallback else (self.table,)

    def holds(self, rows: int) -> bool:
        return self.lo <= rows <= self.hi


# Where the engine's choices change (a prompt's rows are its tokens: prefill steps are the wide buckets): the
# quantized GEMVs take up to 4 rows, the tuned tables key batches by le1/le8/le32/le64/le128/gt128, prefill attention
# by the chunk's length. A decode step of 129-256 rows reads le256 first, where a kernel has its own entry for it
# (the 4-bit GEMM whose one program takes all 256 rows, which loses to cuBLAS on prefill's thousands), else gt128.
ROW_BUCKETS = (
    RowBucket("1", 1, 1, "le1"), RowBucket("2-4", 2, 4, "le8"), RowBucket("5-8", 5, 8, "le8"),
    RowBucket("9-32", 9, 32, "le32"), RowBucket("33-64", 33, 64, "le64"), RowBucket("65-128", 65, 128, "le128"),
    RowBucket("129-256", 129, 256, "le256", fallback="gt128"), RowBucket("257+", 257, 1 << 30, "gt128"),
)
DECODE_BUCKETS = (RowBucket("1", 1, 1, "le1"), RowBucket("2-8", 2, 8, "le8"), RowBucket("9-32", 9, 32, "le32"),
                  RowBucket("33-64", 33, 64, "le64"), RowBucket("65-128", 65, 128, "le128"),
                  RowBucket("129-256", 129, 1 << 30, "gt128"))
PREFILL_BUCKETS = (RowBucket("prefill <1K", 1, 1023, "lt1k", True), RowBucket("prefill 1K-3K", 1024, 3071, "1k-3k", True),
                   RowBucket("prefill >=3K", 3072, 1 << 30, "ge3k", True))
GEMV_ROWS = 4  # the quantized GEMVs take up to this many rows; the bf16 GEMV one


def row_bucket(rows: int) -> RowBucket:
    """The bucket of a step of `rows` rows (the last one holds every larger count)."""
    for bucket in ROW_BUCKETS:
        if rows <= bucket.hi:
            return bucket
    return ROW_BUCKETS[-1]
