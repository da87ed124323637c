"""Deferred output processing: step N's outputs are built while step N+1 runs, and nothing observable changes.

Stop strings are found one step late, when the sequence is already scheduled again: that step's token must
vanish without a trace. References are each request run alone to its full length, cut where the synchronous
engine would have stopped it.
"""

import pytest
import torch

from hosttune_engine import Engine, EngineConfig, SamplingParams
from hosttune_engine.core.detokenizer import IncrementalDetokenizer
from hosttune_engine.core.messages import EngineRequest

from .oracle import prompt_ids

FULL = 24  # tokens of each reference run
TEXT = "User: what is the capital of France? Assistant:"


def greedy(n=FULL, **kw):
    return SamplingParams(temperature=0, max_tokens=n, **{"ignore_eos": True, **kw})


class RecordingRunner:
    """The engine's runner, writing each launch and collect to `log`."""

    def __init__(self, runner, log: list):
        self.runner, self.log = runner, log

    def launch(self, sched, after=None):
        self.log.append(("launch", tuple(s.request_id for s in sched.seqs)) + (("ahead",) if after else ()))
        return self.runner.launch(sched, after=after)

    def collect(self, launched):
        self.log.append(("collect",))
        return self.runner.collect(launched)

    def __getattr__(self, name):
        return getattr(self.runner, name)


MODES = ["host", "padded", pytest.param("captured", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="captured CUDA graphs need a GPU"))]


def engine_in_mode(path, mode: str, **config) -> Engine:
    """An engine whose decode steps run: "host", inputs packed per step (no graph buffers); "padded", the
    CUDA-graph buffers, eagerly; "captured", captured CUDA graphs (GPU only)."""
    eng = Engine(EngineConfig(model=str(path), **{"num_kv_blocks": 64, "block_size": 16, **config}))
    if mode == "padded" or (mode == "captured" and eng.runner.graphs is None):
        eng.runner.graphs = eng.runner.build_decode_graphs(use_graphs=mode == "captured", max_batch=8)
    elif mode == "host":
        eng.runner.graphs = None
    return eng


def recorded_engine(path, mode: str = "host", **config) -> tuple[Engine, list]:
    """An engine (see `engine_in_mode`) whose runner logs."""
    eng, log = engine_in_mode(path, mode, **config), []
    eng.runner = RecordingRunner(eng.runner, log)
    return eng, log


def drive(eng: Engine, arrivals: dict[int, list[EngineRequest]], aborts: dict[int, list[str]] | None = None) -> dict:
    """Call step until done, adding and aborting requests before the calls given; each request's outputs."""
    outputs: dict[str, list] = {}
    aborts = aborts or {}
    last = max([*arrivals, *aborts])
    for call in range(500):
        for req in arrivals.get(call, []):
            eng.add_request(req)
        for rid in aborts.get(call, []):
            assert eng.abort_request(rid), rid
        if call > last and not eng.has_unfinished_requests():
            return outputs
        for out in eng.step():
            outputs.setdefault(out.request_id, []).append(out)
    raise AssertionError("engine did not finish")


def alone(path, ids, n=FULL) -> list[int]:
    """Greedy tokens of one request running alone."""
    eng = Engine(EngineConfig(model=str(path), num_kv_blocks=64, block_size=16))
    return tokens_of(drive(eng, {0: [EngineRequest("alone", ids, greedy(n))]})["alone"])


def synchronous(eng: Engine, ids, full: list[int], params: SamplingParams, limit: int) -> tuple[list[int], str]:
    """Tokens and text the synchronous engine gave: `full` cut after `limit` tokens or at the first token whose
    text completes a stop string."""
    detok = IncrementalDetokenizer(eng.tokenizer, ids, params)
    for i, token in enumerate(full[:limit]):
        if detok.add_token(token) is not None:
            limit = i + 1
            break
    return full[:limit], detok.take_new_text(finished=True)


def tokens_of(outs) -> list[int]:
    return [t for o in outs for t in o.new_token_ids]


def text_of(outs) -> str:
    return "".join(o.new_text for o in outs)


