"""Scheduler: continuous batching, chunked prefill, batch limit, preemption, priority.

Runs the scheduler against the block manager with a fake "model" that emits
token ids; no torch.
"""

import time

from hosttune_engine.core.block_manager import BlockManager
from hosttune_engine.core.scheduler import Scheduler, SchedulerConfig
from hosttune_engine.core.sequence import Sequence, SequenceStatus
from hosttune_engine.sampling import SamplingParams

BS = 4


def make(num_blocks=64, **kw):
    cfg = SchedulerConfig(**{"max_num_seqs": 8, "max_num_batched_tokens": 64, "max_model_len": 256, **kw})
    return Scheduler(cfg, BlockManager(num_blocks, BS), eos_token_ids=[0])


def seq(n, rid, max_tokens=4, priority=0, start=1):
    return Sequence(rid, list(range(start, start + n)), SamplingParams(max_tokens=max_tokens), priority)


def step(s, token=7):
    out = s.schedule()
    mask = out.sample_mask()
    s.postprocess(out, [token if m else None for m in mask])
    return out


def run_to_end(s, max_steps=1000):
    outs = []
    for _ in range(max_steps):
        if not s.has_unfinished():
            return outs
        outs.append(step(s))
    raise AssertionError("did not finish")


def test_prefill_then_decode_until_max_tokens():
    s = make()
    a = seq(10, "a", max_tokens=3)
    s.add(a)
    out = step(s)
    assert out.num_new_tokens == [10]
    assert a.output_token_ids == [7]
    out = step(s)
    assert out.num_new_tokens == [1]
    step(s)
    assert a.is_finished and a.finish_reason == "length" and a.output_token_ids == [7, 7, 7]
    assert s.block_manager.num_free_blocks == 64


def test_chunked_prefill_respects_token_budget_and_batches_decodes_first():
    s = make(max_num_batched_tokens=16)
    b = seq(3, "b", max_tokens=5)  # arrives first
    a = seq(40, "a", max_tokens=2)
    s.add(b)
    s.add(a)
    step(s)  # b prefilled (3 tokens); a gets a 13-token chunk
    assert a.num_computed_tokens == 13 and a.num_output_tokens == 0
    out = step(s)
    assert out.num_tokens <= 16
    assert out.seqs[0] is a and out.num_new_tokens[0] > 1  # prefill chunks first
    assert out.seqs[-1] is b and out.num_new_tokens[-1] == 1
    run_to_end(s)
    assert a.output_token_ids == [7, 7] and b.num_output_tokens == 5


def test_hard_max_batch_size():
    s = make(max_num_seqs=3)
    for i in range(5):
        s.add(seq(4, f"r{i}", max_tokens=10, start=10 * i + 1))
    for _ in range(5):
        out = step(s)
        assert len(out.seqs) <= 3 and s.num_running <= 3
    assert s.num_waiting == 2


def test_eos_and_stop_tokens_finish():
    s = make()
    a = seq(4, "a", max_tokens=10)
    s.add(a)
    s.postprocess(s.schedule(), [0])  # eos: no stop_reason, as vLLM answers (the model ended it, not the request)
    assert a.finish_reason == "stop" and a.stop_reason is None
    b = Sequence("b", [1, 2], SamplingParams(max_tokens=10, stop_token_ids=[9]))
    s.add(b)
    s.postprocess(s.schedule(), [9])
    assert b.finish_reason == "stop" and b.output_token_ids == [9] and b.stop_reason == 9
    c = Sequence("c", [1, 2], SamplingParams(max_tokens=10, ignore_eos=True))
    s.add(c)
    s.postprocess(s.schedule(), [0])
    assert not c.is_finished


def test_eos_named_in_stop_token_ids_still_ends_with_no_stop_reason_unless_eos_is_ignored():
    # vLLM checks EOS before the request's stop tokens: a client that lists EOS among them still gets null
    s = make()
    a = Sequence("a", [1, 2], SamplingParams(max_tokens=10, stop_token_ids=[9, 0]))
    b = Sequence("b", [1, 2], SamplingParams(max_tokens=10, stop_token_ids=[9, 0], ignore_eos=True))
    s.add(a)
    s.add(b)
    s.postprocess(s.schedule(), [0, 0])
    assert (a.finish_reason, a.stop_reason) == ("stop", None) and (b.finish_reason, b.stop_reason) == ("stop", 0)


