"""Piecewise graphs for mixed steps (prefill chunks beside decodes): the model cut at its attention calls,
the padded static inputs, the buckets, and the padded path giving the logits and tokens of the packed eager
path, with and without a cached prefix. On the CPU the segments run eagerly on the static buffers; on a GPU
the same tests also replay the captured graphs."""

import numpy as np
import pytest
import torch

from hosttune_engine import Engine, EngineConfig, SamplingParams
from hosttune_engine.core.messages import EngineRequest
from hosttune_engine.core.mixed_graphs import MIXED_GRAPH_SIZES, MixedGraphs, MixedInputs, mixed_sizes
from hosttune_engine.core.scheduler import SchedulerOutput
from hosttune_engine.core.sequence import Sequence
from hosttune_engine.core.step_inputs import plan_step

from .oracle import prompt_ids
from .test_oracle import run

MODES = ["padded", "captured"] if torch.cuda.is_available() else ["padded"]
SIZES = [8, 16, 32, 64]


def test_fill_writes_the_tokens_and_pads_the_rest():
    inp = MixedInputs(capacity=14, device=torch.device("cpu"))
    assert inp.capacity == 16
    a = Sequence("a", list(range(100, 110)), SamplingParams())
    a.num_computed_tokens, a.block_table = 4, [7, 3, 9]  # a cached prefix of one block
    b = Sequence("b", [50, 51, 52], SamplingParams())
    b.num_computed_tokens, b.block_table = 2, [5]
    plan = plan_step(SchedulerOutput(seqs=[a, b], num_new_tokens=[6, 1]), block_size=4)
    inp.fill(plan, padded=12)
    inp.upload()
    assert inp.token_ids[:12].tolist() == [104, 105, 106, 107, 108, 109, 52, 0, 0, 0, 0, 0]
    assert inp.positions[:12].tolist() == [4, 5, 6, 7, 8, 9, 2, 0, 0, 0, 0, 0]
    assert inp.slots[:12].tolist() == [12, 13, 14, 15, 36, 37, 22, -1, -1, -1, -1, -1]
    assert plan.sample_rows == [5, 6]
    for view in (inp.positions, inp.slots):
        assert view.storage_offset() % 4 == 0  # 16-byte aligned: no new Triton specialization


def test_buckets_stop_at_the_step_token_budget():
    assert mixed_sizes(8192) == list(MIXED_GRAPH_SIZES) and mixed_sizes(100) == [32, 64]
    graphs = MixedGraphs.__new__(MixedGraphs)
    graphs.sizes = [32, 64]
    assert graphs.can_run(1) and graphs.can_run(64) and not graphs.can_run(65) and not graphs.can_run(0)
    assert [graphs.bucket(n) for n in (1, 32, 33, 64)] == [32, 32, 64, 64]


def test_the_segments_cover_the_layers(tiny_models):
    """Segment 0 embeds, segment k > 0 finishes layer k-1, the last ends with the final norm: chained with
    attention between them they give the whole forward (which is how `forward` itself runs)."""
    eng = _engine(tiny_models, "padded")
    model = eng.runner.model.model
    assert model.num_segments == len(model.layers) + 1
    seq = Sequence("s", prompt_ids(9, seed=3), SamplingParams())
    eng.block_manager.allocate(seq, 9)
    with torch.inference_mode():
        batch = eng.runner._prepare(SchedulerOutput(seqs=[seq], num_new_tokens=[9]))
        qkv, residual = model.segment(0, batch.input_ids, None, batch.positions, batch.meta.slot_mapping)
        assert qkv.shape == (9, model.layers[0].self_attn.qkv_proj.out_features)
        assert torch.equal(residual, model.embed_tokens(batch.input_ids))
        hidden, none = model.segment(len(model.layers), model.attention(len(model.layers) - 1, qkv, batch.meta),
                                     residual, batch.positions, batch.meta.slot_mapping)
        assert none is None and hidden.shape == (9, model.norm.weight.shape[0])


def _config(tiny_models, mode, prefix_caching=False, **kw) -> EngineConfig:
    return EngineConfig(model=str(tiny_models["qwen2"]), dtype="float32", block_size=4, max_num_seqs=4,
                        num_kv_blocks=64, enable_prefix_caching=prefix_caching, max_num_batched_tokens=64,
                        enforce_eager=mode == "eager", **kw)


