"""The step time budget and priority in the scheduler, with a fake cost model whose
numbers are exact (no torch): chunks are sized to the budget beside decodes, steps
without decodes keep the token budget, and priority orders admission, chunks and
preemption."""

import itertools

import pytest

from hosttune_engine.core.block_manager import BlockManager
from hosttune_engine.core.scheduler import Scheduler, SchedulerConfig
from hosttune_engine.core.sequence import Sequence
from hosttune_engine.core.step_budget import MIN_CHUNK
from hosttune_engine.core.step_cost import AUTO_DECODE_STEPS, StepCostModel
from hosttune_engine.sampling import SamplingParams

BS = 4
TENTH_MS = StepCostModel((1, 1000), (0.0001, 0.1), decode_s=0.0, prefill_s=0.0)  # 0.1 ms a token
FIRST_TOKEN = itertools.count(1, 100_000)  # every prompt its own tokens: no prefix-cache hits


def make(cost=TENTH_MS, max_step_ms=20.55, num_blocks=512, policy="priority", **kw):
    cfg = SchedulerConfig(**{"max_num_seqs": 8, "max_num_batched_tokens": 512, "max_model_len": 2048,
                             "policy": policy, "max_step_ms": max_step_ms, **kw})
    s = Scheduler(cfg, BlockManager(num_blocks, BS), eos_token_ids=[0])
    s.cost_model = cost
    return s


def seq(n, rid, max_tokens=50, priority=0):
    start = next(FIRST_TOKEN)
    return Sequence(rid, list(range(start, start + n)), SamplingParams(max_tokens=max_tokens), priority)


def step(s, token=7):
    out = s.schedule()
    s.postprocess(out, [token if m else None for m in out.sample_mask()])
    return out


def shape(out):
    return {seq.request_id: n for seq, n in zip(out.seqs, out.num_new_tokens)}


def decoding(s, *rids):
    """Running sequences past their prefill."""
    for rid in rids:
        s.add(seq(8, rid))
    step(s)
    assert all(n == 1 for n in shape(step(s)).values())


def test_the_cost_model_interpolates_and_extrapolates():
    model = StepCostModel((16, 64, 256), (0.010, 0.012, 0.030), decode_s=1e-6, prefill_s=1e-8)
    assert model.tokens_seconds(8) == 0.010  # below the first point: the floor
    assert model.tokens_seconds(40) == pytest.approx(0.011)
    assert model.tokens_seconds(512) == pytest.approx(0.030 + 0.018 / 192 * 256)
    assert model.step_seconds(64, 1000, 10_000) == pytest.approx(0.012 + 0.001 + 0.0001)
    assert model.max_chunk(0.020, 0, 0, 0, 0, 10_000) == 64 + round(0.008 / (0.018 / 192))


def test_beside_decodes_a_long_prompt_is_chunked_to_the_budget():
    s = make()
    decoding(s, "d1", "d2")
    s.add(seq(1000, "long"))
    chunks = []
    for _ in range(40):
        out = step(s)
        chunks.append(shape(out).get("long", 0))
        assert shape(out)["d1"] == shape(out)["d2"] == 1  # the decodes never wait
        if sum(chunks) >= 1000:
            break
    # 20.55 ms at 0.1 ms a token: 203 prompt tokens beside 2 decodes, every step, until the prompt is in.
    assert chunks == [203] * 4 + [188]


def test_without_decodes_the_token_budget_alone_bounds_a_step():
    s = make()
    s.add(seq(1000, "long"))
    assert shape(step(s)) == {"long": 512}


def test_earlier_context_shrinks_a_chunk():
    # 0.1 ms a token, plus 0.1 ms per 1000 (query, earlier key) pairs.
    cost = StepCostModel((1, 1000), (0.0001, 0.1), decode_s=0.0, prefill_s=1e-7)
    s = make(cost=cost, max_step_ms=40.55)
    decoding(s, "d")
    s.add(seq(2000, "long", max_tokens=2))
    sizes, context = [], 0
    for _ in range(3):
        sizes.append(shape(step(s))["long"])
        # Brute force: the most tokens n at this context that one decode leaves room for.
        assert sizes[-1] == max(n for n in range(1, 1000) if cost.step_seconds(1 + n, 0, n * context) <= 0.04055)
        context += sizes[-1]
    assert sizes[0] == 404 and sizes[0] > sizes[1] > sizes[2]


def test_decodes_that_fill_the_budget_still_let_a_prompt_progress():
    s = make(max_step_ms=0.3, max_num_seqs=8)
    decoding(s, "a", "b", "c", "d")
    s.add(seq(200, "long"))
    assert shape(step(s))["long"] == MIN_CHUNK


def test_no_cost_model_or_no_limit_keeps_the_token_budget():
    for s in (make(cost=None), make(max_step_ms=None)):
        decoding(s, "d")
        s.add(seq(300, "long"))
        assert shape(step(s))["long"] == 300


