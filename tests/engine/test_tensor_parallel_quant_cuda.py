"""Tensor parallelism with quantized weights on CUDA (NCCL), the decode and prefill graphs captured on every rank:
the tiny Llama written in each layout gives on two GPUs one GPU's greedy tokens in fp32, through the quantized
GEMV and GEMM kernels, with the act-order input gather and the FP8 KV cache inside the graphs. The layouts keep
activations unquantized (W8A16, W4A16), so the ranks differ from one GPU only in the order of the sums. Needs
two GPUs; skipped with fewer."""

import pytest
import torch

from hosttune_engine import Engine, EngineConfig, SamplingParams
from hosttune_engine.checkpoint.writer import write_quantized
from hosttune_engine.core.messages import EngineRequest
from hosttune_engine.quant.spec import Layout, QuantSpec

from .oracle import prompt_ids
from .test_oracle import run

pytestmark = pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2,
                                reason="needs two CUDA GPUs")

GREEDY = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
# The tiny Llama at two ranks: 64 query rows, its one KV head's 32 rows, 128 MLP columns, 64 o_proj columns.
LAYOUTS = {
    "fp8-block-32": QuantSpec(Layout.FP8_BLOCK, block=(32, 32), ignore=("lm_head",)),
    "fp8-channel": QuantSpec(Layout.FP8_CHANNEL, ignore=("lm_head",)),
    "awq-g32": QuantSpec(Layout.AWQ, group_size=32, ignore=("lm_head",)),
    "gptq-g64-act-order": QuantSpec(Layout.GPTQ, group_size=64, desc_act=True, zero_offset=1, ignore=("lm_head",)),
}


def _generate(path, tp: int, kv_cache_dtype: str) -> dict[str, list[int]]:
    eng = Engine(EngineConfig(model=str(path), dtype="float32", device="cuda", tensor_parallel_size=tp,
                              num_kv_blocks=256, max_num_seqs=8, max_model_len=256, kv_cache_dtype=kv_cache_dtype))
    try:
        assert eng.runner.graphs is not None and eng.runner.prefill_graphs is not None
        arrivals = {0: [EngineRequest("a", prompt_ids(20, seed=1), GREEDY)],
                    1: [EngineRequest("b", prompt_ids(107, seed=2), GREEDY)],
                    4: [EngineRequest("c", prompt_ids(5, seed=3), GREEDY)]}
        return run(eng, arrivals)
    finally:
        eng.shutdown()


@pytest.mark.parametrize("kv_cache_dtype", ["auto", "fp8"])
@pytest.mark.parametrize("name", list(LAYOUTS))
def test_two_gpus_give_one_gpus_tokens_on_quantized_weights(tiny_models, tmp_path, name, kv_cache_dtype):
    folder = write_quantized(tiny_models["llama"], tmp_path / name, LAYOUTS[name], torch.bfloat16)
    two, one = _generate(folder, 2, kv_cache_dtype), _generate(folder, 1, kv_cache_dtype)
    assert two == one and all(len(t) == GREEDY.max_tokens for t in one.values())
