"""Each workload against the scripted server, whose prefix cache, token counts and timings
are known: shared system prompts are reused, conversations grow by exactly their history,
a trace's arrivals keep their times, and datasets send their own prompts."""

import json

import pytest

from hosttune.bench.benchmark import BenchSpec, measure, run_async
from hosttune.bench.loadgen import Load
from hosttune.bench.metrics import in_flight, summarize
from hosttune.bench.record import OK
from hosttune.bench.trace import load_trace
from hosttune.errors import BenchError
from scripted_server.cache import BLOCK

from .servers import realtime


def run(url, **spec):
    return run_async(measure(BenchSpec(timeout=20, metrics_interval=None, **spec), url))


@pytest.mark.parametrize("api", ["completions", "chat"])
def test_shared_system_prompts_are_reused(server_factory, api):
    url = server_factory("--ttft", "0.005", "--itl", "0.001")
    prefix_tokens = 8 * BLOCK
    record = run(url, load=Load(users=6, num_requests=36), api=api, prompt_lengths="uniform:20-40",
                 output_lengths="3", shared_prefix=(3, 2), prefix_tokens=prefix_tokens)
    assert record.prompt_lengths == f"3 shared system prompts of {prefix_tokens} tokens x 2 users each"
    requests = sorted(record.requests, key=lambda r: r.sent)
    assert all(r.outcome == OK for r in requests) and {r.group for r in requests} == {0, 1, 2}
    first = {}
    for r in requests:
        first.setdefault(r.group, r)
    for r in requests:
        if r is first[r.group]:
            continue
        # The BOS and all but the system prompt's last word fill its 8 blocks.
        assert prefix_tokens <= r.cached_tokens < r.reported_prompt_tokens
    assert all(r.reported_prompt_tokens == r.prompt_tokens for r in requests)


def test_requests_without_a_shared_prefix_find_nothing_cached(server_factory):
    url = server_factory("--ttft", "0.005", "--itl", "0.001")
    record = run(url, load=Load(users=4, num_requests=20), prompt_lengths="200", output_lengths="2")
    assert sum(r.cached_tokens for r in record.requests) <= BLOCK * 13  # a chance repeat of an offset at most