def _engine(tiny_models, mode, prefix_caching=False):
    eng = Engine(_config(tiny_models, mode, prefix_caching))
    eng.runner.mixed_graphs = eng.runner.build_mixed_graphs(use_graphs=mode == "captured", sizes=SIZES)
    return eng


def _record_runs(eng) -> list[tuple[int, int]]:
    """Each mixed-graph run as (tokens, bucket)."""
    graphs, calls = eng.runner.mixed_graphs, []
    run_graphs = graphs.run

    def recorded(plan, source=None):
        calls.append((plan.num_tokens, graphs.bucket(plan.num_tokens)))
        return run_graphs(plan, source)
    graphs.run = recorded
    return calls


def _mixed_step(eng, new_prompt: list[int]) -> SchedulerOutput:
    """Two requests decoding, then a third arriving: the next step is its chunk beside two decodes."""
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    eng.add_request(EngineRequest("a", prompt_ids(9, seed=1), params))
    eng.add_request(EngineRequest("b", prompt_ids(6, seed=2), params))
    for _ in range(3):
        eng.step()
    while eng._in_flight is not None:  # collect what the engine launched, so the schedule below is the next
        eng._in_flight, last = None, eng._in_flight
        eng._collect(last)
    eng.add_request(EngineRequest("c", new_prompt, params))
    sched = eng.scheduler.schedule()
    assert sched.num_new_tokens[0] > 1 and sched.num_new_tokens[1:] == [1, 1]
    return sched


def _logits(runner, sched, mixed: bool) -> torch.Tensor:
    with torch.inference_mode():
        hidden, rows = runner._run_mixed(sched) if mixed else runner._run_eager(sched)
        return runner.model.compute_logits(hidden[rows]).clone()


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("chunk", [5, 23])  # buckets of 8 and 32 rows
def test_mixed_step_logits_equal_the_packed_step(tiny_models, mode, chunk):
    eng = _engine(tiny_models, mode)
    sched = _mixed_step(eng, prompt_ids(chunk, seed=7))
    eager = _logits(eng.runner, sched, mixed=False)
    graph = _logits(eng.runner, sched, mixed=True)
    assert graph.shape == eager.shape == (3, eng.model_config.vocab_size)
    torch.testing.assert_close(graph, eager, atol=1e-4, rtol=1e-4)  # fp32; GEMMs of padded rows vs unpadded
    assert graph.argmax(-1).tolist() == eager.argmax(-1).tolist()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="replays CUDA graphs")
def test_replayed_graphs_equal_the_same_segments_run_eagerly(tiny_models):
    """The same padded buckets, captured and not: the replay computes exactly what the capture recorded."""
    eng = _engine(tiny_models, "captured")
    sched = _mixed_step(eng, prompt_ids(23, seed=7))
    graph = _logits(eng.runner, sched, mixed=True)
    eng.runner.mixed_graphs.use_graphs = False
    assert torch.equal(graph, _logits(eng.runner, sched, mixed=True))


def _staggered(a_and_c: SamplingParams, b_and_d: SamplingParams) -> dict[int, list[EngineRequest]]:
    """Four requests arriving at steps 0, 2, 2 and 4, of 7, 30, 3 and 90 prompt tokens."""
    return {0: [EngineRequest("a", prompt_ids(7, seed=1), a_and_c)],
            2: [EngineRequest("b", prompt_ids(30, seed=2), b_and_d), EngineRequest("c", prompt_ids(3, seed=3), a_and_c)],
            4: [EngineRequest("d", prompt_ids(90, seed=4), b_and_d)]}


@pytest.mark.parametrize("mode", MODES)
def test_generation_matches_the_eager_engine(tiny_models, mode):
    """Staggered requests, so steps mix chunks (one of them filling the largest bucket) with decodes: every
    token and logprob as with no graphs at all."""
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True, logprobs=1)
    schedule = _staggered(params, params)
    eager = run(Engine(_config(tiny_models, "eager")), schedule)
    eng = _engine(tiny_models, mode)
    calls = _record_runs(eng)
    assert run(eng, schedule) == eager
    buckets = {b for _, b in calls}
    assert all(n <= b for n, b in calls) and 64 in buckets and len(buckets) >= 2


