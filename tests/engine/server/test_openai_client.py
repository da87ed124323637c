"""The server as the official `openai` client sees it: completions and chat, streaming and not,
n, stop sequences, include_usage, logprobs, seeds, and streamed text equal to whole text when greedy."""

import json
import shutil
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from .harness import ServerProcess, post

openai = pytest.importorskip("openai")

PROMPT = "The engine reads a prompt"
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "what is the capital of France?"}]


def _stream_completion(client, **kwargs):
    chunks = list(client.completions.create(stream=True, **kwargs))
    texts = {}
    for c in chunks:
        for ch in c.choices:
            texts[ch.index] = texts.get(ch.index, "") + ch.text
    return chunks, texts


def _stream_chat(client, **kwargs):
    chunks = list(client.chat.completions.create(stream=True, **kwargs))
    texts, roles = {}, {}
    for c in chunks:
        for ch in c.choices:
            texts[ch.index] = texts.get(ch.index, "") + (ch.delta.content or "")
            roles[ch.index] = roles.get(ch.index) or ch.delta.role
    return chunks, texts, roles


def test_models_lists_the_served_model(client, server, tiny_qwen2):
    models = client.models.list().data
    assert [m.id for m in models] == [str(tiny_qwen2)]


def test_completion_greedy_streamed_equals_whole(client, model):
    whole = client.completions.create(model=model, prompt=PROMPT, max_tokens=24, temperature=0,
                                      extra_body={"ignore_eos": True})
    (choice,) = whole.choices
    assert choice.finish_reason == "length"
    assert whole.usage.completion_tokens == 24 and whole.usage.prompt_tokens > 0
    assert whole.usage.total_tokens == whole.usage.prompt_tokens + 24
    chunks, texts = _stream_completion(client, model=model, prompt=PROMPT, max_tokens=24, temperature=0,
                                       extra_body={"ignore_eos": True})
    assert texts[0] == choice.text
    assert chunks[-1].choices[0].finish_reason == "length"
    assert all(c.id == chunks[0].id for c in chunks)


def test_chat_greedy_streamed_equals_whole(client, model):
    whole = client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=20, temperature=0)
    (choice,) = whole.choices
    assert choice.message.role == "assistant"
    assert choice.finish_reason in ("stop", "length")
    chunks, texts, roles = _stream_chat(client, model=model, messages=MESSAGES, max_tokens=20, temperature=0)
    assert texts[0] == choice.message.content
    assert roles[0] == "assistant"
    assert chunks[0].object == "chat.completion.chunk"
    assert chunks[-1].choices[0].finish_reason == choice.finish_reason


def test_chat_default_max_tokens_fills_the_context(client, model, server):
    """Without max_tokens, chat may run to the end of the context (ignore_eos makes it do so)."""
    r = client.chat.completions.create(model=model, messages=MESSAGES, temperature=0,
                                       extra_body={"ignore_eos": True, "max_completion_tokens": 40})
    assert r.usage.completion_tokens == 40


def test_a_completion_with_max_tokens_null_runs_to_the_end_of_the_context(client, model, server):
    """As vLLM: max_tokens left out is 16, null is whatever room the context leaves (chat's are both the room)."""
    body = {"model": model, "prompt": PROMPT, "temperature": 0, "ignore_eos": True}
    status, _, raw = post(server.url + "/v1/completions", {**body, "max_tokens": None})
    usage = json.loads(raw)["usage"]
    context = client.models.list().data[0].model_extra["max_model_len"]
    assert status == 200 and usage["prompt_tokens"] + usage["completion_tokens"] == context
    status, _, raw = post(server.url + "/v1/completions", body)
    assert status == 200 and json.loads(raw)["usage"]["completion_tokens"] == 16


def test_n_choices_streamed_and_whole(client, model):
    whole = client.completions.create(model=model, prompt=PROMPT, max_tokens=8, n=3, temperature=1.0, seed=7,
                                      extra_body={"ignore_eos": True})
    assert sorted(c.index for c in whole.choices) == [0, 1, 2]
    assert whole.usage.completion_tokens == 3 * 8
    assert len({c.text for c in whole.choices}) > 1, "seeded choices of one request must differ"
    _, texts = _stream_completion(client, model=model, prompt=PROMPT, max_tokens=8, n=3, temperature=1.0, seed=7,
                                  extra_body={"ignore_eos": True})
    assert texts == {c.index: c.text for c in whole.choices}, "same seed: same samples, streamed or not"
    chat = client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=6, n=2, temperature=0)
    assert [c.index for c in chat.choices] == [0, 1]
    assert chat.choices[0].message.content == chat.choices[1].message.content  # greedy


