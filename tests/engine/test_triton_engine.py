"""The whole engine on the Triton kernels (interpreter on CPU) still matches transformers."""

import pytest

from hosttune_engine import Engine, EngineConfig, SamplingParams
from hosttune_engine.core.messages import EngineRequest

from .oracle import hf_greedy, prompt_ids
from .test_oracle import run


@pytest.mark.parametrize("model", ["llama", "qwen2"])
def test_triton_path_matches_hf(tiny_models, model):
    path = tiny_models[model]
    eng = Engine(EngineConfig(model=str(path), kernel_backend="triton", dtype="float32", block_size=16, max_num_batched_tokens=24,
                                 max_num_seqs=4, num_kv_blocks=256))
    assert eng.runner.use_triton
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    prompts = {"a": prompt_ids(5, seed=1), "b": prompt_ids(37, seed=2), "c": prompt_ids(16, seed=3)}
    got = run(eng, {0: [EngineRequest("a", prompts["a"], params), EngineRequest("b", prompts["b"], params)],
                    2: [EngineRequest("c", prompts["c"], params)]})
    for rid, ids in prompts.items():
        assert got[rid] == hf_greedy(path, ids, params.max_tokens)[0], rid


def test_one_row_gemv_path_matches_hf(tiny_models, monkeypatch, wide_gemv_tiles):
    """Batch-1 decode through the GEMV transform (norms and SwiGLU fused into the projections' prologues),
    run under the Triton interpreter by letting the path accept CPU tensors."""
    from hosttune_engine.layers import linear

    calls = {"rmsnorm": 0, "swiglu": 0}
    for name in calls:
        fn = getattr(linear, f"gemv_{name}")
        monkeypatch.setattr(linear, f"gemv_{name}", lambda *a, _fn=fn, _n=name, **k: (
            calls.__setitem__(_n, calls[_n] + 1), _fn(*a, **k))[1])
    monkeypatch.setattr(linear, "_on_gpu", lambda x: True)
    path = tiny_models["qwen2"]
    # Eager: on a GPU, CUDA graph replays would not go through the Python calls counted here.
    eng = Engine(EngineConfig(model=str(path), kernel_backend="triton", dtype="float32", num_kv_blocks=64,
                              enforce_eager=True))
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    ids = prompt_ids(9, seed=4)
    got = run(eng, {0: [EngineRequest("a", ids, params)]})
    assert got["a"] == hf_greedy(path, ids, params.max_tokens)[0]
    layers = 3
    assert calls == {"rmsnorm": 2 * layers * 3, "swiglu": layers * 3}  # 3 one-token decode steps
