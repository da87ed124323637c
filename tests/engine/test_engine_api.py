"""Sampling options, stop conditions, aborts, stats and the threaded engine loop, end to end."""

import dataclasses
import threading
import time

import pytest

from hosttune_engine import LLM, Engine, EngineConfig, EngineLoop, SamplingParams
from hosttune_engine.core.messages import AbortRequest, EngineRequest, TokenOutput
from hosttune_engine.errors import ConfigError, RequestError

from .oracle import prompt_ids


@pytest.fixture(scope="module")
def llm(tiny_models):
    return LLM(str(tiny_models["qwen2"]))


def greedy(n=16, **kw):
    return SamplingParams(temperature=0, max_tokens=n, ignore_eos=True, **kw)


def test_seeded_sampling_is_reproducible_and_batch_independent(llm):
    p = SamplingParams(temperature=1.0, top_p=0.9, top_k=50, seed=123, max_tokens=12, ignore_eos=True)
    alone = llm.generate([prompt_ids(9, 1)], p)[0].token_ids
    crowd = llm.generate([prompt_ids(20, 2), prompt_ids(9, 1), prompt_ids(4, 3)],
                         [SamplingParams(temperature=1.0, max_tokens=12), p, SamplingParams(temperature=0.5, max_tokens=5)])
    assert crowd[1].token_ids == alone
    other = llm.generate([prompt_ids(9, 1)], SamplingParams(temperature=1.0, seed=7, max_tokens=12, ignore_eos=True))
    assert other[0].token_ids != alone


def test_top_k_one_is_greedy(llm):
    ids = prompt_ids(11, 4)
    sampled = llm.generate([ids], SamplingParams(temperature=0.8, top_k=1, max_tokens=10, ignore_eos=True))
    assert sampled[0].token_ids == llm.generate([ids], greedy(10))[0].token_ids


def test_many_stop_strings_cost_each_step_the_new_text_not_their_number(llm):
    # stop strings were once each checked at every token on the engine thread (500,000 took 2 s for 30 tokens)
    ids = prompt_ids(9, 5)
    plain_s, plain = _timed(llm, ids, greedy(30))
    many = greedy(30, stop=[f"zq{i:07d}" for i in range(100_000)])  # indexed here, where the request is made
    many_s, out = _timed(llm, ids, many)
    assert out.token_ids == plain.token_ids and out.finish_reason == "length"
    assert many_s < 5 * plain_s + 0.5, (many_s, plain_s)


def _timed(llm, ids, params):
    started = time.perf_counter()
    out = llm.generate([ids], params)[0]
    return time.perf_counter() - started, out


def test_max_tokens_and_stop_token_ids(llm):
    ids = prompt_ids(8, 5)
    full = llm.generate([ids], greedy(12))[0]
    assert len(full.token_ids) == 12 and full.finish_reason == "length"
    stop_tok = full.token_ids[5]
    first = full.token_ids.index(stop_tok)
    out = llm.generate([ids], greedy(12, stop_token_ids=[stop_tok]))[0]
    assert out.token_ids == full.token_ids[: first + 1]
    assert out.finish_reason == "stop" and out.stop_reason == stop_tok
    # as vLLM: a stop token is kept in token_ids, its text only with include_stop_str_in_output
    assert out.text == (llm.generate([ids], greedy(first))[0].text if first else "")
    kept = llm.generate([ids], greedy(12, stop_token_ids=[stop_tok], include_stop_str_in_output=True))[0]
    assert kept.text == llm.generate([ids], greedy(first + 1))[0].text != out.text


def test_an_end_token_of_generation_config_is_its_stop_reason_the_tokenizers_eos_none(llm, tiny_models, tmp_path):
    # as vLLM: generation_config's eos_token_id, less the tokenizer's EOS, joins each request's stop_token_ids
    ids = prompt_ids(6, 6)
    full = llm.generate([ids], greedy(10))[0].token_ids
    for f in tiny_models["qwen2"].iterdir():
        if f.name != "generation_config.json":
            (tmp_path / f.name).symlink_to(f)
    (tmp_path / "generation_config.json").write_text(f'{{"eos_token_id": [2, {full[2]}]}}')
    ends = LLM(str(tmp_path))
    assert ends.engine.scheduler.eos_token_ids == {ends.engine.tokenizer.eos_token_id} == {2}
    out = ends.generate([ids], SamplingParams(temperature=0, max_tokens=10))[0]
    first = full.index(full[2])
    assert out.token_ids == full[: first + 1] and (out.finish_reason, out.stop_reason) == ("stop", full[2])
    assert ends.generate([ids], greedy(10))[0].token_ids == full  # ignore_eos ignores it too