@pytest.mark.parametrize("mode", MODES)
def test_mixed_steps_launched_ahead_match_the_eager_engine(tiny_models, mode):
    """With the decode graphs' token buffer beside the mixed graphs, a step with prompt chunks is launched
    before the step before it is collected, its decodes taking that step's tokens on the device (greedy and
    seeded sampling): every token as with no graphs, where no step is launched ahead."""
    schedule = _staggered(SamplingParams(temperature=0, max_tokens=6, ignore_eos=True),
                          SamplingParams(temperature=0.8, top_p=0.9, seed=4, max_tokens=7, ignore_eos=True))
    eager = run(Engine(_config(tiny_models, "eager")), schedule)
    eng = _engine(tiny_models, mode)
    eng.runner.graphs = eng.runner.build_decode_graphs(use_graphs=mode == "captured", max_batch=4)
    fed, run_graphs = [], eng.runner.mixed_graphs.run

    def recorded(plan, source=None):
        if plan.feed is not None:
            fed.append((plan.num_tokens, int((plan.feed >= 0).sum()), len(plan.prefill)))
        return run_graphs(plan, source)
    eng.runner.mixed_graphs.run = recorded
    assert run(eng, schedule) == eager
    assert any(prefills and n_fed for _, n_fed, prefills in fed)  # a chunk beside fed decodes
    assert any(n_fed > 1 for _, n_fed, _ in fed)


@pytest.mark.parametrize("mode", MODES)
def test_a_cached_prefix_is_read_from_the_cache(tiny_models, mode):
    """The third request shares the first's first 8 tokens (two full blocks): its chunk starts at 8, beside
    the decodes of the first two."""
    eng = _engine(tiny_models, mode, prefix_caching=True)
    prompt = prompt_ids(9, seed=1)[:8] + prompt_ids(11, seed=5)  # _mixed_step's first prompt is seed 1's
    sched = _mixed_step(eng, prompt)
    assert sched.seqs[0].num_computed_tokens == 8 and sched.num_new_tokens[0] == 11
    eager = _logits(eng.runner, sched, mixed=False)
    torch.testing.assert_close(_logits(eng.runner, sched, mixed=True), eager, atol=1e-4, rtol=1e-4)


def test_padding_never_writes_the_cache(tiny_models):
    eng = _engine(tiny_models, "padded")
    before = [(layer.k_cache.clone(), layer.v_cache.clone()) for layer in _attention_layers(eng)]
    a, b = (Sequence(r, prompt_ids(n, seed=n), SamplingParams()) for r, n in (("p", 3), ("q", 5)))
    a.block_table, b.block_table = [5], [9, 2]
    b.num_computed_tokens = 4
    with torch.inference_mode():  # 3 + 1 tokens, padded to 8 rows
        eng.runner._run_mixed(SchedulerOutput(seqs=[a, b], num_new_tokens=[3, 1]))
    changed = {int(blk) for layer, (k, _) in zip(_attention_layers(eng), before)
               for blk in np.nonzero((layer.k_cache != k).flatten(1).any(1).cpu().numpy())[0]}
    assert changed == {5, 2}


def _attention_layers(eng):
    from hosttune_engine.layers.attention import Attention

    return [m for m in eng.runner.model.modules() if isinstance(m, Attention)]


def test_another_rank_replays_a_mixed_step_as_rank_zero_launches_it(tiny_models):
    """With tensor parallelism the other ranks `replay` rank 0's step message; here one runner does both
    and both write the same keys and values into the cache."""
    from hosttune_engine.core.step_message import StepKind

    eng = _engine(tiny_models, "padded")
    sched = _mixed_step(eng, prompt_ids(11, seed=6))
    layers = _attention_layers(eng)
    before = [(layer.k_cache.clone(), layer.v_cache.clone()) for layer in layers]
    eng.runner.collect(eng.runner.launch(sched))
    launched = [(layer.k_cache.clone(), layer.v_cache.clone()) for layer in layers]
    for layer, (k, v) in zip(layers, before):
        layer.k_cache.copy_(k)
        layer.v_cache.copy_(v)
    eng.runner.replay(StepKind.MIXED_GRAPH, sched, None, sample=True)
    assert all(torch.equal(layer.k_cache, k) and torch.equal(layer.v_cache, v)
               for layer, (k, v) in zip(layers, launched))
    assert any(not torch.equal(k, k0) for (k, _), (k0, _) in zip(launched, before))
