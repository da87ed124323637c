"""Step costs measured through the real runner at start, and a time budget that chunks
prompts beside decodes without changing what is generated."""

import os
import time

import pytest

from hosttune_engine import Engine, EngineConfig, SamplingParams
from hosttune_engine.core.messages import EngineRequest
from hosttune_engine.core.step_cost import StepCostModel

from .oracle import prompt_ids


def greedy(n):
    return SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)


def run(engine, first, later):
    """Each request's tokens, and every step's chunks (tokens per sequence): `first` is added,
    one step runs, then `later` joins."""
    steps, schedule = [], engine.scheduler.schedule

    def recording(**kw):  # `schedule_ahead` passes the sequences that sit the step out
        out = schedule(**kw)
        steps.append([(s.request_id, n) for s, n in zip(out.seqs, out.num_new_tokens)])
        return out
    engine.scheduler.schedule = recording
    tokens, pending = {}, list(later)
    for request in first:
        engine.add_request(request)
    while engine.has_unfinished_requests() or pending:
        for out in engine.step():
            tokens.setdefault(out.request_id, []).extend(out.new_token_ids)
        for request in pending:
            engine.add_request(request)
        pending = []
    return tokens, steps


def short():
    return [EngineRequest("short", prompt_ids(8, 1), greedy(24))]


def long():
    return [EngineRequest("long", prompt_ids(200, 2), greedy(4))]


def test_costs_are_measured_at_start_and_leave_the_pool_empty(tiny_models):
    engine = Engine(EngineConfig(model=str(tiny_models["llama"]), max_step_ms=0))
    model = engine.scheduler.cost_model
    assert isinstance(model, StepCostModel) and all(t > 0 for t in model.token_seconds)
    assert list(model.token_seconds) == sorted(model.token_seconds) and model.decode_s >= 0 and model.prefill_s >= 0
    assert engine.scheduler.config.max_step_ms == 0 and model.decode_step_s > 0  # 0: the automatic budget
    assert model.full_decode_s > 0
    stats = engine.stats()
    assert stats.num_free_kv_blocks == stats.num_kv_blocks and engine.runner.generators == {}


def test_the_decode_terms_fit_a_small_pool_whatever_the_block_rounding(tiny_models):
    """The GPU's grid (32 decodes) on a 256-block pool: each decode's context is cut to whole blocks, so
    the probe's sequences fit the pool they were sized for (a context of 113 took 8 blocks each: 257)."""
    from hosttune_engine.core.step_cost import StepProbe, measure_step_costs

    engine = Engine(EngineConfig(model=str(tiny_models["llama"]), num_kv_blocks=256, max_num_batched_tokens=64,
                                 max_num_seqs=4))
    probe = StepProbe(engine.runner, engine.block_manager, 64, engine.max_model_len)
    model = measure_step_costs(probe, True, engine.block_manager.num_free_blocks * 16, 1, runs=1)
    assert model.decode_s > 0 or model.prefill_s >= 0
    assert engine.block_manager.num_free_blocks == 256


def test_a_budget_chunks_a_prompt_beside_decodes_and_generates_the_same(tiny_models):
    folder = str(tiny_models["llama"])
    # Pools of a fixed size: two engines alive at once on a GPU would otherwise share one memory share.
    want, plain_steps = run(Engine(EngineConfig(model=folder, num_kv_blocks=256)), short(), long())
    assert [n for step in plain_steps for rid, n in step if rid == "long"][0] == 200  # one chunk
    # A budget far below any step's time: the prompt gets its minimum share beside the decode.
    got, steps = run(Engine(EngineConfig(model=folder, max_step_ms=0.001, num_kv_blocks=256)), short(), long())
    long_chunks = [n for step in steps for rid, n in step if rid == "long"]
    assert long_chunks[:4] == [64, 64, 64, 8] and all(("short", 1) in step for step in steps[1:5])
    assert got == want and len(got["long"]) == 4 and len(got["short"]) == 24


def test_the_step_log_records_each_step_with_its_real_time_and_estimate(tiny_models, tmp_path):
    import json

    path = tmp_path / "steps.jsonl"
    engine = Engine(EngineConfig(model=str(tiny_models["llama"]), max_step_ms=50, step_log=str(path)))
    tokens, steps = run(engine, short(), long())
    engine.shutdown()
    records = [json.loads(line) for line in path.read_text().splitlines()]
    steps = [step for step in steps if step]  # the last schedule finds nothing to run
    assert len(records) == len(steps) and len(tokens["short"]) == 24
    assert records[0]["ms"] is None and all(r["ms"] > 0 for r in records[1:])  # the first follows an idle engine
    assert [r["prefill_tokens"] for r in records] == [sum(n for _, n in step if n > 1) for step in steps]
    assert [r["decodes"] for r in records] == [sum(1 for _, n in step if n == 1) for step in steps]
    mixed = [r for r in records if r["decodes"] and r["prefill_tokens"]]
    assert mixed and all(r["estimate_ms"] > 0 for r in mixed)  # a step held to the budget has an estimate
    assert all(r["estimate_ms"] is None for r in records if not r["decodes"] or not r["prefill_tokens"])
    assert engine.scheduler.correction.num_steps == len([r for r in mixed if r["ms"] is not None])


