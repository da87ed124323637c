"""What benchmarks/engine/quant_tune.py sweeps: the Qwen2.5-7B projections (or a tiny stand-in for the CPU
test), each kernel's candidate launch configs, and random weights in the kernels' layouts."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from hosttune_engine.kernels.gemv import PLAIN, RMSNORM_RESIDUAL, SWIGLU
from hosttune_engine.quant.quantize import fp8_per_channel


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


def _grid(keys, rows) -> list[dict]:
    return [dict(zip(keys, r)) for r in rows]


_GEMV_KEYS = ("BLOCK_N", "BLOCK_K", "num_warps", "num_stages", "FUSE")  # FUSE 0: the prologue's own kernels first


def _variants(rows, unrolls=(1, 2), xb: int = 1) -> list[dict]:
    """GEMV configs with the K loop unrolled; for the FP8 GEMV also the input in the weight tile's layout (XB: what
    the unfused FUSE 0 GEMVs can take)."""
    extra = {"XB": 1} if xb else {}
    return [{**c, **extra, "UNROLL": u} for c in _grid(_GEMV_KEYS, rows) for u in unrolls]


def _split(rows, unrolls, splits=(2, 4)) -> list[dict]:
    """GEMV configs with K split across programs (kernels/gemv_splits.py): for the projections with few rows."""
    return [{**c, "SPLIT": k} for c in _variants(rows, unrolls, xb=0) for k in splits]


def _piped(rows, xb: int, stages=(3, 4)) -> list[dict]:
    """GEMV configs whose K loop is software-pipelined (PIPE: every load of the loop, not only a dot's, through
    shared memory that many tiles ahead)."""
    return [{**c, "PIPE": p} for c in _variants(rows, (1,), xb=xb) for p in stages]


_FP8_SPLIT = [(4, 1024, 4, 3, 0), (8, 512, 4, 3, 0), (16, 512, 8, 3, 0)]
_FP8_ROWS = [(16, 512, 8, 3, 1), (8, 512, 4, 4, 1), (4, 1024, 4, 3, 1), (4, 512, 4, 4, 1), (16, 256, 4, 3, 1),
             (8, 1024, 8, 3, 1), (16, 512, 8, 3, 0), (4, 1024, 4, 3, 0)]
_FP8_PLAIN = [(16, 512, 8, 3, 0), (4, 1024, 4, 3, 0), (8, 512, 4, 3, 0), (8, 1024, 8, 3, 0), (32, 256, 8, 3, 0),
              (16, 1024, 8, 3, 0), (4, 2048, 8, 3, 0), (32, 512, 8, 3, 0)]
_FP8_PACKED = [(32, 512, 4, 3, 0), (64, 256, 4, 3, 0), (16, 1024, 4, 3, 0), (32, 512, 8, 3, 0), (16, 512, 4, 3, 0),
               (32, 1024, 8, 3, 0), (64, 512, 8, 3, 0), (16, 256, 4, 3, 0), (32, 512, 4, 3, 1), (16, 512, 4, 3, 1)]
FP8_GEMV = ([{**c, "DOT": 0} for c in (
    _grid(_GEMV_KEYS, _FP8_ROWS) + _variants(_FP8_PLAIN) + _variants(_FP8_PLAIN[:3], unrolls=(4,))
    + _variants(_FP8_ROWS[:2], xb=0) + _split(_FP8_SPLIT, (1,)))]
    + [{**c, "DOT": 1} for c in _grid(_GEMV_KEYS, [(32, 256, 4, 3, 1)])]
    + [{**c, "DOT": 0, "PACKED": 1}
       for c in _variants(_FP8_PACKED, xb=0) + _split(_FP8_PACKED[:2] + [(16, 512, 4, 3, 0)], (1,))]
    + [{**c, "DOT": 0} for c in _piped(_FP8_PLAIN[:3] + [(4, 512, 4, 3, 0)], xb=1)]
    + [{**c, "DOT": 0, "PACKED": 1} for c in _piped(_FP8_PACKED[:4], xb=0)])
_INT4_ROWS = [(4, 1024, 4, 2, 1), (4, 512, 4, 3, 1), (8, 1024, 8, 2, 1), (8, 512, 4, 3, 1), (16, 512, 4, 2, 1),
              (16, 1024, 4, 2, 1), (8, 128, 1, 4, 1), (16, 128, 2, 4, 1), (32, 128, 4, 3, 1), (4, 1024, 4, 3, 1),
              (4, 1024, 4, 2, 0), (8, 512, 4, 3, 0), (16, 1024, 4, 2, 0), (8, 128, 1, 4, 0)]
_INT4_PACKED = [(16, 1024, 4, 2, 0), (8, 512, 4, 3, 0), (16, 512, 4, 2, 0), (32, 512, 8, 2, 0), (8, 1024, 4, 2, 0),
                 (4, 1024, 4, 2, 0), (32, 256, 4, 2, 0), (16, 1024, 4, 2, 1), (8, 512, 4, 3, 1)]
_INT4_PACKED_MORE = [(16, 512, 4, 2, 0), (32, 512, 4, 2, 0), (16, 256, 4, 2, 0), (64, 256, 8, 2, 0), (8, 256, 2, 2, 0)]
INT4_GEMV = (_grid(_GEMV_KEYS, _INT4_ROWS) + _variants(_INT4_ROWS[-4:-1], xb=0)
             + [{**c, "PACKED": 1} for c in _variants(_INT4_PACKED, xb=0) + _variants(_INT4_PACKED_MORE, (2, 4), xb=0)
                + _split(_INT4_PACKED_MORE[:2] + [(8, 512, 4, 3, 0)], (4,))
                + _piped(_INT4_PACKED_MORE[:3] + [(16, 1024, 4, 2, 0)], xb=0)
                + [{**c, "PIPE": 3} for c in _split(_INT4_PACKED_MORE[:2], (1,))]])
_GEMM_KEYS = ("BLOCK_M", "BLOCK_N", "BLOCK_K", "SPLIT_K", "num_warps", "num_stages")
GEMM_FEW_ROWS = [{**c, "GROUP_M": 8} for c in _grid(_GEMM_KEYS, [  # 64 rows: memory-bound, few output tiles
    (64, 64, 128, 1, 4, 3), (64, 128, 64, 1, 4, 4), (32, 64, 128, 1, 4, 4), (64, 64, 128, 2, 4, 3),
    (64, 32, 128, 2, 4, 4), (16, 64, 128, 2, 4, 4), (64, 64, 64, 4, 4, 4), (64, 128, 128, 2, 8, 3)])] + [
    {"DEQUANT": 1}]  # the W4A16 GEMM only: the weight dequantized, then cuBLAS
GEMM_MANY_ROWS = [{**c, "GROUP_M": 8} for c in _grid(_GEMM_KEYS, [  # a 4K-token prefill: compute-bound
    (128, 128, 64, 1, 4, 3), (128, 128, 64, 1, 8, 3), (128, 256, 64, 1, 8, 3), (64, 128, 64, 1, 4, 4),
    (128, 128, 128, 1, 8, 3), (128, 64, 64, 1, 4, 4), (256, 128, 64, 1, 8, 3)])] + [{"DEQUANT": 1}]


def tiny_candidates(cands: list[dict]) -> list[dict]:
    """One config of each kernel kind for the CPU test (the interpreter is slow)."""
    kinds = {}
    for c in (c for c in cands if not c.get("PACKED")):  # CUDA only
        key = (c.get("DOT"), c.get("FUSE"), c.get("DEQUANT"), c.get("SPLIT_K", c.get("SPLIT", 1)) > 1, c.get("XB", 0))
        kinds.setdefault(key, []).append(c)  # (UNROLL changes nothing the CPU can see)
    return [c for group in kinds.values() for c in group[:1]]


@dataclass
class Fp8Weights:
    weight: torch.Tensor  # [N, K] e4m3
    scale: torch.Tensor  # [N, 1] fp32
    scale_row: torch.Tensor  # [N] int32
    row_scale: torch.Tensor  # [N] fp32

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.weight, self.scale, self.scale_row))


@dataclass
class Int4Weights:
    qweight: torch.Tensor  # [N, K/8]
    scales: torch.Tensor  # [N, G]
    zeros: torch.Tensor  # [N, G]

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.qweight, self.scales, self.zeros))


def fp8_weights(n: int, k: int, device, seed: int) -> Fp8Weights:
    g = torch.Generator(device=device).manual_seed(seed)
    w, scale = fp8_per_channel(torch.randn(n, k, device=device, generator=g) * 0.02)
    scale = scale.float().reshape(n, 1).contiguous()
    return Fp8Weights(w, scale, torch.arange(n, device=device, dtype=torch.int32), scale[:, 0].contiguous())


def int4_weights(n: int, k: int, group: int, device, seed: int) -> Int4Weights:
    g = torch.Generator(device=device).manual_seed(seed)
    qweight = torch.randint(-2**31, 2**31 - 1, (n, k // 8), device=device, dtype=torch.int32, generator=g)
    scales = (torch.rand(n, k // group, device=device, generator=g) * 0.002 + 0.001).half()
    zeros = torch.randint(0, 16, (n, k // group), device=device, dtype=torch.uint8, generator=g)
    return Int4Weights(qweight, scales, zeros)
