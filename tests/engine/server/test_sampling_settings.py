"""Penalties, logit_bias and min_tokens as the official `openai` client sees them, on the tiny Qwen2 server."""

import json
from collections import Counter

import pytest

openai = pytest.importorskip("openai")

PROMPT = "The engine reads a prompt"


def _ids(client, model, max_tokens=16, **body):
    kwargs = {k: body.pop(k) for k in ("logit_bias", "frequency_penalty", "presence_penalty") if k in body}
    choice = client.completions.create(model=model, prompt=PROMPT, max_tokens=max_tokens, temperature=0,
                                       extra_body={"return_token_ids": True, **body}, **kwargs).choices[0]
    return choice.model_extra["token_ids"], choice.finish_reason


def test_a_strong_frequency_penalty_stops_greedy_repeating(client, model):
    plain, _ = _ids(client, model, ignore_eos=True)
    penalized, _ = _ids(client, model, ignore_eos=True, frequency_penalty=2.0)
    assert max(Counter(plain).values()) > 1  # the tiny model repeats itself when greedy
    assert penalized != plain and max(Counter(penalized).values()) == 1


def test_repetition_penalty_changes_greedy_output(client, model):
    plain, _ = _ids(client, model, ignore_eos=True)
    assert _ids(client, model, ignore_eos=True, repetition_penalty=1e6)[0] != plain


def test_logit_bias_of_100_makes_greedy_output_that_token(client, model):
    ids, _ = _ids(client, model, max_tokens=6, ignore_eos=True, logit_bias={"42": 100})
    assert ids == [42] * 6


def test_min_tokens_holds_back_eos(client, model, tiny_qwen2):
    eos = json.loads((tiny_qwen2 / "config.json").read_text())["eos_token_id"]
    eos = eos[0] if isinstance(eos, list) else eos
    bias = {str(eos): 100}
    ids, reason = _ids(client, model, logit_bias=bias)
    assert (ids, reason) == ([eos], "stop")
    ids, reason = _ids(client, model, logit_bias=bias, min_tokens=4)
    assert len(ids) == 5 and ids[-1] == eos and eos not in ids[:4] and reason == "stop"


def test_a_seeded_request_with_min_p_and_a_penalty_repeats_itself(client, model):
    body = dict(model=model, prompt=PROMPT, max_tokens=8, temperature=1.0, seed=7, presence_penalty=1.0,
                extra_body={"min_p": 0.05, "ignore_eos": True})
    assert client.completions.create(**body).choices[0].text == client.completions.create(**body).choices[0].text
