"""`return_token_ids` as the official `openai` client sees it: the prompt's ids and each choice's generated ids,
whole and streamed (each chunk the ids it adds), in completions and chat; and a model folder without a
tokenizer, which serves token-id prompts (empty text, the ids in `token_ids`) and refuses text with a 400."""

import json

import pytest

from .harness import ServerProcess, metric, post

openai = pytest.importorskip("openai")

PROMPT = "The engine reads a prompt"
MESSAGES = [{"role": "user", "content": "what is the capital of France?"}]
IDS = {"return_token_ids": True}
GREEDY = dict(temperature=0, extra_body={**IDS, "ignore_eos": True})


def _client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def client(server):
    return _client(server)


@pytest.fixture(scope="module")
def no_tokenizer(tiny_qwen2, tmp_path_factory):
    """The tiny Qwen2's weights and config in a folder without its tokenizer files."""
    folder = tmp_path_factory.mktemp("no-tokenizer")
    for f in tiny_qwen2.iterdir():
        if not f.name.startswith("tokenizer"):
            (folder / f.name).symlink_to(f)
    proc = ServerProcess(folder, tmp_path_factory.mktemp("no-tokenizer-log"), ["--max-batch-size", "4"])
    proc.wait_ready()
    yield proc
    proc.terminate()


def _tokenize(server, body: dict) -> list[int]:
    status, _, raw = post(server.url + "/tokenize", body)
    assert status == 200, raw
    return json.loads(raw)["tokens"]


def _streamed_ids(chunks) -> tuple[dict[int, list[int]], dict[int, list], dict[int, str]]:
    """Per choice: the token ids the chunks add up to, each chunk's prompt_token_ids, and the text."""
    ids, prompts, texts = {}, {}, {}
    for c in chunks:
        for ch in c.choices:
            ids[ch.index] = ids.get(ch.index, []) + ch.model_extra["token_ids"]
            prompts.setdefault(ch.index, []).append(ch.model_extra.get("prompt_token_ids"))
            texts[ch.index] = texts.get(ch.index, "") + ch.text
    return ids, prompts, texts


def test_completion_returns_the_prompt_and_generated_ids(client, server):
    r = client.completions.create(model=None, prompt=PROMPT, max_tokens=12, n=2, seed=5, temperature=1.0,
                                  extra_body={**IDS, "ignore_eos": True, "skip_special_tokens": False})
    prompt_ids = _tokenize(server, {"prompt": PROMPT})
    for choice in r.choices:
        assert choice.model_extra["prompt_token_ids"] == prompt_ids
        assert len(choice.model_extra["token_ids"]) == 12
        status, _, raw = post(server.url + "/detokenize", {"tokens": choice.model_extra["token_ids"]})
        assert status == 200 and json.loads(raw)["prompt"] == choice.text  # the ids are what the text says
    assert r.usage.completion_tokens == 24 and r.usage.prompt_tokens == len(prompt_ids)  # n samples of one prompt
    plain = client.completions.create(model=None, prompt=PROMPT, max_tokens=2)
    assert "token_ids" not in plain.choices[0].model_extra and "prompt_token_ids" not in plain.choices[0].model_extra


def test_each_token_id_prompt_comes_back_in_its_own_choices(client):
    r = client.completions.create(model=None, prompt=[[1, 2, 3], [4, 5]], max_tokens=3, n=2, **GREEDY)
    assert [c.model_extra["prompt_token_ids"] for c in r.choices] == [[1, 2, 3], [1, 2, 3], [4, 5], [4, 5]]
    assert all(len(c.model_extra["token_ids"]) == 3 for c in r.choices)


def test_streamed_completion_ids_add_up_to_the_whole(client):
    kwargs = dict(model=None, prompt=[PROMPT, "Hello"], max_tokens=10, n=2, **GREEDY)
    whole = client.completions.create(**kwargs)
    ids, prompts, texts = _streamed_ids(client.completions.create(stream=True, **kwargs))
    assert ids == {c.index: c.model_extra["token_ids"] for c in whole.choices}
    assert texts == {c.index: c.text for c in whole.choices}
    for c in whole.choices:  # the prompt's ids in a choice's first chunk only, as vLLM sends them
        first, *rest = prompts[c.index]
        assert first == c.model_extra["prompt_token_ids"] and rest == [None] * len(rest)


def test_ids_held_back_with_their_text_still_stream(client):
    # Text that could still become a stop string is held back; the ids of its tokens go out as they come (in a
    # chunk with empty text if nothing else came with them) and add up to the ids of the whole answer. This
    # stop string starts with two characters of the answer, so those wait until the next token rules it out.
    kwargs = dict(model=None, prompt=PROMPT, max_tokens=24, **GREEDY)
    full = client.completions.create(**kwargs).choices[0].text
    kwargs["stop"] = [full[6:8] + "\x00\x01"]
    whole = client.completions.create(**kwargs).choices[0]
    assert whole.text == full and whole.finish_reason == "length"
    chunks = list(client.completions.create(stream=True, **kwargs))
    ids, _, texts = _streamed_ids(chunks)
    assert ids[0] == whole.model_extra["token_ids"] and texts[0] == whole.text
    assert all(c.choices[0].model_extra["token_ids"] for c in chunks)