def test_the_models_other_end_tokens_stop_with_their_id_unless_eos_is_ignored():
    # vLLM merges generation_config's end tokens, all but the tokenizer's EOS, into the request's stop_token_ids
    s = Scheduler(SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=64, max_model_len=256),
                  BlockManager(64, BS), eos_token_ids=[0], eos_stop_token_ids=[5])
    a, b = seq(4, "a", max_tokens=10), Sequence("b", [1, 2], SamplingParams(max_tokens=10, ignore_eos=True))
    s.add(a)
    s.add(b)
    s.postprocess(s.schedule(), [5, 5])
    assert (a.finish_reason, a.stop_reason, a.output_token_ids) == ("stop", 5, [5]) and not b.is_finished


def test_max_model_len_stops_with_length():
    s = make(max_model_len=6)
    a = seq(4, "a", max_tokens=100)
    s.add(a)
    run_to_end(s)
    assert a.num_tokens == 6 and a.finish_reason == "length"


def test_preemption_frees_blocks_and_everything_finishes():
    s = make(num_blocks=6)  # 24 token slots for 3 sequences of 14 tokens
    seqs = [seq(6, f"r{i}", max_tokens=8, start=100 * i + 1) for i in range(3)]
    for x in seqs:
        s.add(x)
    run_to_end(s)
    assert s.num_preemptions > 0
    assert all(x.is_finished and x.num_output_tokens == 8 for x in seqs)
    assert any(x.num_preemptions for x in seqs)
    assert s.block_manager.num_free_blocks == 6


def test_fcfs_preempts_the_latest_arrival():
    s = make(num_blocks=4)
    a, b = seq(7, "a", max_tokens=8), seq(7, "b", max_tokens=8, start=50)
    s.add(a)
    s.add(b)
    step(s)  # both prefilled: 7 tokens in 2 blocks each, pool full
    step(s)  # the 8th token still fits
    step(s)  # a's 9th token needs a third block: b is preempted
    assert b.status is SequenceStatus.WAITING and b.num_preemptions == 1
    assert a.status is SequenceStatus.RUNNING and a.num_preemptions == 0


def test_priority_orders_waiting_and_picks_victims():
    s = make(num_blocks=4, policy="priority", max_num_seqs=2)
    low = seq(7, "low", max_tokens=8, priority=5)
    high = seq(7, "high", max_tokens=8, priority=-1, start=50)
    s.add(low)
    s.add(high)
    assert s.waiting[0] is high
    for _ in range(3):
        step(s)
    assert low.num_preemptions == 1 and high.num_preemptions == 0


def test_preempted_sequence_resumes_from_prefix_cache():
    s = make(num_blocks=5)
    a, b = seq(8, "a", max_tokens=6), seq(8, "b", max_tokens=6, start=50)
    s.add(a)
    s.add(b)
    run_to_end(s)
    assert s.num_preemptions >= 1
    assert s.block_manager.num_prefix_hits > 0  # the victim got its blocks back


def test_abort_waiting_and_running():
    s = make()
    a, b = seq(5, "a", max_tokens=10), seq(5, "b", max_tokens=10, start=40)
    s.add(a)
    step(s)
    s.add(b)
    s.finish(a, "abort")
    s.finish(b, "abort")
    assert a.finish_reason == b.finish_reason == "abort"
    assert not s.has_unfinished() and s.block_manager.num_free_blocks == 64


def test_scheduling_is_fast():
    s = make(num_blocks=4096, max_num_seqs=64, max_num_batched_tokens=2048)
    for i in range(128):
        s.add(seq(30, f"r{i}", max_tokens=16, start=1000 * i))
    t0 = time.perf_counter()
    run_to_end(s)
    assert time.perf_counter() - t0 < 2.0


