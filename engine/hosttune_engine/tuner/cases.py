"""What a sweep times: one kernel on one projection shape (or the attention of one batch), called as the
engine calls it (a GEMV with the RMSNorm or SwiGLU the decode step fuses into it), on several copies of random
weights, beside the torch reference output every candidate must match."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from hosttune_engine.kernels.decode_attention import choose_num_splits, decode_attention, decode_attention_ref
from hosttune_engine.kernels.dequant_gemm import w4a16_gemm, w8a16_gemm
from hosttune_engine.kernels.fp8_gemm import fp8_gemm, fp8_gemm_ref
from hosttune_engine.kernels.fp8_gemv import fp8_gemv, fp8_gemv_ref
from hosttune_engine.kernels.fp8_scaled_mm import fp8_scaled_mm, quantize_per_token
from hosttune_engine.kernels.gemv import (PLAIN, RMSNORM_RESIDUAL, SWIGLU, gemv, gemv_ref, gemv_rmsnorm,
                                          gemv_rmsnorm_ref, gemv_swiglu, gemv_swiglu_ref)
from hosttune_engine.kernels.int4_gemv import int4_gemv, int4_gemv_ref
from hosttune_engine.kernels.kv_quant import kv_quantize_ref
from hosttune_engine.layers.prologue import SWIGLU as SWIGLU_PROLOGUE
from hosttune_engine.layers.prologue import NormPrologue
from hosttune_engine.plan.kinds import Op
from hosttune_engine.quant.kernel_dispatch import gemv_one_row
from hosttune_engine.tuner.timing import Timer
from hosttune_engine.tuner.weights import fp8_weights, int4_weights

GROUP = 128  # 4-bit weights: input columns per scale (AWQ's and GPTQ's usual groups)
PROLOGUE = {Op.QKV: RMSNORM_RESIDUAL, Op.GATE_UP: RMSNORM_RESIDUAL, Op.DOWN: SWIGLU}


@dataclass(frozen=True)
class Case:
    """call(cfg, i): a zero-argument call on weight copy i (None where the config does not apply)."""

    name: str
    call: Callable[[dict, int], Callable[[], torch.Tensor] | None]
    want: torch.Tensor
    copies: int


@dataclass(frozen=True)
class Shape:
    op: Op
    n: int
    k: int

    @property
    def name(self) -> str:
        return f"{self.op.value} {self.n}x{self.k}"


def _rows(m: int, k: int, dtype, device, seed: int) -> torch.Tensor:
    g = torch.Generator(device=device).manual_seed(seed)
    return torch.randn(m, k, device=device, generator=g).to(dtype)


def _prologue_inputs(shape: Shape, dtype, device) -> dict:
    """The raw inputs of the GEMV's prologue, as the decode step hands them over."""
    prologue = PROLOGUE.get(shape.op, PLAIN)
    if prologue == SWIGLU:
        return {"x": _rows(1, 2 * shape.k, dtype, device, 1), "prologue": prologue}
    inputs = {"x": _rows(1, shape.k, dtype, device, 1), "prologue": prologue}
    if prologue == RMSNORM_RESIDUAL:
        inputs.update(residual=_rows(1, shape.k, dtype, device, 2), eps=1e-6,
                      norm_weight=(torch.rand(shape.k, device=device) + 0.5).to(dtype),
                      residual_out=torch.empty(1, shape.k, device=device, dtype=dtype))
    return inputs


def _prologue(inputs: dict):
    """The layer the GEMV computes on its input, as the decode step's fused module hands it over."""
    if inputs["prologue"] == SWIGLU:
        return SWIGLU_PROLOGUE
    if inputs["prologue"] == RMSNORM_RESIDUAL:
        return NormPrologue(inputs["norm_weight"], 1e-6, inputs["residual"], inputs["residual_out"])
    return None


def _ref_kwargs(inputs: dict) -> dict:
    extra = {k: v for k, v in inputs.items() if k != "x"}
    if "residual_out" in extra:
        extra["residual_out"] = torch.empty_like(inputs["x"])
    return extra


def bf16_gemv(shape: Shape, dtype, timer: Timer) -> Case:
    """The plain GEMV with its prologue (the LM head: fp32 logits)."""
    device = timer.device
    inputs = _prologue_inputs(shape, dtype, device)
    ws = [_rows(shape.n, shape.k, dtype, device, 10 + i) * 0.02 for i in range(timer.copies(shape.n * shape.k * 2))]
    x, out = inputs["x"], torch.float32 if shape.op is Op.LM_HEAD else None

    def call(cfg, i):
        if inputs["prologue"] == SWIGLU:
            return lambda: gemv_swiglu(x, ws[i], config=cfg)
        if inputs["prologue"] == RMSNORM_RESIDUAL:
            return lambda: gemv_rmsnorm(x, inputs["norm_weight"], 1e-6, ws[i], None, inputs["residual"],
                                        inputs["residual_out"], config=cfg)
        return lambda: gemv(x, ws[i], out_dtype=out, config=cfg)
    if inputs["prologue"] == SWIGLU:
        want = gemv_swiglu_ref(x, ws[0])
    elif inputs["prologue"] == RMSNORM_RESIDUAL:
        want = gemv_rmsnorm_ref(x, inputs["norm_weight"], 1e-6, ws[0], None, inputs["residual"], torch.empty_like(x))
    else:
        want = gemv_ref(x, ws[0], out_dtype=out)
    return Case(shape.name, call, want, len(ws))


