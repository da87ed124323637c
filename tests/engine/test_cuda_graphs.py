"""Decode-graph bucketing and padding (CPU): sizes, padded rows, incremental block tables, and the
padded decode path giving the same tokens as the eager path."""

import numpy as np
import pytest
import torch

from hosttune_engine import Engine, EngineConfig, SamplingParams
from hosttune_engine.core.cuda_graphs import DecodeInputs, capture_sizes, padded_size
from hosttune_engine.core.messages import EngineRequest
from hosttune_engine.core.sequence import Sequence

from .oracle import prompt_ids
from .test_oracle import run


def test_capture_sizes_cover_every_batch_up_to_the_maximum():
    sizes = capture_sizes(256)
    assert sizes[:5] == [1, 2, 4, 8, 16] and sizes[-1] == 256 and sizes == sorted(set(sizes))
    assert capture_sizes(5) == [1, 2, 4, 5] and capture_sizes(1) == [1]
    assert all(padded_size(n, sizes) >= n for n in range(1, 257))
    assert padded_size(3, sizes) == 4 and padded_size(65, sizes) == 80 and padded_size(257, sizes) is None


def _seq(rid, num_tokens, table):
    seq = Sequence(rid, list(range(100, 100 + num_tokens)), SamplingParams())
    seq.num_computed_tokens = num_tokens - 1
    seq.block_table = list(table)
    return seq


def test_fill_writes_rows_and_pads_the_rest():
    inp = DecodeInputs(capacity=8, max_blocks_per_seq=4, block_size=4, device=torch.device("cpu"))
    a, b = _seq("a", 6, [7, 3]), _seq("b", 9, [1, 2, 5])
    inp.fill([a, b], padded=4)
    inp.upload(4)
    assert inp.token_ids[:4].tolist() == [105, 108, 0, 0]
    assert inp.positions[:4].tolist() == [5, 8, 0, 0]
    assert inp.seq_lens[:4].tolist() == [6, 9, 1, 1]
    assert inp.slots[:4].tolist() == [3 * 4 + 1, 5 * 4 + 0, -1, -1]  # position 5 -> block 1 (id 3), offset 1
    assert inp.block_tables[0, :2].tolist() == [7, 3] and inp.block_tables[1, :3].tolist() == [1, 2, 5]


def test_block_table_rows_are_rewritten_only_where_they_changed():
    inp = DecodeInputs(capacity=4, max_blocks_per_seq=8, block_size=2, device=torch.device("cpu"))
    tables = inp._host_views[5]
    a, b = _seq("a", 3, [4, 5]), _seq("b", 2, [6])
    inp.fill([a, b], padded=2)
    tables[0, 0] = 99  # a cached row is not rewritten while its sequence keeps it...
    a.block_table.append(9)
    inp.fill([a, b], padded=2)
    assert tables[0, :3].tolist() == [99, 5, 9]  # ...only its new block is written
    inp.fill([b, a], padded=2)  # rows swapped: both rewritten in full
    assert tables[0, :1].tolist() == [6] and tables[1, :3].tolist() == [4, 5, 9]
    b.num_preemptions += 1  # a preempted sequence has new blocks: rewrite
    b.block_table = [8]
    tables[0, 0] = 99
    inp.fill([b, a], padded=2)
    assert tables[0, 0] == 8
    assert np.array_equal(inp._host_views[2][:2], [8 * 2 + 1, 5 * 2 + 0])  # slots: b at 1, a at 2


@pytest.mark.parametrize("model", ["llama", "qwen2"])
def test_padded_decode_path_matches_the_eager_path(tiny_models, model):
    """The buffers the CUDA graphs replay, run eagerly: same greedy tokens as the packed eager path."""
    params = SamplingParams(temperature=0, max_tokens=5, ignore_eos=True, logprobs=1)
    prompts = {"a": prompt_ids(5, seed=1), "b": prompt_ids(21, seed=2), "c": prompt_ids(3, seed=3)}
    schedule = {0: [EngineRequest(r, ids, params) for r, ids in prompts.items() if r != "c"],
                2: [EngineRequest("c", prompts["c"], params)]}
    results = []
    for padded in (False, True):
        eng = Engine(EngineConfig(model=str(tiny_models[model]), dtype="float32", block_size=4, max_num_seqs=4,
                                  num_kv_blocks=64, enable_prefix_caching=False))
        if padded:
            eng.runner.graphs = eng.runner.build_decode_graphs(use_graphs=False, max_batch=4)
        results.append(run(eng, schedule))
    assert results[0] == results[1]