def test_batch_prompts_get_n_choices_each(client, model):
    r = client.completions.create(model=model, prompt=["Hello", "The quick brown fox"], max_tokens=4, n=2,
                                  temperature=0)
    assert [c.index for c in r.choices] == [0, 1, 2, 3]
    assert r.choices[0].text == r.choices[1].text and r.choices[2].text == r.choices[3].text


def _ascii_stop(text: str) -> str:
    """A two-letter string that first occurs a few characters into `text`."""
    for i in range(3, len(text) - 1):
        s = text[i:i + 2]
        if s.isascii() and s.isalpha() and text.index(s) == i:
            return s
    pytest.skip(f"no usable stop string in {text!r}")


def test_stop_sequences(client, model):
    full = client.completions.create(model=model, prompt=PROMPT, max_tokens=48, temperature=0,
                                     extra_body={"ignore_eos": True}).choices[0].text
    stop = _ascii_stop(full)
    expected = full[:full.index(stop)]
    whole = client.completions.create(model=model, prompt=PROMPT, max_tokens=48, temperature=0, stop=[stop, "\x00\x01"],
                                      extra_body={"ignore_eos": True})
    assert whole.choices[0].text == expected
    assert whole.choices[0].finish_reason == "stop"
    assert whole.choices[0].model_extra["stop_reason"] == stop
    chunks, texts = _stream_completion(client, model=model, prompt=PROMPT, max_tokens=48, temperature=0, stop=stop,
                                       extra_body={"ignore_eos": True})
    assert texts[0] == expected
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_include_usage_chunk(client, model):
    chunks, texts = _stream_completion(client, model=model, prompt=PROMPT, max_tokens=10, temperature=0,
                                       stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
    last = chunks[-1]
    assert last.choices == [] and last.usage.completion_tokens == 10
    assert last.usage.total_tokens == last.usage.prompt_tokens + 10
    assert all(c.usage is None for c in chunks[:-1])
    chat_chunks, _, _ = _stream_chat(client, model=model, messages=MESSAGES, max_tokens=5, temperature=0,
                                     stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
    assert chat_chunks[-1].usage.completion_tokens == 5
    plain, _ = _stream_completion(client, model=model, prompt=PROMPT, max_tokens=3, temperature=0)
    assert all(c.usage is None for c in plain)


def test_continuous_usage_stats_put_each_choices_counts_so_far_in_every_chunk(client, model):
    # vLLM's stream_options.continuous_usage_stats (with include_usage): a chunk's usage is its choice's
    # prompt and the tokens generated so far; the last chunk has the whole request's
    options = {"include_usage": True, "continuous_usage_stats": True}
    chunks, _ = _stream_completion(client, model=model, prompt=PROMPT, max_tokens=6, temperature=0,
                                   stream_options=options, extra_body={"ignore_eos": True})
    *body, last = chunks
    prompt = last.usage.prompt_tokens
    so_far = [c.usage.completion_tokens for c in body]
    assert so_far == sorted(so_far) and so_far[-1] == 6 and last.usage.completion_tokens == 6
    assert all(c.usage.prompt_tokens == prompt and c.usage.total_tokens == prompt + c.usage.completion_tokens
               for c in body)
    chat, _, _ = _stream_chat(client, model=model, messages=MESSAGES, max_tokens=4, temperature=0, n=2,
                              stream_options=options, extra_body={"ignore_eos": True})
    *body, last = chat
    assert [c.usage.completion_tokens for c in body[:2]] == [0, 0]  # the role chunks
    assert {c.choices[0].index: c.usage.completion_tokens for c in body} == {0: 4, 1: 4}
    assert last.usage.completion_tokens == 8 and last.usage.prompt_tokens == body[0].usage.prompt_tokens


def test_logprobs(client, model):
    r = client.completions.create(model=model, prompt=PROMPT, max_tokens=5, temperature=0, logprobs=3,
                                  extra_body={"ignore_eos": True})
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 5
    for chosen, top in zip(lp.token_logprobs, lp.top_logprobs):
        assert chosen <= 0 and len(top) <= 3 and abs(max(top.values()) - chosen) < 1e-4  # greedy: the best
    chat = client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=4, temperature=0, logprobs=True,
                                          top_logprobs=2, extra_body={"ignore_eos": True})
    content = chat.choices[0].logprobs.content
    assert len(content) == 4 and all(len(t.top_logprobs) == 2 for t in content)
    chunks, _, _ = _stream_chat(client, model=model, messages=MESSAGES, max_tokens=4, temperature=0, logprobs=True,
                                extra_body={"ignore_eos": True})
    streamed = [t for c in chunks for ch in c.choices if ch.logprobs for t in ch.logprobs.content]
    assert [t.logprob for t in streamed] == pytest.approx([t.logprob for t in content], abs=1e-5)


@pytest.mark.parametrize("k", [0, 1])
def test_completion_top_logprobs_hold_the_sampled_token(client, model, k):
    # As OpenAI and vLLM answer: the k best alternatives and the sampled token, so up to k + 1 entries
    # (logprobs=0 gives the sampled token alone). Hot sampling picks tokens outside the best one.
    kwargs = dict(model=model, prompt=PROMPT, max_tokens=12, temperature=5.0, seed=3, logprobs=k,
                  extra_body={"ignore_eos": True})
    whole = client.completions.create(**kwargs).choices[0].logprobs
    chunks, _ = _stream_completion(client, **kwargs)
    streamed = [(t, lp, top) for c in chunks for ch in c.choices if ch.logprobs
                for t, lp, top in zip(ch.logprobs.tokens, ch.logprobs.token_logprobs, ch.logprobs.top_logprobs)]
    for lps in (list(zip(whole.tokens, whole.token_logprobs, whole.top_logprobs)), streamed):
        assert len(lps) == 12
        assert all(top[token] == lp and len(top) <= k + 1 for token, lp, top in lps)
    assert k == 0 or any(len(top) == 2 for _, _, top in streamed)  # some sampled token was not the best


def test_chat_logprob_bytes_are_the_tokens_own_bytes(client, model):
    # OpenAI's `bytes`: what a token stands for, a part of a character included, so that the bytes of the tokens
    # joined are the text. The tiny model's vocabulary is mostly single bytes: its random text splits characters.
    chat = client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=40, temperature=1.0, seed=11,
                                          logprobs=True, top_logprobs=2,
                                          extra_body={"ignore_eos": True, "skip_special_tokens": False})
    tokens = chat.choices[0].logprobs.content
    raw = b"".join(bytes(t.bytes) for t in tokens)
    assert raw.decode("utf-8", errors="replace") == chat.choices[0].message.content
    assert any(bytes(t.bytes)[:1] >= b"\x80" and t.token == "\ufffd" for t in tokens)  # parts of characters
    for t in tokens:
        for alt in t.top_logprobs:
            assert alt.token == bytes(alt.bytes).decode("utf-8", errors="replace")