def test_the_server_option_takes_milliseconds_auto_or_off(capsys):
    import pytest

    from hosttune_engine.server.cli import _parser, config_from_args

    def budget(*flags):
        return config_from_args(_parser().parse_args(["serve", "--model", "m", *flags])).engine.max_step_ms
    assert budget() == 0.0 and budget("--max-step-ms", "auto") == 0.0  # 0: the automatic budget
    assert budget("--max-step-ms", "off") is None and budget("--max-step-ms", "12.5") == 12.5
    for bad in ("0", "-3", "fast"):
        with pytest.raises(SystemExit) as exit_info:
            budget("--max-step-ms", bad)
        assert exit_info.value.code == 2 and "auto or off" in capsys.readouterr().err


def test_a_server_measures_after_warmup_on_the_idle_engine_loop(tiny_models):
    """`measure_step_costs=False` leaves the model to the caller; `EngineLoop.when_idle` runs the measurement
    once the requests in the engine have finished, before the messages sent after it."""
    import threading

    from hosttune_engine import EngineLoop

    engine = Engine(EngineConfig(model=str(tiny_models["llama"]), max_step_ms=0, max_num_seqs=4,
                                 max_num_batched_tokens=64, num_kv_blocks=256), measure_step_costs=False)
    assert engine.needs_step_costs and engine.scheduler.cost_model is None
    finished, seen_running = threading.Event(), []

    def on_output(out):
        if out.finished and out.request_id == "after":
            finished.set()

    def measure():
        seen_running.append(engine.has_unfinished_requests())
        return engine.measure_step_costs(runs=1)
    loop = EngineLoop(engine, on_output).start()
    try:
        loop.submit(EngineRequest("before", prompt_ids(12, 3), greedy(6)))
        measured = loop.when_idle(measure)
        loop.submit(EngineRequest("after", prompt_ids(12, 4), greedy(2)))
        assert isinstance(measured.result(timeout=60), StepCostModel) and finished.wait(60)
    finally:
        loop.stop(timeout=10)
    assert seen_running == [False] and not engine.needs_step_costs
    assert engine.scheduler.cost_model is measured.result()


def test_no_measured_step_reaches_past_the_context():
    """On CUDA the grid runs up to the token budget; a model of a shorter context caps it (a position past
    the context would read past RoPE's table on the GPU)."""
    from hosttune_engine.core.step_cost import measure_step_costs

    class Probe:
        max_tokens, max_context, block_size, asked = 8192, 1024, 16, []

        def seconds(self, chunk, chunk_context, num_decodes, decode_context, runs):
            self.asked.append((chunk + chunk_context, decode_context + 1))
            return 1e-3 * (1 + chunk + num_decodes) + 1e-7 * (chunk * chunk_context + num_decodes * decode_context)

    probe = Probe()
    model = measure_step_costs(probe, on_cuda=True, kv_tokens=1 << 20, decode_batch=64, runs=1)
    assert max(max(pair) for pair in probe.asked) <= 1024
    assert model.token_points[-1] == 1024 and model.decode_s > 0 and model.prefill_s > 0


def test_one_slow_step_does_not_stand_for_every_larger_one():
    """A first step that meets a one-off cost (681 ms where 6 ms was due, seen on an H200) is lowered to the
    points after it, so the budget still admits prompt chunks; the costs still grow with the tokens."""
    from hosttune_engine.core.step_cost import measure_step_costs

    class Probe:
        max_tokens, max_context, block_size, calls = 8192, 8192, 16, 0

        def seconds(self, chunk, chunk_context, num_decodes, decode_context, runs):
            self.calls += 1
            return 0.681 if self.calls == 1 else 1e-3 * (5 + (chunk + num_decodes) / 100)

    model = measure_step_costs(Probe(), on_cuda=True, kv_tokens=1 << 20, decode_batch=64, runs=1)
    seconds = model.token_seconds
    assert seconds[0] < 0.01 and seconds[-1] > seconds[0]
    assert all(a <= b for a, b in zip(seconds, seconds[1:]))
    assert model.max_chunk(0.03, 64, 0, 0, 0, 8192) > 1000


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs Linux's /dev/full, a file whose writes fail")
def test_a_step_log_that_cannot_be_written_stops_logging_and_the_engine_goes_on(caplog, monkeypatch):
    # a diagnostics file on a full disk must not fail the requests in flight and end the server
    from hosttune_engine.core.scheduler_output import SchedulerOutput
    from hosttune_engine.core.step_log import StepLog

    monkeypatch.setattr(StepLog, "FLUSH_S", 0.0)
    step_log = StepLog("/dev/full")
    for _ in range(3):
        step_log.write(SchedulerOutput(), time.monotonic(), 0.01, 1.0)
    step_log.close()
    assert [r.getMessage() for r in caplog.records if r.levelname == "ERROR"] == [
        "step log /dev/full: cannot write to it (No space left on device); the engine goes on without it"]
