"""The Triton FP8 GEMM with the scales and bias in its epilogue against its torch reference (the interpreter on
CPU: e4m3 tiles multiply exactly there, accumulating in fp32), its wrapper's checks, and an FP8 model on it."""

import pytest
import torch

from hosttune_engine.errors import KernelInputError
from hosttune_engine.kernels.fp8_gemm import fp8_gemm, fp8_gemm_ref, fp8_gemm_swiglu, fp8_gemm_swiglu_ref
from hosttune_engine.kernels.fp8_inputs import swiglu_fp8
from hosttune_engine.kernels.fp8_scaled_mm import fp8_mm, quantize_per_token
from hosttune_engine.planner import prepare
from hosttune_engine.quant import kernel_dispatch

from .conftest import DEVICE
from .test_fp8_inputs import _fp8_engine, _prefill_logits, fp8_path  # noqa: F401  (fp8_path: a fixture)


def _operands(m, n, k, seed=0):
    g = torch.Generator().manual_seed(seed)
    xq, sx = quantize_per_token((torch.randn(m, k, generator=g) * torch.rand(m, 1, generator=g)).to(DEVICE))
    w = (torch.randn(n, k, generator=g) * 50).clamp(-448, 448).to(torch.float8_e4m3fn).to(DEVICE)
    ws, bias = (torch.rand(n, generator=g) * 0.01).to(DEVICE), torch.randn(n, generator=g).to(DEVICE)
    return xq, sx, w, ws, bias