def test_seed_reproducible_and_sampling_options(client, model):
    kwargs = dict(model=model, prompt=PROMPT, max_tokens=12, temperature=1.0, top_p=0.9, seed=1234,
                  extra_body={"top_k": 50, "ignore_eos": True})
    a = client.completions.create(**kwargs).choices[0].text
    b = client.completions.create(**kwargs).choices[0].text
    assert a == b


def test_seeds_differing_past_32_bits_sample_differently(client, model):
    """Every seed vLLM takes (signed 64-bit) is its own stream, where the CPU's generator read the low 32 bits
    alone: 5, 5 + 2**32 and 5 + 2**40 sampled the same text, as did -1 and 2**32 - 1."""
    def text(seed):
        return client.completions.create(model=model, prompt=PROMPT, max_tokens=16, temperature=1.0, seed=seed,
                                         extra_body={"ignore_eos": True}).choices[0].text

    seeds = [5, 5 + 2**32, 5 + 2**40, -1, 2**32 - 1, 2**63 - 1]
    texts = [text(seed) for seed in seeds]
    assert len(set(texts)) == len(seeds), texts
    assert text(5 + 2**40) == texts[2] and text(-1) == texts[3]


def test_continue_final_message_continues_the_assistants_message(client, model, server):
    """A prefilled assistant message is continued, not closed and answered: its prompt is the chat cut after it."""
    messages = MESSAGES + [{"role": "assistant", "content": "The capital is"}]
    chat = client.chat.completions.create(model=model, messages=messages, max_tokens=3, temperature=0,
                                          extra_body={"continue_final_message": True, "add_generation_prompt": False,
                                                      "return_token_ids": True})
    prompt = chat.model_extra["prompt_token_ids"]
    closed = json.loads(post(server.url + "/tokenize", {"messages": messages, "add_generation_prompt": False})[2])
    assert len(prompt) < closed["count"] and closed["tokens"][:len(prompt)] == prompt
    text = json.loads(post(server.url + "/detokenize", {"tokens": prompt})[2])["prompt"]
    assert text.endswith("assistant\nThe capital is"), text
    assert chat.choices[0].finish_reason == "length" and chat.usage.prompt_tokens == len(prompt)


