"""RMSNorm and SwiGLU fused with the per-token FP8 quantization of the projection they feed: the kernels
against their torch references and the unfused kernels (under the Triton interpreter on CPU, fp32 and fp16;
compiled on a GPU), their wrappers' checks, and an FP8 model whose batched steps take them. On CPU
torch._scaled_mm runs too, so the whole FP8 tensor-core path runs there with its GPU checks pointed at the CPU."""

import pytest
import torch

from hosttune_engine import Engine, EngineConfig, SamplingParams
from hosttune_engine.core.sequence import Sequence
from hosttune_engine.errors import KernelInputError
from hosttune_engine.kernels.fp8_inputs import rms_norm_fp8, rms_norm_fp8_ref, swiglu_fp8, swiglu_fp8_ref
from hosttune_engine.kernels.fp8_scaled_mm import fp8_mm, quantize_per_token, supports_fp8_mm
from hosttune_engine.kernels.rmsnorm import rms_norm
from hosttune_engine.kernels.swiglu import swiglu
from hosttune_engine.core import model_runner
from hosttune_engine.layers import linear
from hosttune_engine.layers.fused import NormLinear, NormMLP
from hosttune_engine.layers.prologue import SWIGLU, NormPrologue
from hosttune_engine.planner import prepare
from hosttune_engine.plan.gpus import GpuInfo
from hosttune_engine.plan.kinds import Fusion, Kernel, Op
from hosttune_engine.quant import kernel_dispatch

from .conftest import DEVICE
from .kernel_cases import e4m3_rounding_as_on_the_gpu

pytestmark = pytest.mark.usefixtures(e4m3_rounding_as_on_the_gpu.__name__)

# The CPU as the plan's GPU: FP8 tensor cores (torch._scaled_mm runs on CPU tensors too), no tuned table.
HOPPER_STAND_IN = GpuInfo("cpu standing in for a Hopper GPU", (9, 0), present=False)
DTYPES = [torch.float32, torch.float16] if DEVICE == "cpu" else [torch.float32, torch.float16, torch.bfloat16]


def assert_e4m3_equal(got: torch.Tensor, want: torch.Tensor) -> None:
    """got == want, e4m3 values (under the interpreter with its fp32 -> e4m3 cast rounding as on the GPU)."""
    assert torch.equal(got.float(), want.float())


