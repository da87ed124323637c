"""Prefill graphs (one short prompt chunk a step, padded to a captured length): the padded inputs, and the
padded path giving the logits and tokens of the packed eager path, with and without a cached prefix. On the
CPU the padded step runs eagerly; on a GPU the same tests also replay the captured graphs."""

import numpy as np
import pytest
import torch

from hosttune_engine import Engine, EngineConfig, SamplingParams
from hosttune_engine.core.messages import EngineRequest
from hosttune_engine.core.prefill_graphs import PrefillGraphs, PrefillInputs
from hosttune_engine.core.scheduler import SchedulerOutput
from hosttune_engine.core.sequence import Sequence

from .oracle import prompt_ids
from .test_oracle import run

MODES = ["padded", "captured"] if torch.cuda.is_available() else ["padded"]


def test_fill_writes_the_chunk_and_pads_the_rest():
    inp = PrefillInputs(capacity=16, width=4, block_size=4, device=torch.device("cpu"))
    seq = Sequence("a", list(range(100, 110)), SamplingParams())
    seq.num_computed_tokens = 4  # a cached prefix of one block
    seq.block_table = [7, 3, 9]
    inp.fill(seq, 6, padded=8)
    inp.upload()
    assert inp.token_ids[:8].tolist() == [104, 105, 106, 107, 108, 109, 0, 0]
    assert inp.positions[:8].tolist() == [4, 5, 6, 7, 8, 9, 0, 0]
    assert inp.slots[:8].tolist() == [12, 13, 14, 15, 36, 37, -1, -1]  # block 3 then block 9
    assert inp.cu_seqlens.tolist() == [0, 6] and inp.seq_lens.tolist() == [10] and inp.sample_row.tolist() == [5]
    assert inp.block_table[0, :3].tolist() == [7, 3, 9]
    for view in (inp.positions, inp.cu_seqlens, inp.seq_lens, inp.sample_row, inp.block_table):
        assert view.storage_offset() % 4 == 0  # 16-byte aligned: no new Triton specialization


def test_only_a_lone_short_chunk_runs_on_the_graphs():
    inp = PrefillInputs(capacity=64, width=4, block_size=4, device=torch.device("cpu"))
    graphs = PrefillGraphs(None, None, inp, use_graphs=False, sizes=(16, 32, 64, 128))
    assert graphs.sizes == [16, 32, 64]  # none past the buffers' capacity
    a, b = (Sequence(r, [1] * 80, SamplingParams()) for r in "ab")
    assert graphs.can_run(SchedulerOutput(seqs=[a], num_new_tokens=[64]))
    assert not graphs.can_run(SchedulerOutput(seqs=[a], num_new_tokens=[65]))
    assert not graphs.can_run(SchedulerOutput(seqs=[a], num_new_tokens=[1]))  # decode
    assert not graphs.can_run(SchedulerOutput(seqs=[a, b], num_new_tokens=[8, 8]))


def test_a_step_budget_under_the_smallest_size_leaves_every_prefill_eager():
    inp = PrefillInputs(capacity=8, width=4, block_size=4, device=torch.device("cpu"))
    graphs = PrefillGraphs(None, None, inp, use_graphs=False)
    seq = Sequence("a", [1] * 8, SamplingParams())
    assert graphs.sizes == [] and not graphs.can_run(SchedulerOutput(seqs=[seq], num_new_tokens=[8]))


def _engine(tiny_models, mode, prefix_caching=False):
    eng = Engine(EngineConfig(model=str(tiny_models["qwen2"]), dtype="float32", block_size=4, max_num_seqs=4,
                              num_kv_blocks=64, enable_prefix_caching=prefix_caching, max_num_batched_tokens=64))
    eng.runner.prefill_graphs = eng.runner.build_prefill_graphs(use_graphs=mode == "captured")
    return eng


def _record_runs(eng) -> list[tuple[str, int, int]]:
    """Each prefill-graph run as (request, tokens already computed, chunk length)."""
    graphs, calls = eng.runner.prefill_graphs, []
    run_graph = graphs.run

    def recorded(seq, n):
        calls.append((seq.request_id, seq.num_computed_tokens, n))
        return run_graph(seq, n)
    graphs.run = recorded
    return calls