@pytest.mark.parametrize("api", ["completions", "chat"])
def test_conversations_resend_their_history(server_factory, api):
    url = server_factory("--ttft", "0.005", "--itl", "0.001")
    record = run(url, load=Load(users=3, num_requests=24), api=api, prompt_lengths="uniform:5-15",
                 output_lengths="uniform:2-6", turns=4)
    by_conversation = {}
    for r in sorted(record.requests, key=lambda r: r.index):
        by_conversation.setdefault(r.conversation, []).append(r)
    full = [turns for turns in by_conversation.values() if len(turns) == 4]
    assert len(full) >= 4
    for turns in full:
        assert [r.turn for r in turns] == [1, 2, 3, 4]
        assert all(r.reported_prompt_tokens == r.prompt_tokens for r in turns)
        for before, after in zip(turns, turns[1:]):
            # The server saw the whole history: the last prompt, its answer and a new
            # question of 4 to 14 words (the BOS counts once).
            question = after.reported_prompt_tokens - before.reported_prompt_tokens - before.output_tokens
            assert 4 <= question <= 14 and before.output_tokens >= 2
            assert after.cached_tokens >= (before.reported_prompt_tokens // BLOCK) * BLOCK


def test_conversations_need_closed_loop_users():
    with pytest.raises(BenchError, match="--turns needs closed-loop users"):
        BenchSpec(load=Load(rate=5, duration=1), turns=3)


def write_trace(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def test_arrivals_already_due_send_no_more_than_the_requests_asked_for(server_factory, tmp_path):
    """Arrivals due at once (a trace's burst; --rate past what the client can send, its loop behind) were each sent
    before the one before had counted itself: --requests 3 sent all 20 (a huge rate, thousands)."""
    url = server_factory("--ttft", "0.002", "--itl", "0.001")
    trace = load_trace(write_trace(tmp_path / "burst.jsonl", [{"arrival": 0, "input_length": 8, "output_length": 2}] * 20))
    record = run(url, load=Load(arrivals=trace.arrivals, num_requests=3), trace=trace)
    assert len(record.requests) == 3


def test_a_trace_bounded_by_a_count_measures_its_arrivals_up_to_the_next_one(server_factory, tmp_path):
    """A trace every 50 ms (20/s), --requests 10: the window ends at the 11th arrival, 10 gaps. It ended at the last
    response (0.46 s), which offered 21.6/s; requests longer than a gap would have stretched it instead."""
    url = server_factory("--ttft", "0.01", "--itl", "0.01")
    rows = [{"arrival": 0.05 * i, "input_length": 8, "output_length": 1} for i in range(20)]
    trace = load_trace(write_trace(tmp_path / "steady.jsonl", rows))
    record = run(url, load=Load(arrivals=trace.arrivals, num_requests=10), trace=trace)
    s = summarize(record)
    assert len(record.requests) == 10 and record.window == (0.0, pytest.approx(0.5))
    assert s.offered_rate == pytest.approx(20) and s.request_throughput == pytest.approx(20)


def test_a_trace_shorter_than_its_duration_measures_its_arrivals_not_the_idle_tail(server_factory, tmp_path):
    """A 1 s trace at 20/s under --duration 3s: the window ran to 3 s, two of them idle, and offered 6.7/s. Replayed
    to its end before the duration, it ends at its last response, as a trace without a duration does."""
    url = server_factory("--ttft", "0.01", "--itl", "0.01")
    rows = [{"arrival": 0.05 * i, "input_length": 8, "output_length": 2} for i in range(20)]
    trace = load_trace(write_trace(tmp_path / "short.jsonl", rows))
    record = run(url, load=Load(arrivals=trace.arrivals, duration=3.0), trace=trace)
    last_end = max(r.end for r in record.requests)
    assert record.window == (0.0, last_end) and last_end < 1.5
    assert summarize(record).offered_rate == pytest.approx(20 / last_end)


def test_a_trace_keeps_its_arrival_times(server_factory, tmp_path):
    url = server_factory("--realtime", "--ttft", "0.01", "--itl", "0.002")
    # Milliseconds, out of order, starting late: shifted to start at 0 and sorted.
    times_ms = [5000 + 37 * i + (i % 3) * 90 for i in range(40)][::-1]
    rows = [{"timestamp": t, "input_length": 10 + t % 50, "output_length": 1 + t % 4} for t in times_ms]
    trace = load_trace(write_trace(tmp_path / "trace.jsonl", rows))
    with realtime():
        record = run(url, load=Load(arrivals=trace.arrivals), trace=trace)
    want = sorted((t - 5000) / 1000 for t in times_ms)
    requests = sorted(record.requests, key=lambda r: r.index)
    assert record.mode == "trace" and len(requests) == len(want)
    assert [round(r.scheduled, 9) for r in requests] == [round(t, 9) for t in want]
    late = max(r.sent - r.scheduled for r in requests)
    assert late <= 0.005, f"a request was sent {late * 1e3:.2f} ms after its trace time"
    by_time = sorted(rows, key=lambda row: row["timestamp"])
    assert [(r.prompt_tokens, r.output_tokens) for r in requests] == [
        (row["input_length"], row["output_length"]) for row in by_time]
    assert all(r.reported_prompt_tokens == r.prompt_tokens for r in requests)


def test_bad_trace_lines_are_user_errors(tmp_path):
    with pytest.raises(BenchError, match="arrival"):
        load_trace(write_trace(tmp_path / "a.jsonl", [{"input_length": 3, "output_length": 2}]))
    with pytest.raises(BenchError, match="output_length must be an integer from 1 to 10000000, got 0"):
        load_trace(write_trace(tmp_path / "b.jsonl", [{"arrival": 0, "input_length": 3, "output_length": 0}]))
    with pytest.raises(BenchError, match="input_length must be an integer from 1 to 10000000, got 100000000"):
        load_trace(write_trace(tmp_path / "c.jsonl", [{"arrival": 0, "input_length": 10**8, "output_length": 2}]))
    (tmp_path / "d.jsonl").write_text('{"arrival": NaN, "input_length": 3, "output_length": 2}\n')
    with pytest.raises(BenchError, match="d.jsonl:1: the arrival time must be a finite number"):
        load_trace(tmp_path / "d.jsonl")
    # Seconds on one line and milliseconds on the next would replay the second request 1000 times too late.
    mixed = [{"arrival": 0.5, "input_length": 3, "output_length": 2},
             {"timestamp": 1500, "input_length": 3, "output_length": 2}]
    with pytest.raises(BenchError, match='e.jsonl:2: "timestamp" here, where line 1 gives "arrival": give one of them on every line'):
        load_trace(write_trace(tmp_path / "e.jsonl", mixed))


def test_max_concurrency_caps_an_open_loop(server_factory):
    url = server_factory("--realtime", "--ttft", "0.05", "--itl", "0.01")
    # 200 requests/s of ~80 ms each would keep about 16 in flight; the cap holds them to 3.
    with realtime():
        record = run(url, load=Load(rate=200, duration=1.0, max_concurrency=3, drain_timeout=10),
                     prompt_lengths="8", output_lengths="4")
    requests = record.requests
    assert len(requests) > 20 and all(r.outcome == OK for r in requests)
    assert max(in_flight(requests, r.sent + 1e-6) for r in requests) <= 3
    summary = summarize(record)
    assert summary.ttft.p95 < 0.06  # waiting for a slot is not the server's latency
    assert summary.lag.send_p99 < 0.005  # nor the client's lag


def test_max_concurrency_is_for_open_loops():
    with pytest.raises(BenchError, match="--max-concurrency"):
        Load(users=4, duration=1, max_concurrency=2)


def test_dataset_prompts_are_sent(server_factory, tmp_path):
    url = server_factory("--ttft", "0.005", "--itl", "0.001")
    sharegpt = [
        {"conversations": [{"from": "human", "value": "one two three"}, {"from": "gpt", "value": "x y"},
                           {"from": "human", "value": "four five"}]},
        {"conversations": [{"from": "gpt", "value": "no question here"}]},
        {"conversations": [{"from": "system", "value": "be brief"}, {"from": "human", "value": "six"}]},
    ]
    path = tmp_path / "sharegpt.json"
    path.write_text(json.dumps(sharegpt))
    record = run(url, load=Load(users=1, num_requests=4), api="chat", dataset=path, output_lengths="2")
    # The BOS plus the words before the first answer; the entry with no question is skipped.
    assert [r.reported_prompt_tokens for r in record.requests] == [4, 4, 4, 4]
    assert record.prompt_lengths == f"2 prompts from {path}"
    assert record.tokenizer.startswith("dataset text")


def test_jsonl_prompts_and_messages_with_their_own_output_lengths(server_factory, tmp_path):
    url = server_factory("--ttft", "0.005", "--itl", "0.001")
    path = tmp_path / "prompts.jsonl"
    path.write_text(json.dumps({"prompt": "a b c d e", "output_tokens": 3}) + "\n"
                    + json.dumps({"messages": [{"role": "system", "content": "s"},
                                               {"role": "user", "content": "q r"}]}) + "\n")
    record = run(url, load=Load(users=1, num_requests=4), dataset=path, output_lengths="5")
    requests = sorted(record.requests, key=lambda r: r.index)
    assert [(r.reported_prompt_tokens, r.output_tokens) for r in requests] == [(6, 3), (4, 5)] * 2


def test_dataset_questions_make_conversation_turns(server_factory, tmp_path):
    url = server_factory("--ttft", "0.005", "--itl", "0.001")
    path = tmp_path / "turns.jsonl"
    path.write_text("".join(json.dumps({"prompt": " ".join(["w"] * n)}) + "\n" for n in (3, 5, 7)))
    record = run(url, load=Load(users=1, num_requests=3), dataset=path, output_lengths="2", turns=3)
    requests = sorted(record.requests, key=lambda r: r.index)
    assert [r.reported_prompt_tokens for r in requests] == [1 + 3, 1 + 3 + 2 + 5, 1 + 3 + 2 + 5 + 2 + 7]


def test_a_json_list_of_prompt_or_messages_objects_is_a_dataset(tmp_path):
    """The JSONL objects saved as one JSON list (a common export) were 'no prompts': read them as the lines are."""
    from hosttune.bench.dataset import load_dataset

    (tmp_path / "list.json").write_text(json.dumps([
        {"prompt": "hello there", "output_tokens": 3},
        {"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]}]))
    entries = load_dataset(tmp_path / "list.json")
    assert [(e.messages, e.output_tokens) for e in entries] == [
        ((("user", "hello there"),), 3), ((("system", "be brief"), ("user", "hi")), None)]
    (tmp_path / "bad.json").write_text(json.dumps([{"prompt": "a"}, {"prompt": "b", "output_tokens": 0}]))
    with pytest.raises(BenchError, match="bad.json: entry 2: output_tokens must be an integer"):
        load_dataset(tmp_path / "bad.json")


def test_bad_datasets_are_user_errors(tmp_path):
    from hosttune.bench.dataset import load_dataset

    (tmp_path / "empty.json").write_text("[]")
    with pytest.raises(BenchError, match="holds no prompts"):
        load_dataset(tmp_path / "empty.json")
    (tmp_path / "bad.jsonl").write_text('{"text": 3}\n')
    with pytest.raises(BenchError, match="bad.jsonl:1"):
        load_dataset(tmp_path / "bad.jsonl")
    with pytest.raises(BenchError, match="does not exist"):
        load_dataset(tmp_path / "missing.json")
    # As --max-tokens and a trace's lengths are: true is no length, and 10**21 tokens hang the server asked for them.
    for value in ("true", "1000000000000000000000"):
        (tmp_path / "long.jsonl").write_text(f'{{"prompt": "a b", "output_tokens": {value}}}\n')
        with pytest.raises(BenchError, match=r"long.jsonl:1: output_tokens must be an integer from 1 to 10000000"):
            load_dataset(tmp_path / "long.jsonl")


def test_an_empty_prompt_is_refused_at_load_naming_its_line(tmp_path):
    """An empty prompt was sent as it was: a request that measures nothing, or a 400 counted as the server's failure."""
    from hosttune.bench.dataset import load_dataset

    empty_messages = {"messages": [{"role": "system", "content": ""}, {"role": "user", "content": " "}]}
    for number, bad in ((2, {"prompt": ""}), (2, {"prompt": "  \n"}), (2, empty_messages)):
        (tmp_path / "d.jsonl").write_text(json.dumps({"prompt": "hi"}) + "\n" + json.dumps(bad) + "\n")
        with pytest.raises(BenchError, match=rf"d.jsonl:{number}: the prompt is empty"):
            load_dataset(tmp_path / "d.jsonl")
    (tmp_path / "list.json").write_text(json.dumps([{"prompt": "hi"}, {"prompt": ""}]))
    with pytest.raises(BenchError, match="list.json: entry 2: the prompt is empty"):
        load_dataset(tmp_path / "list.json")
    # An empty system message beside a question is a prompt.
    (tmp_path / "ok.jsonl").write_text(json.dumps({"messages": [
        {"role": "system", "content": ""}, {"role": "user", "content": "hi"}]}) + "\n")
    assert load_dataset(tmp_path / "ok.jsonl")[0].messages == (("system", ""), ("user", "hi"))


def test_priority_and_messages_in_the_request_body():
    from hosttune.bench.client import Client, Target

    messages = (("system", "be brief"), ("user", "hello there"))
    chat = Client(Target("http://127.0.0.1:9", "m", "chat", priority=-3)).payload(messages, 5)
    assert chat["priority"] == -3 and chat["messages"] == [
        {"role": "system", "content": "be brief"}, {"role": "user", "content": "hello there"}]
    text = Client(Target("http://127.0.0.1:9", "m")).payload(messages, 5)
    assert "priority" not in text and text["prompt"] == "be brief hello there"
