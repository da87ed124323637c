"""The engine on quantized weights through the Triton kernels (the interpreter on CPU): GEMMs for
prefill, GEMVs for one-token decode (the norms and SwiGLU in their prologues), and dummy
weights quantized by the checkpoint writer's code."""

import pytest
import torch

from hosttune_engine import Engine, EngineConfig, SamplingParams
from hosttune_engine.core.messages import EngineRequest
from hosttune_engine.core.sequence import Sequence
from hosttune_engine.layers import linear
from hosttune_engine.quant import kernel_dispatch
from hosttune_engine.quant.fp8_linear import Fp8Linear
from hosttune_engine.quant.int4_linear import Int4Linear

from .oracle import hf_greedy, hf_logits, prompt_ids
from .quant_checkpoints import write
from .quant_reference import dequantize_folder
from .test_oracle import run

LAYOUTS = ["fp8-block", "fp8-channel", "awq-g64", "gptq-g64-zeros-act-order"]


@pytest.fixture
def kernels_on_cpu(monkeypatch, wide_gemv_tiles):
    """Count the quantized kernels' launches, and let the GPU paths take CPU tensors (the GEMVs on wide tiles
    under the interpreter)."""
    calls = {}
    for name in ("fp8_gemv", "w8a16_gemm", "int4_gemv", "w4a16_gemm"):
        fn = getattr(kernel_dispatch, name)
        def counted(*a, _fn=fn, _n=name, **k):
            key = f"{_n} prologue {k['prologue']}" if k.get("prologue") else _n
            calls[key] = calls.get(key, 0) + 1
            return _fn(*a, **k)
        monkeypatch.setattr(kernel_dispatch, name, counted)
    monkeypatch.setattr(linear, "_on_gpu", lambda x: True)
    return calls


def _triton_engine(folder) -> Engine:
    eng = Engine(EngineConfig(model=str(folder), kernel_backend="triton", dtype="float32", num_kv_blocks=64,
                              enforce_eager=True))
    return eng


def _prefill_logits(eng: Engine, ids) -> torch.Tensor:
    seq = Sequence("x", ids, SamplingParams(temperature=0))
    eng.block_manager.allocate(seq, len(ids))
    logits = eng.runner.prefill_logits(seq).cpu()
    eng.block_manager.free(seq)
    return logits


@pytest.mark.parametrize("name", LAYOUTS)
def test_kernel_path_matches_transformers_on_the_dequantized_weights(tiny_models, tmp_path, kernels_on_cpu, name):
    quantized = write(tiny_models["llama"], tmp_path / "q", name)
    plain = dequantize_folder(quantized, tmp_path / "plain")
    eng = _triton_engine(quantized)
    ids = prompt_ids(24, seed=5)
    torch.testing.assert_close(_prefill_logits(eng, ids), hf_logits(plain, ids), atol=1e-3, rtol=0)
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    assert run(eng, {0: [EngineRequest("a", ids, params)]})["a"] == hf_greedy(plain, ids, 4)[0]
    gemm, gemv = ("w8a16_gemm", "fp8_gemv") if name.startswith("fp8") else ("w4a16_gemm", "int4_gemv")
    assert kernels_on_cpu[gemm] > 0 and kernels_on_cpu[gemv] > 0
    # decode: RMSNorm (with the residual) and SwiGLU in the GEMV's prologue
    assert {f"{gemv} prologue 2", f"{gemv} prologue 3"} <= set(kernels_on_cpu)


@pytest.mark.parametrize("quantization, cls, error", [("fp8", Fp8Linear, 0.04), ("fp8-block", Fp8Linear, 0.04),
                                                      ("awq", Int4Linear, 0.15), ("gptq", Int4Linear, 0.15)])
