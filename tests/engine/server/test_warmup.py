"""The warmup plan as data: every compiled-path class is visited, and every request fits the engine."""

import asyncio

import pytest

from hosttune_engine.server.warmup import warm_up, warmup_plan


def _fits(plan, max_model_len, kv_tokens, vocab):
    for group in plan:
        for r in group.requests:
            n = len(r.prompt_token_ids)
            assert 1 <= n < max_model_len, (group.name, n)
            assert n + r.sampling.max_tokens <= min(max_model_len, kv_tokens), (group.name, n)
            assert all(0 <= t < vocab for t in r.prompt_token_ids)


def test_cuda_plan_for_a_7b_server():
    plan = warmup_plan(max_batch=64, max_model_len=8192, max_num_batched_tokens=8192, kv_tokens=131072,
                       vocab_size=152064, on_cuda=True)
    names = [g.name for g in plan]
    prefills = [len(g.requests[0].prompt_token_ids) for g in plan if g.name.startswith("prefill-")]
    assert {37, 512, 1500, 2048, 4001, 4096} <= set(prefills)  # each length class, multiple of 16 and not
    assert sum(n.startswith("prefix-hit-") for n in names) == len(prefills)
    assert names[-2:] == ["mixed", "decode-ramp"] and plan[-2].stagger_s > 0
    ramp = plan[-1].requests
    assert _decode_batches(ramp) == list(range(64, 0, -1))  # no graphs: every batch size decodes
    assert len(ramp[0].prompt_token_ids) > 8000  # a decode at the longest context
    _fits(plan, 8192, 131072, 152064)


def test_cuda_plan_chunks_a_long_prompt_beside_decodes_that_outlast_it():
    """Chunks of one query tile over a growing cached prefix: the split-K prefix attention of every split
    count, which traffic under a step budget reaches and a lone prefill never does."""
    plan = warmup_plan(max_batch=64, max_model_len=32768, max_num_batched_tokens=8192, kv_tokens=10**6,
                       vocab_size=152064, on_cuda=True, prefix_caching=False)
    chunked = next(g for g in plan if g.name == "chunked")
    *decodes, prompt = chunked.requests
    assert chunked.max_step_tokens == 128 and chunked.stagger_s > 0
    assert len(prompt.prompt_token_ids) > 8192
    assert len(prompt.prompt_token_ids) % 124 == 64  # chunks of 124 tokens, then one of a multiple of 16
    steps = -(-len(prompt.prompt_token_ids) // (128 - len(decodes)))
    assert all(r.sampling.max_tokens >= steps and len(r.prompt_token_ids) < 128 for r in decodes)
    small = warmup_plan(max_batch=8, max_model_len=1024, max_num_batched_tokens=8192, kv_tokens=10**6,
                        vocab_size=384, on_cuda=True)
    assert len(next(g for g in small if g.name == "chunked").requests[-1].prompt_token_ids) < 1024
    _fits(small, 1024, 10**6, 384)


class _Client:
    """The engine client as warm_up sees it: each request finishes at once; idle calls run in order."""

    def __init__(self):
        self.calls = []

    def submit(self, request, queue):
        self.calls.append(request.request_id)
        queue.put_nowait(type("Output", (), {"request_id": request.request_id, "finished": True})())

    async def when_idle(self, fn):
        return fn()


def test_warm_up_sets_a_groups_token_budget_around_it_and_skips_it_when_it_cannot():
    plan = warmup_plan(max_batch=4, max_model_len=1024, max_num_batched_tokens=8192, kv_tokens=10**6,
                       vocab_size=384, on_cuda=True)
    client = _Client()
    seconds = asyncio.run(warm_up(client, plan, limit_tokens=lambda n: client.calls.append(("limit", n))))
    assert list(seconds) == [g.name for g in plan]
    at = client.calls.index(("limit", 128))
    assert client.calls[at + 1:at + 7] == [f"warmup-chunked-decode-{i}" for i in range(4)] + \
        ["warmup-chunked", ("limit", None)]
    client = _Client()
    assert "chunked" not in asyncio.run(warm_up(client, plan))  # an engine that cannot lower its budget
    assert not any(isinstance(c, tuple) for c in client.calls)


def _decode_batches(ramp) -> list[int]:
    """The batch of each decode step, each request making its first token in its prefill."""
    batches, t = [], 1
    while n := sum(r.sampling.max_tokens > t for r in ramp):
        batches.append(n)
        t += 1
    return batches


def test_with_graphs_the_ramp_decodes_once_at_each_captured_size_and_past_them():
    """A captured graph's kernels were built at its capture; sizes past the largest graph run eagerly."""
    from hosttune_engine.core.cuda_graphs import capture_sizes

    kw = dict(max_model_len=8192, max_num_batched_tokens=8192, kv_tokens=10**6, vocab_size=152064, on_cuda=True)
    plan = warmup_plan(max_batch=256, graph_sizes=capture_sizes(256), **kw)
    assert _decode_batches(plan[-1].requests) == capture_sizes(256)[::-1]
    assert len(plan[-1].requests[1].prompt_token_ids) > 8000  # still two at the longest context
    assert len(next(g for g in plan if g.name == "mixed").requests) == 64
    plan = warmup_plan(max_batch=300, graph_sizes=capture_sizes(256), **kw)
    assert _decode_batches(plan[-1].requests) == list(range(300, 256, -1)) + capture_sizes(256)[::-1]
    _fits(plan, 8192, 10**6, 152064)


def test_without_prefix_caching_the_plan_does_not_repeat_its_prefills():
    """No cache to hit: the prefix-hit group would recompute every prompt. The prompt longer than the token
    budget still takes the paged path (its second chunk has a prefix)."""
    kw = dict(max_batch=64, max_model_len=32768, max_num_batched_tokens=8192, kv_tokens=10**6, vocab_size=152064,
              on_cuda=True)
    cached, uncached = warmup_plan(**kw), warmup_plan(**kw, prefix_caching=False)
    assert [g.name for g in uncached] == [g.name for g in cached if not g.name.startswith("prefix-hit-")]
    assert any(len(g.requests[0].prompt_token_ids) > 8192 for g in uncached if g.name.startswith("prefill-"))


@pytest.mark.parametrize("max_model_len,kv_tokens", [(1024, 10**6), (64, 10**6), (4096, 300), (16, 10**6)])
def test_small_contexts_and_pools_still_fit(max_model_len, kv_tokens):
    for on_cuda in (True, False):
        plan = warmup_plan(8, max_model_len, 8192, kv_tokens, 384, on_cuda)
        _fits(plan, max_model_len, kv_tokens, 384)


def test_cpu_plan_is_short_whatever_the_context():
    """The CPU path compiles nothing: each step kind once, on short prompts, even at 8192."""
    plan = warmup_plan(max_batch=256, max_model_len=8192, max_num_batched_tokens=8192, kv_tokens=5800,
                       vocab_size=49152, on_cuda=False)
    names = [g.name for g in plan]
    assert names == ["prefill-37", "prefix-hit-37", "mixed", "decode-ramp"]
    assert max(len(r.prompt_token_ids) for g in plan for r in g.requests) <= 64
    assert sum(len(g.requests) for g in plan) <= 10
    _fits(plan, 8192, 5800, 49152)