def assert_well_ordered(outs) -> None:
    """One output per token, then exactly one finished output, last."""
    assert [o.finished for o in outs] == [False] * (len(outs) - 1) + [True]
    assert all(len(o.new_token_ids) == 1 for o in outs[:-1])


@pytest.mark.parametrize("mode", MODES)
def test_stop_string_found_a_step_late_drops_the_next_token_everywhere(tiny_models, mode):
    path = tiny_models["qwen2"]
    eng, log = recorded_engine(path, mode)
    ids = eng.tokenizer.encode(TEXT)
    full = alone(path, ids)
    full_text = eng.tokenizer.decode(full)
    stop = full_text[6:9]
    params = greedy(logprobs=2, stop=[stop])
    want, want_text = synchronous(eng, ids, full, params, FULL)
    assert len(want) < FULL and want_text == full_text[: full_text.find(stop)]
    eng.add_request(EngineRequest("s", ids, params))
    seq = eng.requests["s"].seq
    outs = drive(eng, {0: []})["s"]
    assert_well_ordered(outs)
    assert tokens_of(outs) == want and seq.output_token_ids == want  # the dropped token was never appended
    assert text_of(outs) == want_text
    assert (outs[-1].finish_reason, outs[-1].stop_reason, outs[-1].num_output_tokens) == ("stop", stop, len(want))
    assert [lp.token_id for o in outs for lp in o.new_logprobs] == want
    launches = [entry for entry in log if entry[0] == "launch"]
    assert len(launches) == len(want) + 1  # it ran once more after the token that completed the stop string
    stats = eng.stats()
    assert stats.generation_tokens_total == len(want) and stats.num_finished_total == 1
    assert stats.num_free_kv_blocks == stats.num_kv_blocks and seq.block_table == []


def test_stop_string_on_the_last_allowed_token_wins_over_length(tiny_models):
    path = tiny_models["qwen2"]
    eng, log = recorded_engine(path)
    ids = eng.tokenizer.encode(TEXT)
    full = alone(path, ids)
    stop = eng.tokenizer.decode(full)[6:9]
    want, _ = synchronous(eng, ids, full, greedy(stop=[stop]), FULL)
    outs = drive(eng, {0: [EngineRequest("s", ids, greedy(len(want), stop=[stop]))]})["s"]
    assert tokens_of(outs) == want and (outs[-1].finish_reason, outs[-1].stop_reason) == ("stop", stop)
    assert sum(entry[0] == "launch" for entry in log) == len(want)  # length finished it when collected


