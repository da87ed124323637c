"""Greedy generation matches Hugging Face transformers token for token.

Tolerance, documented: in fp32 on CPU, our logits and transformers' differ by at
most LOGIT_ATOL (observed around 1e-5: different summation orders only).
"""

import pytest
import torch

from hosttune_engine import LLM, Engine, EngineConfig, SamplingParams
from hosttune_engine.core.messages import EngineRequest

from .oracle import hf_greedy, hf_logits, prompt_ids

LOGIT_ATOL = 1e-4
GREEDY = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
MODELS = ["llama", "qwen2"]


def engine(path, **kw) -> Engine:
    # fp32 everywhere, so on a GPU this also checks the compiled Triton kernels against the oracle.
    # A fixed pool size keeps parallel test workers on one GPU from each sizing it to the card.
    return Engine(EngineConfig(model=str(path), dtype="float32", **{"num_kv_blocks": 512, **kw}))


def run(eng: Engine, arrivals: dict[int, list[EngineRequest]], max_steps=2000) -> dict[str, list[int]]:
    """Step the engine, adding requests at the steps given; collect each request's tokens."""
    tokens: dict[str, list[int]] = {}
    for step in range(max_steps):
        for req in arrivals.get(step, []):
            eng.add_request(req)
        if not eng.has_unfinished_requests() and step > max(arrivals):
            return tokens
        for out in eng.step():
            tokens.setdefault(out.request_id, []).extend(out.new_token_ids)
    raise AssertionError("engine did not finish")


@pytest.mark.parametrize("model", MODELS)
def test_single_prompts_match_hf(tiny_models, model):
    path = tiny_models[model]
    llm = LLM(str(path), dtype="float32", num_kv_blocks=512)
    texts = ["The engine reads a prompt", "User: what is the capital of France? Assistant:", "A"]
    for text in texts:
        out = llm.generate(text, GREEDY)[0]
        want, _ = hf_greedy(path, out.prompt_token_ids, GREEDY.max_tokens)
        assert list(out.token_ids) == want, text
        assert out.finish_reason == "length"


@pytest.mark.parametrize("model", MODELS)
def test_logits_match_hf_within_tolerance(tiny_models, model):
    path = tiny_models[model]
    eng = engine(path)
    ids = prompt_ids(70, seed=1)
    # Prompt logits at every position, straight from the model runner.
    from hosttune_engine.core.sequence import Sequence

    seq = Sequence("x", ids, GREEDY)
    eng.block_manager.allocate(seq, len(ids))
    ours = eng.runner.prefill_logits(seq).cpu()
    assert (ours - hf_logits(path, ids)).abs().max().item() < LOGIT_ATOL
    eng.block_manager.free(seq)
    # Logprobs of generated tokens (top 5 alternatives) against HF's per-step logits.
    eng.add_request(EngineRequest("r", ids, SamplingParams(temperature=0, max_tokens=10, ignore_eos=True, logprobs=5)))
    lps = [lp for out in iter_outputs(eng) for lp in out.new_logprobs]
    want_ids, want_logits = hf_greedy(path, ids, 10)
    want = want_logits.log_softmax(-1)
    assert [lp.token_id for lp in lps] == want_ids
    for step, lp in enumerate(lps):
        assert abs(lp.logprob - want[step, lp.token_id].item()) < LOGIT_ATOL
        assert lp.top[0][0] == lp.token_id
        top_ids = [t for t, _ in lp.top]
        torch.testing.assert_close(torch.tensor([v for _, v in lp.top]), want[step, top_ids], atol=LOGIT_ATOL, rtol=0)


def iter_outputs(eng):
    while eng.has_unfinished_requests():
        yield from eng.step()


@pytest.mark.parametrize("model", MODELS)
def test_staggered_batch_with_chunked_prefill_matches_hf(tiny_models, model):
    """Prompts of different lengths arrive at different steps; long ones are chunked and mixed with decodes."""
    path = tiny_models[model]
    eng = engine(path, max_num_batched_tokens=32, max_num_seqs=8, block_size=16)
    lengths = [3, 17, 40, 64, 100, 16]
    prompts = {f"r{i}": prompt_ids(n, seed=10 + i) for i, n in enumerate(lengths)}
    arrivals = {0: [], 1: [], 3: [], 7: []}
    steps = [0, 0, 1, 3, 3, 7]
    for (rid, ids), step in zip(prompts.items(), steps):
        arrivals[step].append(EngineRequest(rid, ids, GREEDY))
    got = run(eng, arrivals)
    for rid, ids in prompts.items():
        assert got[rid] == hf_greedy(path, ids, GREEDY.max_tokens)[0], rid
    assert eng.block_manager.num_free_blocks == eng.block_manager.num_blocks


@pytest.mark.parametrize("model", MODELS)
def test_prefix_cache_reuses_blocks_and_matches_hf(tiny_models, model):
    path = tiny_models[model]
    eng = engine(path, block_size=16)
    prefix = prompt_ids(96, seed=7)
    a, b = prefix + prompt_ids(5, seed=8), prefix + prompt_ids(9, seed=9)
    eng.add_request(EngineRequest("a", a, GREEDY))
    eng.step()  # a's prefill fills and registers 6 full blocks
    eng.step()
    eng.add_request(EngineRequest("b", b, GREEDY))
    before = eng.stats()
    eng.step()
    seq_a, seq_b = eng.requests["a"].seq, eng.requests["b"].seq
    assert seq_b.block_table[:6] == seq_a.block_table[:6]  # shared while both run, not copied
    assert eng.block_manager.blocks[seq_a.block_table[0]].ref_count == 2
    got = run(eng, {0: []})
    stats = eng.stats()
    assert stats.prefix_cache_hits_total - before.prefix_cache_hits_total == 96
    assert stats.prefix_cache_queries_total == len(a) + len(b)
    assert seq_b.num_cached_tokens == 96
    want_a, _ = hf_greedy(path, a, GREEDY.max_tokens)
    want_b, _ = hf_greedy(path, b, GREEDY.max_tokens)
    assert eng_tokens(seq_a) == want_a and eng_tokens(seq_b) == want_b
    assert got["b"][-5:] == want_b[-5:]


def eng_tokens(seq):
    return seq.output_token_ids


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("prefix_caching", [True, False])
def test_preemption_with_small_kv_pool_matches_hf(tiny_models, model, prefix_caching):
    """4 requests of 44 tokens need 24 blocks of 8; the pool has 10, so requests are preempted."""
    path = tiny_models[model]
    eng = engine(path, block_size=8, num_kv_blocks=10, enable_prefix_caching=prefix_caching)
    prompts = {f"r{i}": prompt_ids(20, seed=30 + i) for i in range(4)}
    got = run(eng, {0: [EngineRequest(rid, ids, GREEDY) for rid, ids in prompts.items()]})
    assert eng.stats().num_preemptions_total > 0
    for rid, ids in prompts.items():
        assert got[rid] == hf_greedy(path, ids, GREEDY.max_tokens)[0], rid
    assert eng.block_manager.num_free_blocks == 10