def test_random_workload_keeps_block_invariants():
    """Random arrivals, aborts, tiny pool: every block is either free or held by exactly its users."""
    import random

    rng = random.Random(0)
    for policy in ("fcfs", "priority"):
        s = make(num_blocks=12, max_num_seqs=4, max_num_batched_tokens=8, policy=policy)
        bm, live, n = s.block_manager, [], 0
        for step_no in range(400):
            if rng.random() < 0.3:
                x = seq(rng.randint(1, 14), f"r{n}", max_tokens=rng.randint(1, 10), priority=rng.randint(0, 3),
                        start=rng.choice([1, 1, 500 + n]))
                n += 1
                s.add(x)
                live.append(x)
            if live and rng.random() < 0.05:
                s.finish(rng.choice(live), "abort")
            out = s.schedule()
            assert out.num_tokens <= 8 and len(out.seqs) <= 4
            assert all(x.block_table for x in out.seqs)
            s.postprocess(out, [rng.randint(1, 50) if m else None for m in out.sample_mask()])
            refs = {}
            for x in s.running:
                assert len(x.block_table) == bm.blocks_for(x.num_computed_tokens) or x.num_computed_tokens == 0
                for b in x.block_table:
                    refs[b] = refs.get(b, 0) + 1
            assert all(not x.block_table for x in s.waiting)
            for b in bm.blocks:
                assert b.ref_count == refs.get(b.block_id, 0)
                assert (b.ref_count == 0) == (b.block_id in bm.free_ids)
            live = [x for x in live if not x.is_finished]
        run_to_end(s)
        assert bm.num_free_blocks == 12


def test_postprocess_drops_the_token_of_a_sequence_finished_after_it_was_scheduled():
    """The engine finds stop strings one step late, when the sequence may be scheduled again."""
    s = make()
    a, b = seq(4, "a", max_tokens=10), seq(4, "b", max_tokens=10, start=20)
    s.add(a)
    s.add(b)
    step(s)
    out = s.schedule()
    s.finish(a, "stop", stop_reason="x")
    assert s.postprocess(out, [8, 8]) == [b]
    assert a.output_token_ids == [7] and a.num_computed_tokens == 0 and a.finish_reason == "stop"
    assert b.output_token_ids == [7, 8] and s.block_manager.num_free_blocks == 64 - len(b.block_table)


def decoding(s, *seqs):
    """Admit and prefill `seqs`, then schedule (not collect) their first decode step."""
    for q in seqs:
        s.add(q)
    step(s)
    return s.schedule()


def ahead_of(s, last, **kw):
    """`schedule_ahead` of `last` with the sequences that it samples."""
    return s.schedule_ahead(last, last.sample_mask(), **kw)


def test_schedule_ahead_counts_the_step_in_flight_and_holds_its_token_until_collected():
    s = make()
    a, b = seq(5, "a", max_tokens=8), seq(6, "b", max_tokens=8, start=40)
    last = decoding(s, a, b)  # a computes position 5, b position 6; their tokens are not known yet
    ahead = ahead_of(s, last)
    assert ahead.seqs == [a, b] and ahead.num_new_tokens == [1, 1]
    assert (a.num_computed_tokens, b.num_computed_tokens) == (6, 7)  # the step in flight counts as computed
    assert (a.num_known_tokens, b.num_known_tokens) == (6, 7)  # its tokens are still pending
    assert a.has_pending_token and b.has_pending_token and (a.num_tokens, b.num_tokens) == (7, 8)
    assert len(b.block_table) == 2  # position 7 (the pending token's) fits b's second block
    s.postprocess(last, [11, 12], ahead=True)
    assert (a.token_ids[-1], b.token_ids[-1]) == (11, 12) and (a.num_tokens, b.num_tokens) == (7, 8)
    assert not a.has_pending_token and not b.has_pending_token
    assert (a.num_computed_tokens, b.num_computed_tokens) == (6, 7)  # not counted twice
    assert ahead.sample_mask() == [True, True]  # the step ahead is an ordinary decode of the new tokens


def test_schedule_ahead_registers_a_block_only_once_its_pending_token_is_known():
    s = make()
    a = seq(6, "a", max_tokens=8)  # position 7, the pending token's, completes block 1
    last = decoding(s, a)
    bm = s.block_manager
    ahead = ahead_of(s, last)
    assert ahead.seqs == [a]
    block = bm.blocks[a.block_table[1]]
    assert block.hash is None  # its last token is on the device: nothing to hash yet
    s.postprocess(last, [9], ahead=True)
    assert block.hash is not None and block.token_ids == (5, 6, 7, 9)
    other = seq(9, "o", max_tokens=2)
    other.token_ids = [*a.token_ids, 50]
    assert bm.lookup_prefix(other) == a.block_table[:2]


