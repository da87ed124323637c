import json

import pytest

from hosttune.bench.sse import parse_stream


def ev(payload):
    return b"data: " + (payload if isinstance(payload, bytes) else json.dumps(payload).encode()) + b"\n\n"


TEXT = ev({"choices": [{"index": 0, "text": " a"}]})
ROLE = ev({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})
CHAT = ev({"choices": [{"index": 0, "delta": {"content": " a"}}]})
USAGE = ev({"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 3}})
DONE = ev(b"[DONE]")


def test_each_output_event_is_timed_by_the_piece_that_completed_it():
    body = TEXT + TEXT + TEXT + USAGE + DONE
    # The second event arrives split over two pieces; the third with the usage.
    pieces = [(1.0, TEXT + TEXT[:10]), (1.5, TEXT[10:]), (2.0, TEXT + USAGE), (2.1, DONE)]
    assert b"".join(p for _, p in pieces) == body
    events = parse_stream(pieces, end=9.0)
    assert list(events.chunks) == [1.0, 1.5, 2.0]
    assert events.end == 2.1 and events.error == ""
    assert events.usage == {"prompt_tokens": 7, "completion_tokens": 3}


def test_chat_role_chunk_is_not_a_token():
    events = parse_stream([(1.0, ROLE), (2.0, CHAT), (3.0, CHAT + DONE)], end=9.0)
    assert list(events.chunks) == [2.0, 3.0]


@pytest.mark.parametrize("is_keep_text", [False, True])
def test_a_reasoning_models_thinking_is_output_under_either_name(is_keep_text):
    """vLLM streams a reasoning model's thinking as delta.reasoning (reasoning_content before its rename): read as no
    output, TTFT ran to the first token of the answer after the thinking, and the thinking's gaps were lost."""
    from hosttune.bench.sse import EventStream

    thinking = [ev({"choices": [{"index": 0, "delta": {name: " hmm"}}]}) for name in ("reasoning", "reasoning_content")]
    stream = EventStream(is_keep_text)
    for at, piece in ((1.0, ROLE), (2.0, thinking[0]), (3.0, thinking[1]), (4.0, CHAT), (5.0, DONE)):
        stream.feed(piece, at)
    events = stream.result(9.0)
    assert list(events.chunks) == [2.0, 3.0, 4.0] and events.error == ""
    assert events.text == (" hmm hmm a" if is_keep_text else "")


def test_crlf_and_comments_are_tolerated():
    body = b": keep-alive\r\n\r\n" + TEXT.replace(b"\n", b"\r\n") + DONE
    events = parse_stream([(1.0, body)], end=9.0)
    assert list(events.chunks) == [1.0] and events.error == ""


def test_error_event_inside_a_200_stream_is_a_failure():
    error = ev({"error": {"message": "out of KV blocks", "code": 500}})
    events = parse_stream([(1.0, TEXT), (2.0, error), (3.0, DONE)], end=9.0)
    assert events.error == "stream-error: out of KV blocks"
    assert events.end == 2.0 and list(events.chunks) == [1.0]


def test_a_stream_without_done_was_cut_short():
    events = parse_stream([(1.0, TEXT)], end=4.0)
    assert events.error.startswith("stream-cut") and events.end == 4.0


@pytest.mark.parametrize("bad", [b"data: {not json\n\n", b"data: 42\n\n"])
def test_garbage_events_fail_the_request(bad):
    assert parse_stream([(1.0, bad)], end=2.0).error.startswith("stream-error")


@pytest.mark.parametrize("bad", [{"choices": ["a"]}, {"choices": "a"}, {"choices": [{"delta": "x"}]},
                                 {"choices": [{"text": 5}]}, {"choices": [], "usage": [1, 2]}])
def test_events_of_the_wrong_shape_fail_the_request_not_the_client(bad):
    """A server that is not quite OpenAI's: its request fails, where the parser raised inside the socket callback
    and the request ended as a closed connection, with a traceback on the terminal."""
    assert parse_stream([(1.0, TEXT + ev(bad) + DONE)], end=2.0).error.startswith("stream-error: unexpected")


def test_usage_keeps_only_whole_token_counts():
    """null or text counts (and details that are not an object) would reach the sums and percentiles of the
    report and end the run in a TypeError: they count as not reported."""
    usage = {"prompt_tokens": "3", "completion_tokens": None, "total_tokens": True, "prompt_tokens_details": "x"}
    assert parse_stream([(1.0, TEXT + ev({"choices": [], "usage": usage}) + DONE)], end=2.0).usage == {}
    usage = {"prompt_tokens": 3, "completion_tokens": 1, "prompt_tokens_details": {"cached_tokens": 2, "other": "x"}}
    assert parse_stream([(1.0, TEXT + ev({"choices": [], "usage": usage}) + DONE)], end=2.0).usage == {
        "prompt_tokens": 3, "completion_tokens": 1, "prompt_tokens_details": {"cached_tokens": 2}}