def test_padded_step_logits_equal_the_packed_step(tiny_models):
    from hosttune_engine.core.scheduler import SchedulerOutput

    eng = Engine(EngineConfig(model=str(tiny_models["qwen2"]), dtype="float32", block_size=4, max_num_seqs=4,
                              num_kv_blocks=64, enable_prefix_caching=False))
    for rid, n in (("a", 9), ("b", 4), ("c", 14)):
        eng.add_request(EngineRequest(rid, prompt_ids(n, seed=n), SamplingParams(temperature=0, max_tokens=8)))
    eng.step()
    eng.step()  # every sequence now decodes
    sched = eng.scheduler.schedule()
    assert all(n == 1 for n in sched.num_new_tokens) and len(sched.seqs) == 3
    runner = eng.runner
    with torch.inference_mode():
        batch = runner._prepare(sched)
        eager = runner.model.compute_logits(runner._forward(batch)[batch.sample_rows])
        padded, tokens = runner.build_decode_graphs(use_graphs=False, max_batch=4).run(sched.seqs)  # 4 rows
    torch.testing.assert_close(padded, eager, atol=1e-4, rtol=1e-4)  # fp32; GEMMs of 4 rows vs 3
    assert tokens.tolist() == eager.argmax(-1).tolist()


def test_packed_inputs_start_at_16_byte_boundaries(tiny_models):
    """Unaligned views would make Triton compile new kernel variants mid-serving."""
    from hosttune_engine.core.step_inputs import HostPack

    pack = HostPack()
    spans = [pack.add(np.arange(n)) for n in (5, 3, 1, 8)]
    assert all(s.start % 4 == 0 for s in spans)
    flat = pack.to(torch.device("cpu"))
    assert flat[spans[1]].tolist() == [0, 1, 2] and flat[spans[3]].tolist() == list(range(8))
    inp = DecodeInputs(capacity=5, max_blocks_per_seq=3, block_size=4, device=torch.device("cpu"))
    assert inp.capacity == 8 and inp.positions.storage_offset() % 4 == 0 and inp.block_tables.storage_offset() % 4 == 0


@pytest.mark.skipif(not torch.cuda.is_available(), reason="captures CUDA graphs")
def test_garbage_found_by_the_collector_mid_capture_does_not_break_it():
    """A graph of a dead engine, say, becomes cyclic garbage while graphs are being captured, with the
    collector set to run at nearly every allocation: it must not be collected inside the capture (destroying
    a graph there invalidates the capture), and the captured graphs must replay correctly."""
    import gc

    from hosttune_engine.core.cuda_graphs import capture_per_size

    x = torch.arange(8, device="cuda", dtype=torch.float32)
    old = torch.cuda.CUDAGraph()
    with torch.cuda.graph(old):
        x.add_(0)
    box = [old]
    del old

    def step(b: int) -> torch.Tensor:
        if torch.cuda.is_current_stream_capturing() and box:
            junk = {"graph": box.pop()}
            junk["self"] = junk  # a young cycle holding the only reference to the old graph
            del junk
            [{} for _ in range(50)]  # allocations that would trigger a collection
        return x[:b] * 2 + 1

    thresholds = gc.get_threshold()
    gc.set_threshold(1, 1, 1)
    try:
        graphs, outputs = capture_per_size(step, [4, 8])
    finally:
        gc.set_threshold(*thresholds)
    gc.collect()
    x.copy_(torch.full((8,), 3.0))
    graphs[8].replay()
    graphs[4].replay()
    torch.cuda.synchronize()
    assert outputs[8].tolist() == [7.0] * 8 and outputs[4].tolist() == [7.0] * 4