def test_a_more_important_prompt_takes_the_budget_first():
    s = make()
    decoding(s, "d")
    s.add(seq(1000, "low", priority=5))
    assert shape(step(s))["low"] == 204
    s.add(seq(1000, "high", priority=0))
    out = shape(step(s))
    assert out["high"] == 204 and "low" not in out  # the running low prefill waits its turn
    step(s)
    assert sorted(seq.request_id for seq in s.running) == ["d", "high", "low"]


def test_a_prompt_more_important_than_every_decode_takes_the_step_while_they_sit_out():
    """The budget protects the decodes at least as important as the chunk's sequence. Less important decodes
    sit out the steps of a more important prompt: beside only such decodes it takes the token budget, as it
    would alone, and they resume once it is in; a prompt no more important than them stays chunked."""
    s = make()
    for rid in ("d1", "d2"):
        s.add(seq(8, rid, priority=5))
    step(s)
    step(s)
    s.add(seq(1000, "high", priority=0))
    s.add(seq(1000, "low", priority=5))
    assert shape(step(s)) == {"high": 512}
    assert shape(step(s)) == {"high": 488, "low": 24}  # its prompt is in after two steps; low takes the rest
    assert shape(step(s)) == {"d1": 1, "d2": 1, "high": 1, "low": 202}  # low is chunked beside the decodes
    assert {q.request_id for q in s.running} == {"d1", "d2", "high", "low"} and s.num_preemptions == 0
    fcfs = make(policy="fcfs")
    decoding(fcfs, "d")
    fcfs.add(seq(1000, "first", priority=0))
    assert shape(step(fcfs)) == {"d": 1, "first": 204}  # without the priority policy every decode is protected


def test_beside_decodes_as_important_a_prompt_gets_the_share_the_others_leave():
    s = make()
    s.add(seq(8, "mine", priority=0))
    for rid in ("l1", "l2", "l3", "l4"):
        s.add(seq(8, rid, priority=5))
    step(s)
    step(s)
    s.add(seq(1000, "high", priority=0))
    out = shape(step(s))
    # The low decodes sit out; the budget still protects the high decode: 20.55 ms less its 0.1 ms.
    assert out == {"mine": 1, "high": 204}
    unbudgeted = make(max_step_ms=None)
    for rid in ("l1", "l2"):
        unbudgeted.add(seq(8, rid, priority=5))
    step(unbudgeted)
    unbudgeted.add(seq(1000, "high", priority=0))
    assert shape(step(unbudgeted)) == {"l1": 1, "l2": 1, "high": 510}  # no budget: nobody sits out


def test_a_budgeted_step_stays_within_the_largest_graph_step():
    s = make(max_step_ms=1000.0)  # room for every token
    decoding(s, "d")
    s.budgeted_tokens = 96
    s.add(seq(1000, "long"))
    assert shape(step(s)) == {"d": 1, "long": 95}
    alone = make(max_step_ms=1000.0)
    alone.budgeted_tokens = 96
    alone.add(seq(1000, "long"))
    assert shape(step(alone)) == {"long": 512}  # no decodes, no budget: the token budget alone


def test_running_prefills_go_most_important_first():
    s = make(max_step_ms=None, max_num_batched_tokens=64)
    for rid, priority in (("c", 3), ("a", 1), ("b", 2)):
        s.add(seq(100, rid, priority=priority))
    assert shape(step(s)) == {"a": 64}
    assert shape(step(s)) == {"a": 36, "b": 28}  # b before c, though c came first
    assert shape(step(s)) == {"b": 63, "a": 1}


def test_a_full_batch_preempts_the_least_important_for_an_important_arrival():
    s = make(max_num_seqs=3, max_step_ms=None)
    for rid, priority in (("p1", 1), ("p9", 9), ("p5", 5)):
        s.add(seq(8, rid, priority=priority))
    step(s)
    s.add(seq(8, "urgent", priority=0))
    out = step(s)
    assert [q.request_id for q in out.preempted] == ["p9"] and "urgent" in shape(out)
    assert "p9" not in shape(out) and [q.request_id for q in s.waiting] == ["p9"]
    s.add(seq(8, "equal", priority=5))
    out = step(s)
    assert not out.preempted and "equal" not in shape(out)  # only less important ones are preempted


def test_first_come_first_served_never_preempts_for_an_arrival():
    s = make(max_num_seqs=2, max_step_ms=None, policy="fcfs")
    s.add(seq(8, "a", priority=9))
    s.add(seq(8, "b", priority=9))
    step(s)
    s.add(seq(8, "c", priority=0))
    out = step(s)
    assert not out.preempted and "c" not in shape(out)


def test_a_full_pool_preempts_the_least_important_for_an_important_arrival():
    s = make(num_blocks=8, max_step_ms=None)  # 32 tokens of KV
    s.add(seq(12, "low", priority=7, max_tokens=10))
    s.add(seq(12, "mid", priority=3, max_tokens=10))
    step(s)
    s.add(seq(12, "high", priority=0, max_tokens=2))
    out = step(s)
    assert [q.request_id for q in out.preempted] == ["low"] and shape(out)["high"] == 12