def quant_gemv(kind: str, shape: Shape, dtype, timer: Timer) -> Case:
    """The FP8 or 4-bit GEMV at one row, with the prologue the decode step hands it."""
    inputs = _prologue_inputs(shape, dtype, timer.device)
    ws, args, fn, ref = _quant_weights(kind, shape, timer)
    want = ref(inputs["x"], *args(ws[0]), **_ref_kwargs(inputs))
    x, prologue = inputs["x"], _prologue(inputs)
    return Case(shape.name, lambda cfg, i: (lambda: gemv_one_row(fn, cfg, args(ws[i]), x, prologue)), want, len(ws))


def _quant_weights(kind: str, shape: Shape, timer: Timer, most: int = 24):
    """(weight copies, their kernel arguments, the GEMV, its reference) for "fp8" or "int4"."""
    if kind == "fp8":
        make = lambda s: fp8_weights(shape.n, shape.k, timer.device, s)  # noqa: E731
        args = lambda w: (w.weight, w.scale, w.scale_row, shape.k, None)  # noqa: E731
        fn, ref = fp8_gemv, fp8_gemv_ref
    else:
        make = lambda s: int4_weights(shape.n, shape.k, GROUP, timer.device, s)  # noqa: E731
        args = lambda w: (w.qweight, w.scales, w.zeros, None, GROUP, None)  # noqa: E731
        fn, ref = int4_gemv, int4_gemv_ref
    first = make(0)
    return [first] + [make(s) for s in range(1, min(most, timer.copies(first.nbytes)))], args, fn, ref


def gemm(kind: str, shape: Shape, m: int, dtype, timer: Timer) -> Case:
    """The W8A16 ("fp8") or W4A16 ("int4") GEMM at m rows."""
    x = _rows(m, shape.k, dtype, timer.device, 3)
    ws, args, _, ref = _quant_weights(kind, shape, timer, 24 if m <= 128 else 2)
    fn = w8a16_gemm if kind == "fp8" else w4a16_gemm
    return Case(f"{shape.name} m={m}", lambda cfg, i: (lambda: fn(x, *args(ws[i]), config=cfg)),
                ref(x, *args(ws[0])), len(ws))


def fp8_tensor_cores(shape: Shape, m: int, dtype, timer: Timer) -> tuple[Case, Case]:
    """FP8 activations at m rows: (the Triton FP8 GEMM, whose configs are swept; torch._scaled_mm, whose
    "config" is its METHOD, unit or rowwise), both quantizing x per token first."""
    x = _rows(m, shape.k, dtype, timer.device, 3)
    ws = _quant_weights("fp8", shape, timer, 24 if m <= 128 else 2)[0]
    unit = torch.ones((), device=timer.device)

    def triton(cfg, i):
        def run():
            xq, sx = quantize_per_token(x)
            return fp8_gemm(xq, sx, ws[i].weight, ws[i].row_scale, None, dtype, cfg)
        return run

    def scaled_mm(cfg, i):
        return lambda: fp8_scaled_mm(x, ws[i].weight, ws[i].row_scale, None, unit, rowwise=cfg["METHOD"] == "rowwise")
    xq, sx = quantize_per_token(x)  # both quantize x so: the reference takes the same e4m3 rows
    want = fp8_gemm_ref(xq, sx, ws[0].weight, ws[0].row_scale, None, dtype)
    name = f"{shape.name} m={m}"
    return Case(name, triton, want, len(ws)), Case(name, scaled_mm, want, len(ws))


def attention(batch: int, context: int, heads: int, kv_heads: int, head_dim: int, page: int, dtype,
              timer: Timer, fp8_kv: bool = False) -> Case:
    """Paged decode attention of `batch` rows over `context` tokens each, over disjoint random blocks; with fp8_kv
    the cache in e4m3 with its row scales, as `kv_cache_dtype="fp8"` keeps it."""
    device, per_call = timer.device, batch * (-(-context // page))
    copies = timer.copies(2 * per_call * page * kv_heads * (head_dim + (4 if fp8_kv else head_dim)))
    kc = torch.randn(per_call * copies, page, kv_heads, head_dim, device=device).to(dtype)
    vc = torch.randn_like(kc)
    scales = None
    if fp8_kv:
        (kc, k_scale), (vc, v_scale) = kv_quantize_ref(kc), kv_quantize_ref(vc)
        scales = (k_scale, v_scale)
    tables = torch.randperm(per_call * copies, device=device).to(torch.int32).view(copies, batch, -1)
    q = torch.randn(batch, heads, head_dim, device=device).to(dtype)
    lens = torch.full((batch,), context, dtype=torch.int32, device=device)
    sms = torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 132
    splits = choose_num_splits(batch, kv_heads, context, sms)
    want = decode_attention_ref(q, kc, vc, tables[0], lens, splits, kv_scales=scales)
    return Case(f"attention b{batch} ctx {context}" + (" e4m3 cache" if fp8_kv else ""),
                lambda cfg, i: (lambda: decode_attention(q, kc, vc, tables[i], lens, num_splits=splits, config=cfg,
                                                         kv_scales=scales)),
                want, copies)
