"""Tensor parallelism with quantized weights on CPU (gloo): SmolLM2-135M written by the engine's writer in each
layout gives, on three ranks, one process's greedy tokens, and rank 0 holds the bytes the preflight counts.

At three ranks a rank holds 192 query rows, 64 KV rows (one of the 3 KV heads), 512 MLP columns, and 192 of
o_proj's 576 input columns: groups of 64 split whole, FP8 blocks of 128 do not (written with blocks of 64
here, and refused with 128). The act-order GPTQ checkpoint scatters each group over K, so its row-parallel
layers hold whole groups of the group-sorted columns and gather their input from every rank.
"""

import functools

import pytest
import torch

from hosttune_engine import Engine, EngineConfig, SamplingParams
from hosttune_engine.core.messages import EngineRequest
from hosttune_engine.model.model_config import ModelConfig
from hosttune_engine.parallel.checks import shard_bytes, weight_bytes

from .oracle import prompt_ids
from .quant_checkpoints import cached_pair
from .test_oracle import run

LAYOUTS = ("fp8-block-64", "fp8-channel", "fp8-tensor", "awq-g64", "gptq-g64-sym", "gptq-g64-zeros-act-order")
GREEDY = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)


@pytest.fixture(scope="session")
def quantized(smollm2):
    """name -> SmolLM2 written in that layout (cached on disk by the writer's version)."""
    return functools.cache(lambda name: cached_pair(smollm2, name)[0])


def _generate(folder, tp: int) -> tuple[dict[str, list[int]], int]:
    """Greedy tokens of two staggered requests (a prefill beside a decode), and rank 0's weight bytes."""
    eng = Engine(EngineConfig(model=str(folder), dtype="float32", device="cpu", tensor_parallel_size=tp,
                              block_size=8, num_kv_blocks=8, max_num_seqs=2, max_model_len=64))
    try:
        weights = weight_bytes(eng.runner.model)
        tokens = run(eng, {0: [EngineRequest("a", prompt_ids(9, seed=1, vocab=5000), GREEDY)],
                           1: [EngineRequest("b", prompt_ids(5, seed=2, vocab=5000), GREEDY)]})
    finally:
        eng.shutdown()
    return tokens, weights


@pytest.mark.parametrize("name", LAYOUTS)
def test_three_ranks_give_one_process_greedy_tokens(quantized, name):
    folder = quantized(name)
    one, whole = _generate(folder, 1)
    three, shard = _generate(folder, 3)
    assert three == one and all(len(t) == GREEDY.max_tokens for t in one.values())
    cfg = ModelConfig.from_folder(folder)
    assert shard == shard_bytes(cfg, 3, torch.float32, cfg.quantization)  # what the preflight counts, exactly
    assert whole / 3 < shard < whole / 3 * 1.01  # norms and per-channel scales are all a rank repeats