def test_the_automatic_budget_is_two_and_a_half_decode_steps_of_the_step_s_own_decodes():
    model = StepCostModel((1, 1000), (0.0001, 0.1), decode_s=1e-6, prefill_s=0.0, decode_step_s=0.020)
    assert model.auto_budget_s(8, 0) == pytest.approx(AUTO_DECODE_STEPS * 0.020)
    assert model.auto_budget_s(8, 10_000) == pytest.approx(AUTO_DECODE_STEPS * (0.020 + 0.010))  # longer contexts, longer steps
    # Never too small for a useful chunk: 256 prompt tokens beside the decodes.
    unmeasured = StepCostModel((1, 1000), (0.0001, 0.1), 0.0, 0.0)
    assert unmeasured.auto_budget_s(8, 0) == pytest.approx((8 + 256) * 0.0001)


def test_an_automatic_budget_chunks_by_the_decodes_in_the_step():
    model = StepCostModel((1, 1000), (0.0001, 0.1), decode_s=1e-6, prefill_s=0.0,
                           decode_step_s=0.050 / AUTO_DECODE_STEPS)  # a 50 ms budget
    s = make(cost=model, max_step_ms=0.0)
    decoding(s, "d")
    s.add(seq(2000, "long", max_tokens=2))
    out = step(s)
    context = next(q.num_computed_tokens for q in out.seqs if q.request_id == "d")
    budget = model.auto_budget_s(1, context)
    want = max(n for n in range(1, 2000) if model.step_seconds(1 + n, context, 0) <= budget)
    assert abs(shape(out)["long"] - want) <= 1 and 498 <= want <= 500  # one token of float rounding at the edge


def test_steps_held_to_a_budget_carry_the_model_s_estimate():
    s = make()
    decoding(s, "d1", "d2")
    s.add(seq(1000, "long"))
    out = s.schedule()
    assert out.estimate_s == pytest.approx((2 + 203) * 0.0001)  # 20.5 ms: within the 20.55 ms budget
    s.postprocess(out, [7 if m else None for m in out.sample_mask()])
    assert step(s).estimate_s is not None
    plain = make()
    plain.add(seq(100, "alone"))
    assert plain.schedule().estimate_s is None  # no decodes: no budget, nothing to compare


def test_steps_slower_than_estimated_shrink_the_chunks_until_real_times_fit_the_budget():
    s = make(max_step_ms=20.0, num_blocks=5000, max_model_len=20_000)
    for rid in ("d1", "d2"):
        s.add(seq(8, rid, max_tokens=1000))
    step(s)
    s.add(seq(16_000, "long", max_tokens=2))
    host_s = 0.005  # what every step really costs beyond the model's estimate
    real = []
    for _ in range(80):
        out = s.schedule()
        real.append(out.estimate_s + host_s)
        s.observe_step(out, real[-1])
        s.postprocess(out, [7 if m else None for m in out.sample_mask()])
    assert real[0] == pytest.approx(0.025, abs=2e-4)  # first over the budget by the host time
    # Then the estimates leave room for it: the scale settles where estimate + host time = the budget.
    assert s.correction.scale == pytest.approx(1 / (1 - host_s / 0.020), rel=0.02)
    assert max(real[-10:]) <= 0.0203


def test_the_correction_ignores_tiny_estimates_and_is_bounded():
    from hosttune_engine.core.step_budget import CostCorrection

    c = CostCorrection()
    c.observe(1e-4, 1.0)
    assert (c.scale, c.num_steps) == (1.0, 0)
    for _ in range(200):
        c.observe(0.01, 10.0)
    assert c.scale == pytest.approx(CostCorrection.LIMITS[1])
    for _ in range(200):
        c.observe(0.01, 0.0001)
    assert c.scale == pytest.approx(CostCorrection.LIMITS[0])


def test_the_automatic_budget_is_one_figure_once_a_full_decode_step_is_measured():
    model = StepCostModel((1, 1000), (0.00001, 0.01), decode_s=1e-8, prefill_s=0.0, decode_step_s=0.001,
                          full_decode_s=0.0015)
    # Whatever the step holds: a server whose prompts queue (few, fast decodes) keeps its budget.
    assert model.auto_budget_s(2, 100) == model.auto_budget_s(64, 10_000) == pytest.approx(AUTO_DECODE_STEPS * 0.0015)
    s = make(cost=model, max_step_ms=0.0)
    decoding(s, "d")
    s.add(seq(2000, "long", max_tokens=2))
    want = max(n for n in range(1, 2000) if model.step_seconds(1 + n, 16, 0) <= AUTO_DECODE_STEPS * 0.0015)
    assert abs(shape(step(s))["long"] - want) <= 1 and 300 < want < 500