@pytest.mark.parametrize("mode", MODES)
def test_prefill_logits_equal_the_packed_step(tiny_models, mode):
    eng = _engine(tiny_models, mode)
    runner = eng.runner
    for n in (2, 5, 16, 17, 40):
        eng.add_request(EngineRequest(f"r{n}", prompt_ids(n, seed=n), SamplingParams(temperature=0, max_tokens=1)))
        sched = eng.scheduler.schedule()
        assert runner.prefill_graphs.can_run(sched)
        with torch.inference_mode():
            batch = runner._prepare(sched)
            eager = runner.model.compute_logits(runner._forward(batch)[batch.sample_rows])
            graph = runner.prefill_graphs.run(sched.seqs[0], sched.num_new_tokens[0]).clone()
        torch.testing.assert_close(graph, eager, atol=1e-4, rtol=1e-4)
        eng.abort_request(f"r{n}")


@pytest.mark.parametrize("mode", MODES)
def test_generation_matches_the_eager_engine(tiny_models, mode):
    """Whole requests, one after another and then together: the first token of each lone prompt comes from
    the prefill graphs, the rest as before; every token and logprob as with no prefill graphs."""
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True, logprobs=1)
    prompts = {"a": prompt_ids(7, seed=1), "b": prompt_ids(30, seed=2), "c": prompt_ids(3, seed=3)}
    schedule = {0: [EngineRequest("a", prompts["a"], params)], 6: [EngineRequest("b", prompts["b"], params)],
                12: [EngineRequest("c", prompts["c"], params)]}
    eager = run(Engine(EngineConfig(model=str(tiny_models["qwen2"]), dtype="float32", block_size=4, max_num_seqs=4,
                                    num_kv_blocks=64, enable_prefix_caching=False, max_num_batched_tokens=64)),
                schedule)
    eng = _engine(tiny_models, mode)
    calls = _record_runs(eng)
    assert run(eng, schedule) == eager
    assert calls == [("a", 0, 7), ("b", 0, 30), ("c", 0, 3)]


@pytest.mark.parametrize("mode", MODES)
def test_a_cached_prefix_is_read_from_the_cache(tiny_models, mode):
    """The second request shares the first's first 8 tokens (two full blocks): its chunk starts at 8."""
    shared = prompt_ids(8, seed=9)
    params = SamplingParams(temperature=0, max_tokens=3, ignore_eos=True)
    schedule = {0: [EngineRequest("a", shared + prompt_ids(5, seed=4), params)],
                5: [EngineRequest("b", shared + prompt_ids(9, seed=5), params)]}
    eng = _engine(tiny_models, mode, prefix_caching=True)
    calls = _record_runs(eng)
    with_graphs = run(eng, schedule)
    assert calls == [("a", 0, 13), ("b", 8, 9)]
    eager = run(Engine(EngineConfig(model=str(tiny_models["qwen2"]), dtype="float32", block_size=4, max_num_seqs=4,
                                    num_kv_blocks=64, enable_prefix_caching=True, max_num_batched_tokens=64)),
                schedule)
    assert with_graphs == eager


def test_padding_never_writes_the_cache(tiny_models):
    eng = _engine(tiny_models, "padded")
    before = [(layer.k_cache.clone(), layer.v_cache.clone()) for layer in _attention_layers(eng)]
    seq = Sequence("p", prompt_ids(3, seed=1), SamplingParams())
    seq.block_table = [5]
    with torch.inference_mode():
        eng.runner.prefill_graphs.run(seq, 3)  # padded to 16 rows
    changed = {int(b) for layer, (k, _) in zip(_attention_layers(eng), before)
               for b in np.nonzero((layer.k_cache != k).flatten(1).any(1).cpu().numpy())[0]}
    assert changed == {5}


def _attention_layers(eng):
    from hosttune_engine.layers.attention import Attention

    return [m for m in eng.runner.model.modules() if isinstance(m, Attention)]