def _rows(m, k, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    spread = torch.logspace(-2, 1, m)[:, None]  # rows of very different magnitudes: their own scales
    return (torch.randn(m, k, generator=g) * spread).to(device=DEVICE, dtype=dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("with_residual", [False, True])
def test_rms_norm_fp8_matches_its_reference_and_the_unfused_kernels(dtype, with_residual):
    x, r = _rows(7, 96, dtype, 0), _rows(7, 96, dtype, 1) if with_residual else None  # 96: a masked block
    w = (torch.rand(96, generator=torch.Generator().manual_seed(2)) + 0.5).to(device=DEVICE, dtype=dtype)
    r_out = torch.empty_like(x) if with_residual else None
    q, s = rms_norm_fp8(x, w, 1e-6, r, r_out)
    want = rms_norm_fp8_ref(x, w, 1e-6, r)
    torch.testing.assert_close(s, want[1], rtol=1e-6 if dtype == torch.float32 else 0, atol=0)
    unfused = rms_norm(x, w, 1e-6, residual=r)
    normed = unfused[0] if with_residual else unfused
    assert_e4m3_equal(q, want[0])
    unfused_q, unfused_s = quantize_per_token(normed)  # the two kernels it replaces: the same bits
    assert torch.equal(q.view(torch.uint8), unfused_q.view(torch.uint8)) and torch.equal(s, unfused_s)
    if with_residual:
        assert torch.equal(r_out, want[2]) and torch.equal(r_out, unfused[1])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("width, block", [(200, 64), (128, 2048)])  # several blocks a row, ragged; one block
def test_swiglu_fp8_matches_its_reference_and_the_unfused_kernels(dtype, width, block):
    x = _rows(5, 2 * width, dtype, 3) * 3
    q, s = swiglu_fp8(x, block=block)
    want_q, want_s = swiglu_fp8_ref(x)
    torch.testing.assert_close(s, want_s, rtol=1e-6 if dtype == torch.float32 else 0, atol=0)
    act = swiglu(x)
    assert_e4m3_equal(q, want_q)
    unfused_q, unfused_s = quantize_per_token(act)
    assert torch.equal(q.view(torch.uint8), unfused_q.view(torch.uint8)) and torch.equal(s, unfused_s)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("width, chunk", [(200, 64), (128, 2048)])  # several parts a row, ragged; one part
def test_swiglu_fp8_in_two_passes_matches_the_one_program_a_row_form(dtype, width, chunk, monkeypatch):
    from hosttune_engine.kernels import fp8_inputs

    monkeypatch.setattr(fp8_inputs, "SPLIT_BLOCK", chunk)
    x = _rows(5, 2 * width, dtype, 4) * 3
    want_q, want_s = swiglu_fp8(x, split=False)
    for _ in range(2):  # the amax and counters are zero again after a call
        q, s = swiglu_fp8(x, split=True)
        assert torch.equal(s, want_s) and torch.equal(q.view(torch.uint8), want_q.view(torch.uint8))
    amax, counts = fp8_inputs.row_amax_state(x.device, 5)
    assert not amax.any() and not counts.any()
    q, s = swiglu_fp8(x[:3] * 10, split=True)  # fewer rows, other values: nothing left from the last call
    assert torch.equal(s, swiglu_fp8(x[:3] * 10, split=False)[1])


def test_no_rows_launch_nothing():
    x = torch.empty(0, 64, device=DEVICE)
    q, s = rms_norm_fp8(x, torch.ones(64, device=DEVICE), 1e-6)
    assert q.shape == (0, 64) and s.shape == (0, 1)
    assert swiglu_fp8(torch.empty(0, 64, device=DEVICE))[0].shape == (0, 32)
    assert swiglu_fp8(torch.empty(0, 64, device=DEVICE), split=True)[0].shape == (0, 32)


def test_wrappers_check_their_inputs():
    x, w = torch.randn(4, 64, device=DEVICE), torch.ones(64, device=DEVICE)
    with pytest.raises(KernelInputError, match="residual and residual_out go together"):
        rms_norm_fp8(x, w, 1e-6, residual=x)
    with pytest.raises(KernelInputError, match="residual has dtype"):
        rms_norm_fp8(x, w, 1e-6, x.half(), torch.empty_like(x))
    with pytest.raises(KernelInputError, match="residual_out shape"):
        rms_norm_fp8(x, w, 1e-6, x, torch.empty(4, 32, device=DEVICE))
    with pytest.raises(KernelInputError, match="weight must be"):
        rms_norm_fp8(x, torch.ones(32, device=DEVICE), 1e-6)
    with pytest.raises(KernelInputError, match="x must be contiguous in its last dim"):
        rms_norm_fp8(torch.randn(64, 4, device=DEVICE).t(), w, 1e-6)
    with pytest.raises(KernelInputError, match="must be even"):
        swiglu_fp8(torch.randn(4, 63, device=DEVICE))
    with pytest.raises(KernelInputError, match="block must be a power of two"):
        swiglu_fp8(torch.randn(4, 64, device=DEVICE), block=96)
    xq, sx = quantize_per_token(x)
    wq, ws = torch.randn(32, 64, device=DEVICE).to(torch.float8_e4m3fn), torch.ones(32, device=DEVICE)
    with pytest.raises(KernelInputError, match=r"sx must be \[4, 1\]"):
        fp8_mm(xq, sx[:2], wq, ws, None, None, False, torch.bfloat16)
    with pytest.raises(KernelInputError, match="xq has dtype"):
        fp8_mm(x, sx, wq, ws, None, None, False, torch.bfloat16)
    with pytest.raises(KernelInputError, match="out_dtype must be"):
        fp8_mm(xq, sx, wq, ws, None, None, False, torch.float32)


# The model: an FP8 model (per-channel weights quantized at load, per-token activations) with its batched
# steps on the FP8 tensor-core path, once with the norms and SwiGLU computed by the projections and once not.

@pytest.fixture
def fp8_path(monkeypatch):
    """Count the activation kernels fp8_linear launches; on CPU, let the GPU paths take CPU tensors."""
    if DEVICE == "cpu":
        monkeypatch.setattr(linear, "_on_gpu", lambda x: True)
        monkeypatch.setattr(model_runner, "present_gpu", lambda device: HOPPER_STAND_IN)
    elif not supports_fp8_mm(torch.device(DEVICE)):
        pytest.skip("FP8 tensor cores (torch._scaled_mm) need a Hopper or Ada GPU")
    calls = {}
    for name in ("rms_norm_fp8", "swiglu_fp8", "quantize_per_token", "fp8_mm"):
        def counted(*a, _fn=getattr(kernel_dispatch, name), _n=name, **k):
            calls[_n] = calls.get(_n, 0) + 1
            return _fn(*a, **k)
        monkeypatch.setattr(kernel_dispatch, name, counted)
    return calls


def _fp8_engine(tiny_models, dtype: str) -> Engine:
    return Engine(EngineConfig(model=str(tiny_models["qwen2"]), load_format="dummy", quantization="fp8",
                               kernel_backend="triton", dtype=dtype, num_kv_blocks=64, enforce_eager=True))


def _prefill_logits(eng: Engine, ids: list[int]) -> torch.Tensor:
    seq = Sequence("x", ids, SamplingParams(temperature=0))
    eng.block_manager.allocate(seq, len(ids))
    logits = eng.runner.prefill_logits(seq).cpu()
    eng.block_manager.free(seq)
    return logits


def test_the_plan_fuses_inputs_only_into_fp8_activation_layers(tiny_models, monkeypatch):
    """FP8 at load (per-token e4m3 activations): the two norms and the activation of every layer are computed
    with the quantization of the projection they feed at batched rows, by the fused modules the preparation put
    in; block-wise FP8 keeps bf16 activations."""
    monkeypatch.setattr(model_runner, "present_gpu", lambda device: HOPPER_STAND_IN)
    eng = _fp8_engine(tiny_models, "float16")
    plan, model = eng.runner.plan, eng.runner.model
    fused = {op: plan.choice(op, 24).fusion for op in (Op.QKV, Op.O, Op.GATE_UP, Op.DOWN, Op.LM_HEAD)}
    assert fused == {Op.QKV: Fusion.RMSNORM_FP8, Op.O: Fusion.NONE, Op.GATE_UP: Fusion.RMSNORM_FP8,
                     Op.DOWN: Fusion.SWIGLU_FP8, Op.LM_HEAD: Fusion.NONE}
    layer = model.model.layers[0]
    assert isinstance(layer.qkv_input, NormLinear) and isinstance(layer.norm_mlp, NormMLP)
    assert layer.qkv_input.norm is layer.input_layernorm and layer.qkv_input.proj is layer.self_attn.qkv_proj
    assert layer.self_attn.qkv_proj.kernel_plan is plan.op(Op.QKV) and layer.mlp.down_proj.kernel_plan is plan.op(
        Op.DOWN)
    names = {name for name, _ in model.named_parameters()}  # the fused modules' children keep their names
    assert "model.layers.0.input_layernorm.weight" in names and not any(".qkv_input." in n for n in names)
    block = Engine(EngineConfig(model=str(tiny_models["qwen2"]), load_format="dummy", quantization="fp8-block",
                                kernel_backend="triton", dtype="float16", num_kv_blocks=16)).runner.plan
    assert {block.choice(op, 24).fusion for op in (Op.QKV, Op.GATE_UP, Op.DOWN)} == {Fusion.NONE}
    assert block.choice(Op.QKV, 24).kernel is Kernel.W8A16_GEMM


def test_batched_rows_quantize_in_the_norm_and_swiglu_and_give_the_unfused_logits(tiny_models, fp8_path):
    """24 prompt rows through every layer: the fused kernels write the very bits the norm (or SwiGLU) and
    quantize_per_token wrote (the kernel tests above), so the GEMMs see the same inputs and the logits are
    equal, not merely close. Only o_proj, fed by attention, still quantizes on its own."""
    eng = _fp8_engine(tiny_models, "float16")
    layers = len(eng.runner.model.model.layers)
    ids = list(range(3, 27))
    fused = _prefill_logits(eng, ids)
    assert fp8_path == {"rms_norm_fp8": 2 * layers, "swiglu_fp8": layers, "quantize_per_token": layers,
                        "fp8_mm": 4 * layers}
    fp8_path.clear()
    prepare.apply_plan(eng.runner.model, eng.runner.plan.unfused())
    unfused = _prefill_logits(eng, ids)
    assert fp8_path == {"quantize_per_token": 4 * layers, "fp8_mm": 4 * layers}
    assert torch.isfinite(fused).all() and torch.equal(fused, unfused)


def test_few_rows_and_other_paths_compute_the_prologue_first(tiny_models, fp8_path, monkeypatch):
    """Two to four rows go through the GEMV, whose prologues take one row; a batch size tuned to W8A16 (or a
    GPU without FP8 tensor cores) keeps bf16 activations: both compute the layer handed over first."""
    eng = _fp8_engine(tiny_models, "float16")
    layer = eng.runner.model.model.layers[0]
    x, w = _rows(3, 128, torch.float16, 4), layer.input_layernorm.weight
    want = layer.self_attn.qkv_proj(rms_norm(x, w, 1e-6))
    torch.testing.assert_close(layer.self_attn.qkv_proj(x, prologue=NormPrologue(w, 1e-6)), want, rtol=0, atol=0)
    assert "rms_norm_fp8" not in fp8_path
    prepare.apply_plan(eng.runner.model, eng.runner.plan.with_kernel(Op.DOWN, Kernel.W8A16_GEMM))
    gate_up = _rows(8, 2 * layer.mlp.down_proj.in_features, torch.float16, 5)
    want = layer.mlp.down_proj(swiglu(gate_up))
    torch.testing.assert_close(layer.mlp.down_proj(gate_up, prologue=SWIGLU), want, rtol=0, atol=0)
    assert "swiglu_fp8" not in fp8_path and "fp8_mm" not in fp8_path


@pytest.mark.skipif(not torch.cuda.is_available(), reason="captures CUDA graphs")
def test_graphs_capture_the_fused_path_and_generate_as_the_unfused_engine(tiny_models, fp8_path, monkeypatch):
    """bf16 on the GPU with every graph captured: eight prompts prefill together (piecewise mixed-step graphs,
    cut at attention: each fused module runs inside one segment), then decode eight rows a
    step (decode graphs, past the GEMV's four). Greedy tokens equal the engine's without the transform."""
    from hosttune_engine import LLM

    from .oracle import prompt_ids

    prompts = [prompt_ids(5 + 3 * i, seed=i) for i in range(8)]
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)

    def generate() -> list[list[int]]:
        with LLM(str(tiny_models["qwen2"]), load_format="dummy", quantization="fp8", dtype="bfloat16",
                 num_kv_blocks=128) as llm:
            assert llm.engine.runner.graphs is not None and llm.engine.runner.mixed_graphs is not None
            return [list(out.token_ids) for out in llm.generate(prompts, params)]

    fused = generate()
    assert fp8_path["rms_norm_fp8"] > 0 and fp8_path["swiglu_fp8"] > 0  # launched while capturing
    apply = prepare.apply_plan
    monkeypatch.setattr(prepare, "apply_plan", lambda model, plan: apply(model, plan.unfused()))
    assert fused == generate()