@pytest.mark.parametrize("mode", MODES)
def test_mixed_batch_matches_what_each_request_gives_alone(tiny_models, mode):
    """EOS, max_tokens, stop strings (one on its last allowed token), a late arrival and two aborts in one
    batch: each request's tokens, text, finish reason and outputs are those of its run alone, cut where the
    synchronous engine stopped it (an abort after k calls that ran it: k tokens)."""
    path = tiny_models["qwen2"]
    eng, _ = recorded_engine(path, mode)
    text_ids = eng.tokenizer.encode(TEXT)
    prompts = {"len": prompt_ids(9, 1), "eos": prompt_ids(14, 2), "stop": text_ids, "stop_at_max": text_ids,
               "late": prompt_ids(5, 3), "abort": prompt_ids(20, 4), "abort_early": prompt_ids(7, 5)}
    full = {rid: alone(path, ids) for rid, ids in prompts.items()}
    eos = full["eos"][4]
    eng.scheduler.eos_token_ids = frozenset([eos])  # only "eos" heeds it: the others ignore EOS
    stop = eng.tokenizer.decode(full["stop"])[6:9]
    num_until_stop = len(synchronous(eng, text_ids, full["stop"], greedy(stop=[stop]), FULL)[0])
    params = {"len": greedy(7), "eos": greedy(ignore_eos=False), "stop": greedy(stop=[stop]),
              "stop_at_max": greedy(num_until_stop, stop=[stop]), "late": greedy(6), "abort": greedy(),
              "abort_early": greedy()}
    limits = {"len": 7, "eos": full["eos"].index(eos) + 1, "stop": FULL, "stop_at_max": FULL, "late": 6,
              "abort": 4, "abort_early": 0}
    reasons = {"len": "length", "eos": "stop", "stop": "stop", "stop_at_max": "stop", "late": "length",
               "abort": "abort", "abort_early": "abort"}
    reqs = {rid: EngineRequest(rid, prompts[rid], params[rid]) for rid in prompts}
    arrivals = {0: [r for rid, r in reqs.items() if rid != "late"], 3: [reqs["late"]]}
    outs = drive(eng, arrivals, aborts={1: ["abort_early"], 5: ["abort"]})  # after 1 and 5 calls that ran them

    for rid, got in outs.items():
        tokens, text = synchronous(eng, prompts[rid], full[rid], params[rid], limits[rid])
        if rid == "eos":  # the EOS token ends it and, as in vLLM, stays out of its text
            text = synchronous(eng, prompts[rid], full[rid], params[rid], limits[rid] - 1)[1]
        assert (tokens_of(got), text_of(got), got[-1].finish_reason) == (tokens, text, reasons[rid]), rid
        assert [o.finished for o in got] == [False] * (len(got) - 1) + [True], rid  # nothing after the end
        assert len(got) == len(tokens) + (reasons[rid] == "abort"), rid  # one output per token, and the abort's
    assert set(outs) == set(prompts)
    stats = eng.stats()
    assert stats.generation_tokens_total == sum(len(tokens_of(got)) for got in outs.values())
    assert stats.num_finished_total == len(prompts) and stats.num_free_kv_blocks == stats.num_kv_blocks


def test_outputs_of_a_step_are_built_while_the_next_one_runs(tiny_models, monkeypatch):
    eng, log = recorded_engine(tiny_models["llama"])
    advance = eng._advance
    monkeypatch.setattr(eng, "_advance", lambda req, lp: log.append(("build", req.seq.request_id)) or advance(req, lp))
    for rid, seed in (("a", 1), ("b", 2)):
        eng.add_request(EngineRequest(rid, prompt_ids(6, seed), greedy(3)))
    calls = []
    while eng.has_unfinished_requests():
        log.append(("call",))
        calls.append([(o.request_id, o.finished) for o in eng.step()])
    launch, collect, call = ("launch", ("a", "b")), ("collect",), ("call",)
    builds = [("build", "a"), ("build", "b")]
    assert log == [call, launch,  # the prefill is left running
                   call, collect, launch, *builds,  # step 1's outputs while step 2 runs on the device
                   call, collect, launch, *builds,
                   call, collect, *builds]  # both finished by length in step 3: nothing left to launch
    assert calls == [[], [("a", False), ("b", False)], [("a", False), ("b", False)], [("a", True), ("b", True)]]


def test_abort_drops_the_token_of_the_step_in_flight(tiny_models):
    eng, _ = recorded_engine(tiny_models["llama"])
    ids = prompt_ids(10, 6)
    eng.add_request(EngineRequest("x", ids, greedy()))
    outs = eng.step() + eng.step()  # the second call sent token 1 and left the step of token 2 running
    assert eng.abort_request("x")
    outs += eng.step()
    assert [o.new_token_ids for o in outs] == [(alone(tiny_models["llama"], ids)[0],), ()]
    assert [o.finish_reason for o in outs] == [None, "abort"] and outs[-1].num_output_tokens == 1
    assert not eng.has_unfinished_requests()
    stats = eng.stats()
    assert stats.generation_tokens_total == 1 and stats.num_free_kv_blocks == stats.num_kv_blocks


def test_abort_after_the_last_token_went_out_is_too_late(tiny_models):
    eng, _ = recorded_engine(tiny_models["llama"])
    eng.add_request(EngineRequest("x", prompt_ids(10, 6), greedy(2)))
    outs = eng.step() + eng.step() + eng.step()  # the third call collected the last token and sent it
    assert [(o.new_token_ids != (), o.finish_reason) for o in outs] == [(True, None), (True, "length")]
    assert not eng.abort_request("x")
    assert eng.step() == [] and not eng.has_unfinished_requests()
    stats = eng.stats()
    assert stats.num_finished_total == 1 and stats.num_free_kv_blocks == stats.num_kv_blocks