def test_dummy_weights_quantized_in_each_layout(tiny_models, quantization, cls, error):
    """The same random weights as plain dummy weights, quantized: each layer dequantizes to them within the
    layout's rounding error (relative Frobenius norm)."""
    options = dict(model=str(tiny_models["llama"]), load_format="dummy", dtype="float32", num_kv_blocks=32)
    eng = Engine(EngineConfig(quantization=quantization, **options))
    plain = Engine(EngineConfig(**options)).runner.model.model.layers[0]
    layer = eng.runner.model.model.layers[0]
    for got, want in ((layer.self_attn.qkv_proj, plain.self_attn.qkv_proj), (layer.mlp.down_proj, plain.mlp.down_proj)):
        assert isinstance(got, cls)
        w = got.dequantized(torch.float32)
        assert 0 < (w - want.weight).norm() / want.weight.norm() < error
    out = run(eng, {0: [EngineRequest("a", prompt_ids(8, seed=1), SamplingParams(temperature=0, max_tokens=3,
                                                                                    ignore_eos=True))]})
    assert len(out["a"]) == 3


def test_teacher_forcing_one_row_at_a_time_equals_the_prefill(tiny_models, tmp_path, kernels_on_cpu):
    """The GPU accuracy test's one-row pass (every position through the GEMVs), checked on the interpreter."""
    from .test_quant_accuracy import teacher_forced_one_row

    eng = _triton_engine(write(tiny_models["llama"], tmp_path / "q", "fp8-block"))
    ids = prompt_ids(6, seed=6)
    prefill = _prefill_logits(eng, ids)
    calls = kernels_on_cpu.get("fp8_gemv prologue 2", 0)
    torch.testing.assert_close(teacher_forced_one_row(eng, ids), prefill, atol=1e-3, rtol=0)
    assert kernels_on_cpu["fp8_gemv prologue 2"] > calls


def test_serve_takes_the_quantization_option(tiny_models):
    from hosttune_engine.server.cli import _parser, config_from_args

    args = _parser().parse_args(["serve", "--model", str(tiny_models["llama"]), "--quantization", "fp8"])
    assert config_from_args(args).engine.quantization == "fp8"
    args = _parser().parse_args(["serve", "--model", str(tiny_models["llama"])])
    assert config_from_args(args).engine.quantization is None
    with pytest.raises(SystemExit):
        _parser().parse_args(["serve", "--model", "m", "--quantization", "int3"])


@pytest.mark.parametrize("name", ["fp8-channel", "awq-g64"])
def test_prefix_caching_and_graphs_keep_working(tiny_models, tmp_path, name):
    """Two prompts sharing a prefix, one after the other: the second reuses the cached blocks, and both
    continue as transformers does on the dequantized weights (on a GPU: decode and prefill graphs, kernels)."""
    from hosttune_engine import LLM

    quantized = write(tiny_models["llama"], tmp_path / "q", name)
    plain = dequantize_folder(quantized, tmp_path / "plain")
    llm = LLM(str(quantized), dtype="float32", num_kv_blocks=128, enable_prefix_caching=True)
    shared = prompt_ids(40, seed=7)
    params = SamplingParams(temperature=0, max_tokens=5, ignore_eos=True)
    for i, tail in enumerate((prompt_ids(5, seed=8), prompt_ids(7, seed=9))):
        out = llm.generate([shared + tail], params)[0]
        assert list(out.token_ids) == hf_greedy(plain, shared + tail, 5)[0]
        assert out.num_cached_tokens >= (32 if i else 0)


def test_quantized_build_keeps_no_plain_projection_weights(tiny_models, tmp_path):
    """The model is built on the meta device and its projections swapped for quantized layers before anything
    else takes memory: the model keeps only the quantized layers, and tied embeddings stay tied."""
    from functools import partial

    from hosttune_engine.model import loader
    from hosttune_engine.model.model_config import ModelConfig
    from hosttune_engine.quant.transform import apply_quantization

    cfg = ModelConfig.from_folder(write(tiny_models["qwen2"], tmp_path / "q", "fp8-channel"))
    quantize = partial(apply_quantization, spec=cfg.quantization, dtype=torch.float32)
    model = loader.build_model(cfg, torch.device("cpu"), torch.float32, quantize=quantize)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    plain = {n for n, p in model.named_parameters() if p.dim() == 2}
    assert plain == {"model.embed_tokens.weight"}
    assert all(t.device.type == "cpu" for t in [*model.parameters(), *model.buffers()])
    assert all(isinstance(m.self_attn.qkv_proj, Fp8Linear) for m in model.model.layers)