@pytest.mark.parametrize("m, n, k, cfg", [
    (37, 80, 96, {"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 32}),  # ragged M and N, K a multiple of BLOCK_K
    (5, 48, 96, {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 64}),  # one block of rows, K ragged to the tile
    (20, 64, 128, {"BLOCK_M": 32, "BLOCK_N": 32, "BLOCK_K": 32, "FAST_ACC": 1}),  # the MMA accumulating along K
])
@pytest.mark.parametrize("with_bias", [False, True])
def test_fp8_gemm_matches_its_reference(m, n, k, cfg, with_bias):
    xq, sx, w, ws, bias = _operands(m, n, k)
    bias = bias if with_bias else None
    got = fp8_gemm(xq, sx, w, ws, bias, torch.float32, cfg)
    want = fp8_gemm_ref(xq, sx, w, ws, bias, torch.float32)
    # the interpreter multiplies e4m3 tiles exactly; a GPU's FP8 MMA sums a tile's products with fewer bits
    tol = 1e-5 if DEVICE == "cpu" else 2e-3 * want.abs().max().item()
    torch.testing.assert_close(got, want, rtol=0, atol=tol)


@pytest.mark.parametrize("m, n, k, cfg", [
    (37, 40, 96, {"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 32}),  # ragged M and N (of gate and of up)
    (5, 48, 96, {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 64}),  # one block of rows, K ragged to the tile
    (20, 64, 128, {"BLOCK_M": 32, "BLOCK_N": 64, "BLOCK_K": 32, "FAST_ACC": 1}),
])
@pytest.mark.parametrize("with_bias", [False, True])
def test_fp8_gemm_swiglu_writes_what_the_gemm_then_swiglu_fp8_write(m, n, k, cfg, with_bias):
    xq, sx, w, ws, bias = _operands(m, 2 * n, k, seed=m)
    bias = bias if with_bias else None
    dtype = torch.float16 if DEVICE == "cpu" else torch.bfloat16
    for _ in range(2):  # the rows' amax is zero again after a call
        q, s = fp8_gemm_swiglu(xq, sx, w, ws, bias, dtype, cfg)
        # the unfused kernels with the same tile per output column (BLOCK_N / 2 of gate, as many of up)
        want_q, want_s = swiglu_fp8(fp8_gemm(xq, sx, w, ws, bias, dtype, {**cfg, "BLOCK_N": cfg["BLOCK_N"] // 2}))
        assert torch.equal(s, want_s) and torch.equal(q.view(torch.uint8), want_q.view(torch.uint8))
    # the unfused kernels match their references in their own tests; the rows' scales against the reference
    torch.testing.assert_close(s, fp8_gemm_swiglu_ref(xq, sx, w, ws, bias, dtype)[1], rtol=1e-2, atol=0)


def test_fp8_gemm_swiglu_checks_its_inputs():
    xq, sx, w, ws, bias = _operands(8, 48, 64)
    with pytest.raises(KernelInputError, match="an even row count, got 47"):
        fp8_gemm_swiglu(xq, sx, w[:47], ws[:47], None, torch.float32, {"BLOCK_N": 32})
    with pytest.raises(KernelInputError, match="BLOCK_N >= 32"):
        fp8_gemm_swiglu(xq, sx, w, ws, None, torch.float32, {"BLOCK_N": 16})


def test_fp8_gemm_rounds_once_where_unit_scales_round_the_products_first():
    """Against the fp32 product, the fused epilogue's one rounding to bf16 is at least as close as unit scales'
    two (the unscaled products to bf16, then the scaled values)."""
    xq, sx, w, ws, bias = _operands(24, 64, 128, seed=1)
    want = fp8_gemm_ref(xq, sx, w, ws, bias, torch.float32)
    got = fp8_gemm(xq, sx, w, ws, bias, torch.bfloat16, {"BLOCK_M": 32, "BLOCK_N": 32, "BLOCK_K": 64}).float()
    unit = fp8_mm(xq, sx, w, ws, bias.bfloat16(), None, False, torch.bfloat16).float()
    assert (got - want).norm() <= (unit - want).norm() * 1.01
    torch.testing.assert_close(got, want, rtol=2**-7, atol=1e-3)  # bf16's half ulp, and values near 0


def test_wrapper_checks_its_inputs():
    xq, sx, w, ws, bias = _operands(8, 32, 64)
    with pytest.raises(KernelInputError, match="BLOCK_N must be a power of two"):
        fp8_gemm(xq, sx, w, ws, bias, torch.float32, {"BLOCK_N": 48})
    with pytest.raises(KernelInputError, match="at least 16 wide"):
        fp8_gemm(xq, sx, w, ws, bias, torch.float32, {"BLOCK_M": 8})
    with pytest.raises(KernelInputError, match="must be contiguous"):
        fp8_gemm(xq, sx, w[:, :32], ws, bias, torch.float32)
    with pytest.raises(KernelInputError, match=r"sx must be \[8, 1\]"):
        fp8_gemm(xq, sx.t(), w, ws, bias, torch.float32)
    with pytest.raises(KernelInputError, match=r"bias must be \[32\]"):
        fp8_gemm(xq, sx, w, ws, bias[:16], torch.float32)
    with pytest.raises(KernelInputError, match="w_scale has dtype"):
        fp8_gemm(xq, sx, w, ws.half(), bias, torch.float32)


def test_a_model_on_the_triton_gemm_is_as_close_as_unit_scales(tiny_models, fp8_path, monkeypatch):  # noqa: F811
    """Batched rows with METHOD "triton": every projection runs the Triton GEMM. It rounds differently from unit
    scales (once against twice), and a value moved across an e4m3 boundary changes the next layer's input by
    an e4m3 step, so the two paths' logits are not equal; against the same model with unquantized activations
    (fp32, W8A16: no activation quantization) the Triton path is as close as unit scales are."""
    ids = list(range(3, 27))
    reference = _prefill_logits(_fp8_engine(tiny_models, "float32"), ids)
    eng = _fp8_engine(tiny_models, "float16")
    unit = _prefill_logits(eng, ids)
    calls = {}
    for name in ("fp8_gemm", "fp8_gemm_swiglu"):
        def counted(*a, _fn=getattr(kernel_dispatch, name), _n=name, **k):
            calls[_n] = calls.get(_n, 0) + 1
            return _fn(*a, **k)
        monkeypatch.setattr(kernel_dispatch, name, counted)
    model, bucket = eng.runner.model, "float16-le32"  # 24 rows

    def replan(fp8_gemm: dict) -> None:
        table = {"fp8_mm": {bucket: {"METHOD": "triton"}}, "fp8_gemm": {bucket: fp8_gemm}}
        prepare.apply_plan(model, prepare.plan_for_model(model, eng.runner.plan.gpu, table=table))

    replan({"SWIGLU": 1})
    swiglus = fp8_path.get("swiglu_fp8", 0)  # the unit-scale run's
    fused = _prefill_logits(eng, ids)
    layers = len(model.model.layers)
    # gate_up defers to down_proj's input quantization, which runs it with the SwiGLU in its epilogue
    assert calls == {"fp8_gemm": 3 * layers, "fp8_gemm_swiglu": layers} and fp8_path["swiglu_fp8"] == swiglus
    replan({})  # a config without SWIGLU: gate_up, then SwiGLU with the quantization: the same roundings
    apart = _prefill_logits(eng, ids)
    assert calls["fp8_gemm"] == 7 * layers and fp8_path["swiglu_fp8"] == swiglus + layers
    if DEVICE == "cpu":
        assert torch.equal(fused, apart)
    else:  # the fused GEMM's tiles are half as wide along N: the MMA may sum in another order
        torch.testing.assert_close(fused, apart, rtol=0, atol=2e-2 * apart.abs().max().item())

    def error(logits):
        return ((logits.float() - reference).norm() / reference.norm()).item()
    assert error(fused) <= 1.1 * error(unit) and error(unit) < 0.2