def test_sampled_steps_read_their_tokens_back_in_collect(tiny_models, monkeypatch):
    """Random sampling with logprobs also stays on the device until collect: launch enqueues, collect reads."""
    from hosttune_engine.layers.sampler import DeviceSample

    def run():
        eng, log = recorded_engine(tiny_models["llama"])
        to_host = DeviceSample.to_host
        read = lambda self: log.append(("read", type(self.tokens))) or to_host(self)  # noqa: E731
        monkeypatch.setattr(DeviceSample, "to_host", read)
        eng.add_request(EngineRequest("s", prompt_ids(9, 4),
                                      SamplingParams(temperature=0.8, top_p=0.9, seed=3, max_tokens=5, logprobs=2,
                                                     ignore_eos=True)))
        outs = []
        while eng.has_unfinished_requests():
            outs += eng.step()
        return outs, log

    outs, log = run()
    assert [entry[0] for entry in log] == ["launch", "collect", "read"] * 5  # never read back inside launch
    assert all(entry[1] is torch.Tensor for entry in log if entry[0] == "read")
    assert [len(o.new_logprobs[0].top) for o in outs] == [2] * 5
    again, _ = run()  # seeded: the same tokens and logprobs as the first run
    assert [(o.new_token_ids, o.new_logprobs) for o in outs] == [(o.new_token_ids, o.new_logprobs) for o in again]


def test_steady_greedy_decode_launches_the_next_step_before_collecting(tiny_models):
    """With the graph buffers, each call launches step N+1 on step N's tokens still on the device (the
    prefill's too), then collects step N; a sequence that step N ends by length is left out of step N+1."""
    eng, log = recorded_engine(tiny_models["qwen2"], "padded")
    reqs = [EngineRequest(rid, prompt_ids(6 + n, n), greedy(n)) for rid, n in (("a", 3), ("b", 4))]
    outs = drive(eng, {0: reqs})
    ab, ahead, collect, call = ("a", "b"), "ahead", ("collect",), ("call",)
    assert [entry for entry in log] == [
        ("launch", ab),  # prefill
        ("launch", ab, ahead), collect,  # the first decode, on the prefill's tokens still on the device
        ("launch", ab, ahead), collect,  # token 3 launched before token 2 is read back
        ("launch", ("b",), ahead), collect,  # a's token 3 is its last: b alone gets its 4th
        collect,
    ]
    for req in reqs:
        assert tokens_of(outs[req.request_id]) == alone(tiny_models["qwen2"], req.prompt_token_ids,
                                                        req.sampling.max_tokens)
    stats = eng.stats()
    assert stats.num_free_kv_blocks == stats.num_kv_blocks and stats.generation_tokens_total == 7


@pytest.mark.parametrize("mode", MODES)
def test_generated_blocks_enter_the_prefix_cache_only_when_computed(tiny_models, mode):
    """Blocks filled by generated tokens are cached (steps ahead register them once their token is known),
    but not the block whose last token, the final one, was never computed: a prompt that extends the
    finished sequence reuses exactly the computed blocks and gets the tokens an uncached engine gives."""
    path = tiny_models["llama"]
    eng = engine_in_mode(path, mode, block_size=4, dtype="float32")
    first = drive(eng, {0: [EngineRequest("first", prompt_ids(6, 8), greedy(10))]})["first"]
    whole = prompt_ids(6, 8) + tokens_of(first)  # 16 tokens: positions 0..14 computed, 15 never
    follow = EngineRequest("follow", whole + [5], greedy(6))
    got = drive(eng, {0: [follow]})["follow"]
    assert got[-1].num_cached_tokens == 12  # blocks 0-2; block 3 holds position 15
    fresh = Engine(EngineConfig(model=str(path), num_kv_blocks=64, block_size=4, dtype="float32",
                                enable_prefix_caching=False))
    assert tokens_of(got) == tokens_of(drive(fresh, {0: [follow]})["follow"])