def test_stop_strings_cut_the_text(llm):
    text = "User: what is the capital of France? Assistant:"
    full = llm.generate(text, greedy(24))[0]
    stop = full.text[6:9]
    assert len(stop) == 3
    out = llm.generate(text, greedy(24, stop=[stop]))[0]
    assert out.finish_reason == "stop" and out.stop_reason == stop
    assert out.text == full.text[: full.text.find(stop)]
    kept = llm.generate(text, greedy(24, stop=[stop], include_stop_str_in_output=True))[0]
    assert kept.text == full.text[: full.text.find(stop) + 3]


def test_eos_ends_generation(tiny_models):
    llm = LLM(str(tiny_models["qwen2"]))
    eos = llm.engine.model_config.eos_token_ids[0]
    full = llm.generate([prompt_ids(6, 6)], greedy(10))[0].token_ids
    # Make EOS the token greedy decoding emits third: stop it via the engine's eos set.
    llm.engine.scheduler.eos_token_ids = frozenset([full[2]])
    out = llm.generate([prompt_ids(6, 6)], SamplingParams(temperature=0, max_tokens=10))[0]
    first = full.index(full[2])
    assert out.token_ids == full[: first + 1] and (out.finish_reason, out.stop_reason) == ("stop", None)
    # as vLLM: the EOS token ends the sequence, and its text is not in the output
    assert out.text == llm.generate([prompt_ids(6, 6)], greedy(first))[0].text if first else out.text == ""
    assert eos in llm.engine.model_config.eos_token_ids


def test_logprobs_of_chosen_tokens(llm):
    out = llm.generate([prompt_ids(7, 8)], greedy(5, logprobs=3))[0]
    assert [lp.token_id for lp in out.logprobs] == list(out.token_ids)
    for lp in out.logprobs:
        assert len(lp.top) == 3 and lp.top[0] == (lp.token_id, pytest.approx(lp.logprob))
        assert lp.logprob <= 0


def test_text_streams_incrementally_and_joins_to_the_full_text(tiny_models):
    eng = Engine(EngineConfig(model=str(tiny_models["llama"])))
    ids = eng.tokenizer.encode("The quick brown fox")
    eng.add_request(EngineRequest("s", ids, greedy(20)))
    pieces, tokens = [], []
    while eng.has_unfinished_requests():
        for out in eng.step():
            pieces.append(out.new_text)
            tokens.extend(out.new_token_ids)
    assert "".join(pieces) == eng.tokenizer.decode(tokens)


def test_step_outputs_equal_token_outputs_built_the_usual_way(tiny_models):
    """Engine builds TokenOutputs without the frozen __init__ (host time); they must be ordinary, whole ones."""
    eng = Engine(EngineConfig(model=str(tiny_models["llama"])))
    eng.add_request(EngineRequest("t", prompt_ids(12, 3), greedy(3)))
    outs = [o for _ in range(4) for o in eng.step()]
    assert [len(o.new_token_ids) for o in outs] == [1, 1, 1] and outs[-1].finished
    for out in outs:
        assert out == TokenOutput(**{f.name: getattr(out, f.name) for f in dataclasses.fields(TokenOutput)})
        assert set(vars(out)) == {f.name for f in dataclasses.fields(TokenOutput)}
        with pytest.raises(dataclasses.FrozenInstanceError):
            out.finished = False


def test_abort_frees_blocks_and_reports(tiny_models):
    eng = Engine(EngineConfig(model=str(tiny_models["llama"])))
    eng.add_request(EngineRequest("x", prompt_ids(40, 9), greedy(50)))
    eng.add_request(EngineRequest("y", prompt_ids(10, 10), greedy(50)))
    eng.step()
    assert eng.stats().num_running == 2 and eng.stats().kv_usage > 0
    assert eng.abort_request("x") and not eng.abort_request("nope")
    outs = {o.request_id: o for o in eng.step()}
    assert outs["x"].finished and outs["x"].finish_reason == "abort"
    eng.handle(AbortRequest("y"))
    eng.step()
    stats = eng.stats()
    assert stats.num_running == stats.num_waiting == 0
    assert stats.num_free_kv_blocks == stats.num_kv_blocks and stats.kv_usage == 0
    assert stats.num_finished_total == 2


def test_hard_max_batch_size_and_priority(tiny_models):
    eng = Engine(EngineConfig(model=str(tiny_models["llama"]), max_num_seqs=2, scheduling_policy="priority"))
    for i, prio in enumerate([5, 5, 0]):
        eng.add_request(EngineRequest(f"r{i}", prompt_ids(6, 20 + i), greedy(4), priority=prio))
    finished = []
    while eng.has_unfinished_requests():
        outs = eng.step()
        assert eng.stats().num_running <= 2
        finished += [o.request_id for o in outs if o.finished]
    assert finished.index("r2") < finished.index("r1")


