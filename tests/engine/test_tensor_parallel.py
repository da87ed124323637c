"""Tensor parallelism on CPU (gloo): TP=2 and TP=4 give TP=1's greedy tokens on the tiny models.

One staggered batch covers chunked prefill (a 24-token step budget), prefix-cache hits (two requests share
a 32-token prefix) and preemption (a pool of 14 blocks of 8 for requests that need more together). The
tiny Llama has one KV head (replicated on every rank), the tiny Qwen2 two (sharded at TP=2, replicated at
TP=4). Every rank is a process of its own; the test checks none is left when the engine stops.
"""

import os

import pytest

from hosttune_engine import Engine, EngineConfig, SamplingParams
from hosttune_engine.core.messages import EngineRequest

from .oracle import prompt_ids
from .test_oracle import run

GREEDY = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
SHARED = prompt_ids(32, seed=50)


def _arrivals() -> dict[int, list[EngineRequest]]:
    prompts = {"a": SHARED + prompt_ids(5, seed=51), "b": prompt_ids(30, seed=52), "c": prompt_ids(3, seed=53),
               "d": SHARED + prompt_ids(9, seed=54)}
    return {0: [EngineRequest("a", prompts["a"], GREEDY), EngineRequest("b", prompts["b"], GREEDY)],
            3: [EngineRequest("c", prompts["c"], GREEDY)], 6: [EngineRequest("d", prompts["d"], GREEDY)]}


def _generate(path, tp: int, **kw) -> tuple[dict[str, list[int]], object]:
    eng = Engine(EngineConfig(model=str(path), dtype="float32", device="cpu", tensor_parallel_size=tp,
                              block_size=8, num_kv_blocks=14, max_num_seqs=4, max_num_batched_tokens=24,
                              max_model_len=128, **kw))
    pids = eng.workers.pids if eng.workers else []
    try:
        tokens = run(eng, _arrivals())
        stats = eng.stats()
    finally:
        eng.shutdown()
    assert all(not _alive(pid) for pid in pids), "a worker process outlived its engine"
    return tokens, stats


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.fixture(scope="module")
def tp1(tiny_models):
    return {model: _generate(tiny_models[model], 1) for model in ("llama", "qwen2")}


def test_the_batch_exercises_chunking_prefix_hits_and_preemption(tp1):
    for tokens, stats in tp1.values():
        assert stats.num_preemptions_total > 0
        assert stats.prefix_cache_hits_total > 0
        assert all(len(t) == GREEDY.max_tokens for t in tokens.values())


@pytest.mark.parametrize("tp", [2, 4])
@pytest.mark.parametrize("model", ["llama", "qwen2"])
def test_tensor_parallel_greedy_tokens_equal_one_gpu(tiny_models, tp1, model, tp):
    tokens, stats = _generate(tiny_models[model], tp)
    assert tokens == tp1[model][0]
    assert stats.num_preemptions_total == tp1[model][1].num_preemptions_total


def test_an_fp8_kv_cache_splits_across_ranks_like_the_heads(tiny_models):
    """Each rank's e4m3 cache (and its scales) holds its own KV heads: the same greedy tokens, through chunking,
    prefix hits and preemption, as one process with the whole e4m3 cache."""
    one, _ = _generate(tiny_models["qwen2"], 1, kv_cache_dtype="fp8")
    two, _ = _generate(tiny_models["qwen2"], 2, kv_cache_dtype="fp8")
    assert two == one and all(len(t) == GREEDY.max_tokens for t in one.values())