def test_chat_returns_the_prompt_once_and_each_choices_ids(client, server):
    kwargs = dict(model=None, messages=MESSAGES, max_tokens=8, n=2, **GREEDY)
    whole = client.chat.completions.create(**kwargs)
    assert whole.model_extra["prompt_token_ids"] == _tokenize(server, {"messages": MESSAGES})
    assert [len(c.model_extra["token_ids"]) for c in whole.choices] == [8, 8]
    assert "prompt_token_ids" not in whole.choices[0].model_extra
    chunks = list(client.chat.completions.create(stream=True, **kwargs))
    openings = [c for c in chunks if c.choices and c.choices[0].delta.role]
    assert len(openings) == 2 and all(c.model_extra["prompt_token_ids"] == whole.model_extra["prompt_token_ids"]
                                      for c in openings)
    rest = [c for c in chunks if c not in openings]
    assert all("prompt_token_ids" not in c.model_extra for c in rest)
    ids = {}
    for c in rest:
        for ch in c.choices:
            ids[ch.index] = ids.get(ch.index, []) + ch.model_extra["token_ids"]
    assert ids == {c.index: c.model_extra["token_ids"] for c in whole.choices}


@pytest.mark.parametrize("value, message", [
    ("yes", "return_token_ids must be a boolean, got a string"),
    (2, "return_token_ids must be a boolean, got number 2"),
    ([True], "return_token_ids must be a boolean, got an array"),
])
def test_a_value_that_is_not_a_boolean_is_a_400(client, value, message):
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model=None, prompt=PROMPT, max_tokens=2, extra_body={"return_token_ids": value})
    assert err.value.body["message"] == message and err.value.body["param"] == "return_token_ids"
    with pytest.raises(openai.BadRequestError, match=message):
        client.chat.completions.create(model=None, messages=MESSAGES, max_tokens=2,
                                       extra_body={"return_token_ids": value})
    r = client.completions.create(model=None, prompt=PROMPT, max_tokens=2, extra_body={"return_token_ids": None})
    assert "token_ids" not in r.choices[0].model_extra  # null is the default, as for every field


def test_without_a_tokenizer_token_ids_in_give_token_ids_out(no_tokenizer, client):
    bare = _client(no_tokenizer)
    kwargs = dict(model=None, prompt=[[1, 2, 3], [7, 8]], max_tokens=6, **GREEDY)
    whole = bare.completions.create(**kwargs)
    assert [c.text for c in whole.choices] == ["", ""]  # no tokenizer, no text: the ids are the output
    assert [c.model_extra["prompt_token_ids"] for c in whole.choices] == [[1, 2, 3], [7, 8]]
    with_tokenizer = client.completions.create(**kwargs)  # the same weights: the same greedy tokens
    assert [c.model_extra["token_ids"] for c in whole.choices] == \
        [c.model_extra["token_ids"] for c in with_tokenizer.choices]
    chunks = list(bare.completions.create(stream=True, **kwargs))
    ids, _, texts = _streamed_ids(chunks)
    assert ids == {c.index: c.model_extra["token_ids"] for c in whole.choices} and texts == {0: "", 1: ""}
    assert len(chunks) > 2  # the ids stream as they come, not only at the end


def test_without_a_tokenizer_text_is_a_400_naming_why(no_tokenizer):
    bare = _client(no_tokenizer)
    with pytest.raises(openai.BadRequestError) as text:
        bare.completions.create(model=None, prompt=PROMPT, max_tokens=2, extra_body=IDS)
    assert text.value.body["message"] == ("this model has no tokenizer (tokenizer.json) for text prompts; "
                                          "send token ids instead")
    assert text.value.body["param"] == "prompt"
    with pytest.raises(openai.BadRequestError, match="no tokenizer .* for chat messages; send token ids to "
                                                     "/v1/completions"):
        bare.chat.completions.create(model=None, messages=MESSAGES, max_tokens=2, extra_body=IDS)
    ids = [1, 2, 3]
    with pytest.raises(openai.BadRequestError, match="stop strings need a tokenizer"):
        bare.completions.create(model=None, prompt=ids, max_tokens=2, stop=["x"], extra_body=IDS)
    with pytest.raises(openai.BadRequestError, match="no tokenizer .* for logprobs"):
        bare.completions.create(model=None, prompt=ids, max_tokens=2, logprobs=1, extra_body=IDS)
    for path, body in (("/tokenize", {"prompt": "hi"}), ("/detokenize", {"tokens": ids})):
        status, _, raw = post(no_tokenizer.url + path, body)
        assert status == 400 and "this model has no tokenizer (tokenizer.json)" in json.loads(raw)["error"]["message"]
    assert "Traceback" not in no_tokenizer.log()


def test_a_request_the_engine_refuses_is_a_400_left_out_of_the_request_metrics(no_tokenizer):
    # as a 400 of the server's own checks: no finished (aborted) request, no prompt tokens, no latency
    names = [("vllm:request_success_total", {"finished_reason": "abort"}), ("vllm:request_prompt_tokens_count", {}),
             ("vllm:request_prompt_tokens_sum", {}), ("vllm:e2e_request_latency_seconds_count", {}),
             ("vllm:prompt_tokens_total", {})]
    before = no_tokenizer.metrics()
    status, _, raw = post(no_tokenizer.url + "/v1/completions", {"prompt": [1, 2, 3], "stop": ["x"]})
    assert status == 400 and "stop strings need a tokenizer" in json.loads(raw)["error"]["message"]
    after = no_tokenizer.metrics()
    assert [metric(after, n, **labels) - metric(before, n, **labels) for n, labels in names] == [0] * len(names)