def test_request_validation(tiny_models):
    eng = Engine(EngineConfig(model=str(tiny_models["llama"]), max_model_len=64, num_kv_blocks=3, block_size=16))
    with pytest.raises(RequestError, match="max_model_len"):
        eng.add_request(EngineRequest("a", list(range(3, 80)), greedy()))
    with pytest.raises(RequestError, match="the request needs 4 KV blocks, more than the pool's 3; lower max_tokens"):
        eng.add_request(EngineRequest("a", list(range(3, 40)), greedy(20)))
    # a prompt the pool cannot hold: no max_tokens would help
    with pytest.raises(RequestError, match="^the prompt's 49 tokens need 4 KV blocks, more than the pool's 3; shorten "
                                           "the prompt$"):
        eng.add_request(EngineRequest("a", list(range(3, 52)), greedy(2)))
    with pytest.raises(RequestError, match="empty"):
        eng.add_request(EngineRequest("a", [], greedy()))
    with pytest.raises(RequestError, match="token ids"):
        eng.add_request(EngineRequest("a", [10**6], greedy()))
    eng.add_request(EngineRequest("a", [5, 6], greedy(4)))
    with pytest.raises(RequestError, match="already in use"):
        eng.add_request(EngineRequest("a", [5, 6], greedy(4)))


def test_bad_options_are_config_errors():
    with pytest.raises(ConfigError, match="block_size"):
        EngineConfig(model="x", block_size=12)
    with pytest.raises(ConfigError, match="gpu_memory_utilization"):
        EngineConfig(model="x", gpu_memory_utilization=1.5)
    with pytest.raises(ConfigError, match="max_num_batched_tokens"):
        EngineConfig(model="x", max_num_seqs=64, max_num_batched_tokens=32)
    with pytest.raises(ConfigError, match="top_p"):
        SamplingParams(top_p=0)
    with pytest.raises(ConfigError, match="max_tokens"):
        SamplingParams(max_tokens=0)
    assert SamplingParams(stop="x").stop == ("x",) and SamplingParams(top_k=-1).top_k == 0


def test_engine_loop_thread_serves_messages(tiny_models):
    eng = Engine(EngineConfig(model=str(tiny_models["llama"])))
    outputs, errors, done = {}, [], threading.Event()

    def on_output(out):
        outputs.setdefault(out.request_id, []).append(out)
        if all(o and o[-1].finished for o in (outputs.get("a"), outputs.get("b"))):
            done.set()

    loop = EngineLoop(eng, on_output, on_error=lambda rid, e: errors.append((rid, e))).start()
    try:
        loop.submit(EngineRequest("a", prompt_ids(12, 40), greedy(8)))
        loop.submit(EngineRequest("b", prompt_ids(12, 41), greedy(2000 // 4)))
        loop.submit(EngineRequest("bad", [], greedy()))
        while not outputs.get("b"):
            threading.Event().wait(0.01)
        loop.submit(AbortRequest("b"))
        assert done.wait(30)
    finally:
        loop.stop(timeout=10)
    assert sum(len(o.new_token_ids) for o in outputs["a"]) == 8
    assert outputs["b"][-1].finish_reason == "abort"
    assert errors and errors[0][0] == "bad"
    assert loop.stats().num_running == 0


def test_stats_count_what_an_idle_call_did_before_any_step(tiny_models):
    """A server takes its metrics' baseline right after the step-cost measurement, an idle call: the stats
    it reads must already hold that call's effects."""
    eng = Engine(EngineConfig(model=str(tiny_models["qwen2"]), device="cpu", dtype="float32"))
    loop = EngineLoop(eng, lambda output: None).start()
    try:
        assert loop.stats().num_preemptions_total == 0

        def preempted():
            eng.scheduler.num_preemptions += 3

        loop.when_idle(preempted).result(timeout=30)
        assert loop.stats().num_preemptions_total == 3
    finally:
        loop.stop(timeout=10)


def test_a_lowered_token_budget_chunks_prompts_until_it_is_lifted(tiny_models):
    eng = Engine(EngineConfig(model=str(tiny_models["qwen2"]), device="cpu", dtype="float32"))
    expected = LLM(str(tiny_models["qwen2"]), device="cpu", dtype="float32").generate([prompt_ids(40, 5)],
                                                                                      greedy(3))[0].token_ids
    expected = list(expected)

    def steps_to_first_token(request_id):
        eng.add_request(EngineRequest(request_id, prompt_ids(40, 5), greedy(3)))
        steps, tokens = 0, []
        while eng.has_unfinished_requests():
            outputs = eng.step()
            steps += not tokens
            tokens += [t for o in outputs for t in o.new_token_ids]
        return steps, tokens

    eng.limit_batched_tokens(16)
    chunked, tokens = steps_to_first_token("a")
    assert chunked >= 3 and tokens == expected  # 40 prompt tokens, 16 a step
    eng.limit_batched_tokens(None)
    assert eng.scheduler.config.max_num_batched_tokens == eng.config.max_num_batched_tokens
    whole, tokens = steps_to_first_token("b")
    assert whole < chunked and tokens == expected
    eng.add_request(EngineRequest("c", prompt_ids(4, 6), greedy(3)))
    with pytest.raises(RuntimeError, match="idle"):
        eng.limit_batched_tokens(16)