def test_sampled_steps_are_launched_ahead_and_sample_what_the_host_path_samples(tiny_models):
    """Seeded sampling (temperature, top-k/p, logprobs) beside greedy rows: the steps launched ahead on
    the sampled tokens left on the device give each request the tokens and logprobs of the host path."""
    path = tiny_models["llama"]
    params = {"hot": SamplingParams(temperature=0.9, top_p=0.9, seed=5, max_tokens=9, logprobs=2, ignore_eos=True),
              "topk": SamplingParams(temperature=1.3, top_k=5, seed=6, max_tokens=6, ignore_eos=True),
              "cold": greedy(8)}
    reqs = {0: [EngineRequest(rid, prompt_ids(7 + i, 20 + i), p) for i, (rid, p) in enumerate(params.items())]}
    results = {}
    modes = ("host", "padded", "captured") if torch.cuda.is_available() else ("host", "padded")
    for mode in modes:
        eng, log = recorded_engine(path, mode, dtype="float32")  # fp32: the paths differ only by rounding
        results[mode] = drive(eng, reqs)
        ahead = sum(entry[-1] == "ahead" for entry in log)
        assert ahead == (0 if mode == "host" else 8), mode  # the 8 decode steps of "cold"
    host = results["host"]
    for mode in modes[1:]:
        for rid in params:
            assert tokens_of(host[rid]) == tokens_of(results[mode][rid]), (mode, rid)
    lps = {mode: [lp for o in got["hot"] for lp in o.new_logprobs] for mode, got in results.items()}
    assert len(lps["padded"]) == 9
    for a, b in zip(lps["host"], lps[modes[-1]]):  # GEMMs of padded vs packed rows: equal to rounding
        assert [t for t, _ in a.top] == [t for t, _ in b.top]
        assert (a.logprob, *(v for _, v in a.top)) == pytest.approx((b.logprob, *(v for _, v in b.top)), abs=1e-4)


@pytest.mark.parametrize("mode", MODES)
def test_max_model_len_ends_a_sequence_the_same_way_ahead(tiny_models, mode):
    """A sequence that reaches max_model_len is left out of the step launched ahead, like max_tokens."""
    path = tiny_models["qwen2"]
    eng, log = recorded_engine(path, mode, max_model_len=24)
    ids = prompt_ids(15, 9)
    outs = drive(eng, {0: [EngineRequest("m", ids, greedy(50)), EngineRequest("n", prompt_ids(4, 10), greedy(12))]})
    assert tokens_of(outs["m"]) == alone(path, ids)[:9] and outs["m"][-1].finish_reason == "length"
    assert len(ids) + outs["m"][-1].num_output_tokens == 24
    assert tokens_of(outs["n"]) == alone(path, prompt_ids(4, 10), 12)
    stats = eng.stats()
    assert stats.num_free_kv_blocks == stats.num_kv_blocks


@pytest.mark.parametrize("mode", ["padded", "captured"])
def test_decode_steps_with_a_prompt_chunk_of_one_token_match_the_host_path(tiny_models, mode):
    """A step budget of 2 tokens gives decode-only steps in which one sequence decodes and another gets one
    more token of its prompt (no token for it): the graph path must hand out the right rows' tokens."""
    if mode == "captured" and not torch.cuda.is_available():
        pytest.skip("captured CUDA graphs need a GPU")
    path = tiny_models["qwen2"]
    results = {}
    for m in ("host", mode):
        eng, log = recorded_engine(path, m, max_num_batched_tokens=2, max_num_seqs=2)
        ids = eng.tokenizer.encode(TEXT)
        outs = drive(eng, {0: [EngineRequest("long", ids, greedy(8))], 1: [EngineRequest("short", ids[:3], greedy(8))]})
        results[m] = {rid: tokens_of(o) for rid, o in outs.items()}
    assert results[mode] == results["host"] and all(len(t) == 8 for t in results["host"].values())
