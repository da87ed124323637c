"""What benchmarks/engine/quant_tune.py sweeps: the Qwen2.5-7B projections (or a tiny stand-in for the CPU
test), each kernel's candidate launch configs, and random weights in the kernels' layouts."""

from __future__ import annotations

from dataclasses import dataclass

from hosttune_engine.kernels.gemv import PLAIN, RMSNORM_RESIDUAL, SWIGLU
# The candidate grids and weight layouts live in the engine's tuner (`hosttune-engine tune` sweeps them too).
from hosttune_engine.tuner.candidates import FP8_GEMV, GEMM_FEW_ROWS, GEMM_MANY_ROWS, INT4_GEMV, tiny_candidates  # noqa: F401
from hosttune_engine.tuner.weights import Fp8Weights, Int4Weights, fp8_weights, int4_weights  # noqa: F401


@dataclass(frozen=True)
class Proj:
    """One projection of a decoder layer: y [M, N] = x [M, K] @ W.T, with the layer before it fused into the
    batch-1 GEMV's prologue as the engine's decode step fuses it."""

    name: str
    n: int
    k: int
    prologue: int
    has_bias: bool = False


def projections(hidden: int, inter: int, heads: int, kv_heads: int, head_dim: int) -> list[Proj]:
    q, kv = heads * head_dim, kv_heads * head_dim
    # qkv's bias is left out: it costs nothing measurable and would compile every candidate twice more
    return [Proj("qkv", q + 2 * kv, hidden, RMSNORM_RESIDUAL), Proj("o", hidden, q, PLAIN),
            Proj("gate_up", 2 * inter, hidden, RMSNORM_RESIDUAL), Proj("down", hidden, inter, SWIGLU)]


QWEN7B = dict(hidden=3584, inter=18944, heads=28, kv_heads=4, head_dim=128, layers=28, vocab=152064)
TINY = dict(hidden=256, inter=512, heads=4, kv_heads=2, head_dim=64, layers=2, vocab=1024)