def test_tokenize_counts_a_continued_chat_as_chat_reads_it(server):
    """/tokenize takes continue_final_message as chat does, where it ignored it and counted the closed message."""
    messages = MESSAGES + [{"role": "assistant", "content": "The capital is"}]
    body = {"messages": messages, "add_generation_prompt": False, "continue_final_message": True, "max_tokens": 1}
    chat = json.loads(post(server.url + "/v1/chat/completions", {**body, "return_token_ids": True})[2])
    tok = json.loads(post(server.url + "/tokenize", body)[2])
    assert tok["tokens"] == chat["prompt_token_ids"] and tok["count"] == chat["usage"]["prompt_tokens"]
    status, _, raw = post(server.url + "/tokenize", {"messages": messages, "continue_final_message": True})
    assert status == 400 and json.loads(raw)["error"]["param"] == "continue_final_message"


def test_a_request_that_leaves_sampling_out_samples_as_generation_config_says(tiny_qwen2, tmp_path):
    """As vLLM reads a model's generation_config.json: its temperature, top_p and top_k are the defaults of a
    request that leaves them out (here temperature 0: greedy), where the API's own (temperature 1) were."""
    folder = tmp_path / "model"
    shutil.copytree(tiny_qwen2, folder)
    settings = json.loads((folder / "generation_config.json").read_text())
    (folder / "generation_config.json").write_text(json.dumps({**settings, "temperature": 0.0, "top_k": 50,
                                                               "repetition_penalty": 1.1}))
    server = ServerProcess(folder, tmp_path, ["--skip-warmup"])
    try:
        server.wait_ready()
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60)
        model = client.models.list().data[0].id
        kwargs = dict(model=model, prompt=PROMPT, max_tokens=12, extra_body={"ignore_eos": True})
        greedy = client.completions.create(temperature=0, **kwargs).choices[0].text
        left_out = {client.completions.create(seed=seed, **kwargs).choices[0].text for seed in (1, 2, 3)}
        sampled = {client.completions.create(seed=seed, temperature=1.0, **kwargs).choices[0].text
                   for seed in (1, 2, 3)}
    finally:
        server.terminate()
    assert left_out == {greedy} and len(sampled) > 1
    log = server.log()
    assert "sampling defaults from generation_config.json: temperature 0.0" in log
    assert "sampling defaults from generation_config.json: temperature 0.0, repetition_penalty 1.1" in log


def test_a_client_request_id_names_the_answer_as_vllm_names_it(client, model, server):
    """X-Request-Id: the answer's id is "cmpl-" (or "chatcmpl-") + it, every chunk of a stream too, and the log line
    names it; two requests that send the same id both run, each by its own id in the engine."""
    def whole(request_id):
        return client.completions.create(model=model, prompt=PROMPT, max_tokens=2,
                                         extra_headers={"X-Request-Id": request_id})

    with ThreadPoolExecutor(2) as pool:
        ids = [c.id for c in pool.map(whole, ["trace-7", "trace-7"])]
    chat = client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=2,
                                          extra_headers={"X-Request-Id": "trace-8"})
    chunks = list(client.completions.create(model=model, prompt=PROMPT, max_tokens=3, stream=True,
                                            extra_headers={"X-Request-Id": "trace-9"}))
    assert ids == ["cmpl-trace-7", "cmpl-trace-7"] and chat.id == "chatcmpl-trace-8"
    assert {c.id for c in chunks} == {"cmpl-trace-9"}
    deadline = time.monotonic() + 10  # the log line is written once the stream's last byte is out
    while "request cmpl-trace-9 status=200" not in server.log() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert "request cmpl-trace-9 status=200" in server.log()
    assert whole("").id.startswith("cmpl-") and len(whole("").id) > len("cmpl-")  # empty: none sent


def test_bad_request_surfaces_as_openai_error(client, model):
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model=model, prompt=PROMPT, max_tokens=100_000)
    assert "maximum context length is 1024 tokens" in str(err.value)
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="no-such-model", prompt=PROMPT, max_tokens=2)


def test_tokenize_and_detokenize(server):
    status, _, body = post(server.url + "/tokenize", {"prompt": "Hello there"})
    tok = json.loads(body)
    assert status == 200 and tok["count"] == len(tok["tokens"]) > 0 and tok["max_model_len"] == 1024
    status, _, body = post(server.url + "/detokenize", {"tokens": tok["tokens"]})
    assert status == 200 and json.loads(body)["prompt"] == "Hello there"
    status, _, body = post(server.url + "/tokenize", {"messages": MESSAGES})
    chat = json.loads(body)
    assert status == 200 and chat["count"] > tok["count"]


def test_tokenized_messages_count_as_the_chat_prompt_with_the_same_template_kwargs(client, model, server):
    kwargs = {"add_generation_prompt": False}
    chat = client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=1,
                                          extra_body={"chat_template_kwargs": kwargs})
    status, _, body = post(server.url + "/tokenize", {"messages": MESSAGES, "chat_template_kwargs": kwargs})
    assert status == 200 and json.loads(body)["count"] == chat.usage.prompt_tokens