def test_schedule_ahead_leaves_out_a_sequence_its_last_token_ends_by_length():
    s = make()
    a, b = seq(5, "a", max_tokens=2), seq(5, "b", max_tokens=8, start=40)
    last = decoding(s, a, b)  # a's token from `last` is its second and last
    ahead = ahead_of(s, last)
    assert ahead.seqs == [b]
    s.postprocess(last, [3, 4], ahead=True)
    assert a.is_finished and a.finish_reason == "length" and a.num_tokens == 7 and a.block_table == []


def test_schedule_ahead_unfinished_by_eos_token_is_dropped_when_collected():
    s = make()
    a, b = seq(5, "a", max_tokens=8), seq(5, "b", max_tokens=8, start=40)
    last = decoding(s, a, b)
    ahead = ahead_of(s, last)
    s.postprocess(last, [0, 4], ahead=True)  # a ends by EOS (token 0) while `ahead` computes it
    assert a.is_finished and a.finish_reason == "stop"
    again = ahead_of(s, ahead)
    assert again.seqs == [b]
    s.postprocess(ahead, [8, 8], ahead=True)
    assert a.output_token_ids == [7, 0] and b.output_token_ids == [7, 4, 8]


def test_schedule_ahead_also_schedules_prompt_chunks_and_admissions():
    """Ahead of a step that decodes one sequence and prefills another's first chunk: the decode of the
    pending token, the prompt's next chunk and a waiting request's first, as `schedule` would give them."""
    s = make(max_num_batched_tokens=8)
    a, b, c = seq(3, "a", max_tokens=8), seq(20, "b", max_tokens=2, start=40), seq(5, "c", max_tokens=2, start=90)
    s.add(a)
    step(s)  # a's prompt
    s.add(b)
    last = s.schedule()  # a's first decode beside b's first 7 prompt tokens
    assert last.seqs == [b, a] and last.num_new_tokens == [7, 1]
    s.add(c)
    ahead = ahead_of(s, last)
    assert ahead.seqs == [b, a] and ahead.num_new_tokens == [7, 1]  # c waits: the token budget is spent
    assert a.has_pending_token and not b.has_pending_token and b.num_computed_tokens == 7
    s.postprocess(last, [None, 5], ahead=True)
    assert a.output_token_ids == [7, 5] and b.num_computed_tokens == 7
    again = ahead_of(s, ahead)  # b's last 6 prompt tokens sample its first token; c gets the rest of the budget
    assert again.seqs == [b, a, c] and again.num_new_tokens == [6, 1, 1]
    s.postprocess(ahead, [None, 6], ahead=True)
    s.postprocess(again, [8, 9, None])
    assert a.output_token_ids == [7, 5, 6, 9] and b.output_token_ids == [8] and c.num_computed_tokens == 1


def test_schedule_ahead_of_the_steady_decode_only_declines_and_changes_nothing_when_the_host_must_decide():
    s = make(num_blocks=4, max_num_seqs=2)
    a = seq(7, "a", max_tokens=20)
    last = decoding(s, a)
    s.add(seq(3, "w", max_tokens=2, start=80))  # a request that could be admitted now
    assert ahead_of(s, last, decodes_only=True) is None and a.num_computed_tokens == 7
    s.waiting.clear()
    s.running.append(seq(3, "x", max_tokens=2, start=80))  # running, but not in the step in flight
    assert ahead_of(s, last, decodes_only=True) is None and a.num_computed_tokens == 7
    assert not a.has_pending_token and a.num_tokens == 8
    p = make(max_num_seqs=1, policy="priority")
    low = seq(7, "low", max_tokens=20, priority=5)
    last = decoding(p, low)
    p.add(seq(3, "high", max_tokens=2, start=80, priority=0))  # the batch is full, but it may evict `low`
    assert ahead_of(p, last, decodes_only=True) is None and low.num_computed_tokens == 7


def test_schedule_ahead_may_preempt_and_the_pending_token_survives_it():
    s = make(num_blocks=2)
    b = seq(7, "b", max_tokens=20)  # 2 blocks hold positions 0..7; position 8 needs a third
    last = decoding(s, b)
    ahead = ahead_of(s, last)
    assert ahead.is_empty and ahead.preempted == [b] and b.status is SequenceStatus.WAITING
    s.postprocess(last, [5], ahead=True)
    assert b.output_token_ids == [7, 5] and not b.has_pending_token and b.num_computed_tokens == 0