"""Work that grows with a request (a chat to render, ids to decode or write) runs off the event loop, so the
server keeps answering /health, 429s and other streams meanwhile. Measured as the loop's longest pause while the
work runs."""

import asyncio
import json
import time

import pytest

from hosttune_engine.server.prompts import PromptBuilder

# the tiny model's template, made slow to render: 10,000 messages take about half a second
SLOW_TEMPLATE = ("{% for message in messages %}{% for _ in range(1000) %}{% endfor %}"
                 "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}{% endfor %}")


@pytest.fixture
def builder(tiny_models):
    from hosttune_engine.model.tokenizer import Tokenizer

    tok = Tokenizer(tiny_models["qwen2"])
    return PromptBuilder(tok, 1024, tok.vocab_size)


async def _longest_pause(work) -> tuple[float, float]:
    """The event loop's longest pause while `work` (a coroutine) runs, and how long it ran."""
    start = last = time.monotonic()
    task = asyncio.ensure_future(work)
    longest = 0.0
    while not task.done():
        await asyncio.sleep(0.005)
        now = time.monotonic()
        longest, last = max(longest, now - last), now
    task.result()
    return longest, time.monotonic() - start


def test_a_long_chat_is_rendered_while_the_loop_keeps_running(builder):
    builder.tokenizer.chat_template = SLOW_TEMPLATE
    messages = [{"role": "user", "content": "hi"}] * 10_000
    longest, seconds = asyncio.run(_longest_pause(builder.encode_chat(messages)))
    assert longest < seconds / 4, (longest, seconds)


def test_millions_of_ids_are_decoded_while_the_loop_keeps_running(builder):
    ids = builder.tokenizer.encode("hello there friend " * 100)[:300] * 7_000  # 2.1 M ids
    longest, seconds = asyncio.run(_longest_pause(builder.decode(ids)))
    assert longest < seconds / 4, (longest, seconds)


def test_millions_of_ids_are_written_while_the_loop_keeps_running():
    from hosttune_engine.server.bodies import ids_response

    ids = list(range(1000, 3000)) * 1_000  # 2 M ids, a /tokenize answer to a few MB of text
    longest, seconds = asyncio.run(_longest_pause(ids_response({"tokens": ids, "count": len(ids)}, "tokens")))
    assert longest < seconds / 4, (longest, seconds)
    body = {"tokens": ids[:200_000], "count": 200_000, "max_model_len": 1024}  # written in slices too
    assert asyncio.run(ids_response(body, "tokens")).body == json.dumps(body, separators=(",", ":")).encode()
