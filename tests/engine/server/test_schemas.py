"""Request parsing as data: this body gives these options, or this 400 message (no server needed)."""

import asyncio
import json

import pytest

from hosttune_engine.server.prompts import PromptBuilder
from hosttune_engine.server.api_errors import ApiError
from hosttune_engine.server.schemas.chat import ChatRequest
from hosttune_engine.server.schemas.completion import CompletionRequest
from hosttune_engine.server.schemas.tokenize import TokenizeRequest

PARSED = [
    ({"prompt": "hi"}, dict(n=1, max_tokens=None, default_max_tokens=16, temperature=1.0, top_k=0, stop=(),
                            stream=False)),
    ({"prompt": "hi", "max_tokens": None}, dict(max_tokens=None, default_max_tokens=None)),  # vLLM: the context's
    ({"prompt": "hi", "max_tokens": 7, "temperature": 0, "top_k": -1, "top_p": 0.5, "seed": -3, "n": 2},
     dict(max_tokens=7, temperature=0.0, top_k=-1, top_p=0.5, seed=-3, n=2)),
    ({"prompt": "hi", "stop": "x"}, dict(stop=("x",))),
    ({"prompt": "hi", "stop": ["a", "bc"], "stop_token_ids": [3]}, dict(stop=("a", "bc"), stop_token_ids=(3,))),
    ({"prompt": "hi", "stream": True, "stream_options": {"include_usage": True}},
     dict(stream=True, include_usage=True)),
    ({"prompt": "hi", "logprobs": 0}, dict(logprobs=0)),
    ({"prompt": "hi", "priority": -2, "user": "u1", "unknown_field": {"x": 1}}, dict(priority=-2)),
    ({"prompt": "hi", "max_tokens": None, "temperature": None, "presence_penalty": 0, "best_of": 1}, dict()),
    ({"prompt": "hi"}, dict(return_token_ids=False)),
    ({"prompt": "hi", "return_token_ids": True}, dict(return_token_ids=True)),
    ({"prompt": "hi", "return_token_ids": None}, dict(return_token_ids=False)),
]


@pytest.mark.parametrize("body,expected", PARSED)
def test_completion_options(body, expected):
    options = CompletionRequest.parse(body).options
    assert {k: getattr(options, k) for k in expected} == expected


@pytest.mark.parametrize("prompt,expected", [
    ("hi", ("hi",)), (["a", "b"], ("a", "b")), ([1, 2, 3], ((1, 2, 3),)), ([[1], [2, 3]], ((1,), (2, 3))),
])
def test_prompt_forms(prompt, expected):
    assert CompletionRequest.parse({"prompt": prompt}).prompts == expected


@pytest.mark.parametrize("body,message", [
    ({"prompt": ["a", 1]}, "prompt must be a string, an array of strings"),
    ({"prompt": "hi", "best_of": 3}, "best_of is not supported"),
    ({"prompt": "hi", "logit_bias": {"x": 5}}, "logit_bias keys must be token ids"),
    ({"prompt": "hi", "logit_bias": {"1": "5"}}, "logit_bias[1] must be a finite number, got a string"),
    ({"prompt": "hi", "logit_bias": [1]}, "logit_bias must be an object of token ids to biases"),
    ({"prompt": "hi", "presence_penalty": 2.5}, "presence_penalty must be at most 2, got 2.5"),
    ({"prompt": "hi", "frequency_penalty": -3}, "frequency_penalty must be at least -2, got -3"),
    ({"prompt": "hi", "repetition_penalty": 0}, "repetition_penalty must be greater than zero, got 0"),
    ({"prompt": "hi", "min_p": 1.5}, "min_p must be at most 1, got 1.5"),
    ({"prompt": "hi", "min_tokens": -1}, "min_tokens must be at least 0, got -1"),
    ({"prompt": "hi", "temperature": float("inf")}, "finite number, got number inf"),
    ({"prompt": "hi", "max_tokens": "x" * 100_000}, "max_tokens must be an integer, got a string"),
])
def test_completion_errors(body, message):
    with pytest.raises(ApiError) as err:
        CompletionRequest.parse(body)
    assert message in err.value.message and err.value.status == 400 and len(err.value.message) < 200


@pytest.mark.parametrize("field,value", [
    ("use_beam_search", True), ("prompt_logprobs", 0), ("truncate_prompt_tokens", 8),
    ("allowed_token_ids", [1, 2]), ("bad_words", ["x"]), ("guided_json", {"type": "object"}), ("guided_regex", "a+"),
    ("guided_choice", ["a", "b"]), ("guided_grammar", "root ::= 'a'"), ("structured_outputs", {"json": {}}),
    ("response_format", {"type": "json_object"}),
])
def test_fields_that_change_the_output_are_refused_not_ignored(field, value):
    # ignored, each would answer 200 with text the client did not ask for
    for parse, body in ((CompletionRequest.parse, {"prompt": "hi"}),
                        (ChatRequest.parse, {"messages": [{"role": "user", "content": "x"}]})):
        with pytest.raises(ApiError) as err:
            parse({**body, field: value})
        assert err.value.param == field and "not supported" in err.value.message
    neutral = {"use_beam_search": False, "bad_words": [], "response_format": {"type": "text"}}
    if field in neutral:
        assert CompletionRequest.parse({"prompt": "hi", field: neutral[field]}).options.n == 1


def test_penalties_min_p_min_tokens_and_logit_bias_reach_the_sampling_params():
    options = CompletionRequest.parse({"prompt": "hi", "presence_penalty": 0.5, "frequency_penalty": -1,
                                       "repetition_penalty": 1.2, "min_p": 0.1, "min_tokens": 3,
                                       "logit_bias": {"7": 250, "9": -1.5}}).options
    params = options.sampling(16)
    assert (params.presence_penalty, params.frequency_penalty, params.repetition_penalty, params.min_p,
            params.min_tokens, params.logit_bias) == (0.5, -1.0, 1.2, 0.1, 3, ((7, 100.0), (9, -1.5)))
    with pytest.raises(ApiError) as err:
        options.sampling(2)
    assert err.value.message == "min_tokens must be less than or equal to max_tokens=2, got 3."


def test_a_logit_bias_token_outside_the_vocabulary_is_one_line_naming_it():
    options = CompletionRequest.parse({"prompt": "hi", "logit_bias": {"3": 1, "500": 1}}).options
    with pytest.raises(ApiError) as err:
        PromptBuilder(None, 64, 100).check_logit_bias(options.logit_bias)
    assert (err.value.message, err.value.param) == ("logit_bias: token id 500 is out of the vocabulary [0, 100)",
                                                    "logit_bias")
    PromptBuilder(None, 64, 501).check_logit_bias(options.logit_bias)


def test_every_boolean_field_takes_0_and_1_as_vllm_does():
    """continue_final_message: 0 is false wherever vLLM's lax booleans read it so; 2 and "yes" stay one-line 400s."""
    chat = {"messages": [{"role": "user", "content": "x"}]}
    req = ChatRequest.parse({**chat, "continue_final_message": 1, "add_generation_prompt": 0, "logprobs": 1,
                             "add_special_tokens": 1.0, "stream": 1, "stream_options": {"include_usage": 1}})
    assert (req.continue_final_message, req.add_generation_prompt, req.add_special_tokens) == (True, False, True)
    assert (req.options.logprobs, req.options.stream, req.options.include_usage) == (0, True, True)
    req = CompletionRequest.parse({"prompt": "hi", "echo": 0, "ignore_eos": 1, "skip_special_tokens": 0,
                                   "include_stop_str_in_output": 1, "return_token_ids": 1})
    got = (req.echo, req.options.ignore_eos, req.options.skip_special_tokens, req.options.include_stop_str_in_output,
           req.options.return_token_ids)
    assert got == (False, True, False, True, True) and all(type(v) is bool for v in got)
    assert TokenizeRequest.parse({**chat, "continue_final_message": 0}).continue_final_message is False
    for value, what in ((2, "number 2"), ("yes", "a string"), (0.5, "number 0.5")):
        with pytest.raises(ApiError) as err:
            ChatRequest.parse({**chat, "continue_final_message": value})
        assert (err.value.message, err.value.param) == (f"continue_final_message must be a boolean, got {what}",
                                                        "continue_final_message")


def test_integral_floats_are_read_as_integers_as_vllm_reads_them():
    """A client that writes every number as a float (16.0) gets what 16 gets; 16.5 is still one line naming it."""
    options = CompletionRequest.parse({"prompt": "hi", "max_tokens": 16.0, "n": 2.0, "seed": 3.0, "top_k": 5.0,
                                       "priority": -1.0, "logprobs": 2.0, "best_of": 2.0}).options
    got = (options.max_tokens, options.n, options.seed, options.top_k, options.priority, options.logprobs)
    assert got == (16, 2, 3, 5, -1, 2) and all(type(v) is int for v in got)
    chat = ChatRequest.parse({"messages": [{"role": "user", "content": "x"}], "max_completion_tokens": 9.0,
                              "logprobs": True, "top_logprobs": 3.0}).options
    assert (chat.max_tokens, chat.logprobs) == (9, 3)
    for field, value in (("max_tokens", 16.5), ("n", 2.5), ("seed", 3.25), ("top_k", float("inf")), ("n", 1e308)):
        with pytest.raises(ApiError) as err:
            CompletionRequest.parse({"prompt": "hi", field: value})
        assert (err.value.message, err.value.param) == (f"{field} must be an integer, got number {value}", field)
    with pytest.raises(ApiError) as err:
        ChatRequest.parse({"messages": [{"role": "user", "content": "x"}], "max_completion_tokens": 0.5})
    assert err.value.param == "max_completion_tokens" and "must be an integer" in err.value.message


def test_the_models_sampling_defaults_fill_what_a_request_leaves_out(tmp_path):
    from hosttune_engine.server.sampling_defaults import SamplingDefaults

    (tmp_path / "generation_config.json").write_text(json.dumps(
        {"do_sample": True, "temperature": 0.7, "top_p": 0.8, "top_k": 20, "repetition_penalty": 1.05,
         "min_p": 0.05, "max_new_tokens": 64}))
    defaults = SamplingDefaults.read(str(tmp_path))
    assert defaults == SamplingDefaults(0.7, 0.8, 20, ("max_new_tokens=64",), 1.05, 0.05)
    options = defaults.fill(CompletionRequest.parse({"prompt": "hi", "temperature": 0.2, "top_p": None}).options)
    assert (options.temperature, options.top_p, options.top_k) == (0.2, 0.8, 20)  # null: left out, as in vLLM
    assert (options.repetition_penalty, options.min_p) == (1.05, 0.05)
    options = defaults.fill(CompletionRequest.parse({"prompt": "hi", "repetition_penalty": 1, "min_p": 0}).options)
    assert (options.repetition_penalty, options.min_p) == (1.0, 0.0)
    # transformers' own defaults (top_k 50) are no model's default, as vLLM reads the file's difference from them
    (tmp_path / "generation_config.json").write_text(json.dumps({"temperature": 1.0, "top_k": 50, "top_p": 2}))
    assert SamplingDefaults.read(str(tmp_path)) == SamplingDefaults()
    assert SamplingDefaults.read(str(tmp_path / "missing")) == SamplingDefaults()


def test_chat_parsing():
    req = ChatRequest.parse({"messages": [{"role": "user", "content": [{"type": "text", "text": "a"},
                                                                       {"type": "text", "text": "b"}]}],
                             "logprobs": True, "top_logprobs": 3, "max_completion_tokens": 9})
    assert req.messages[0]["content"] == "a\nb"
    assert req.options.logprobs == 3 and req.options.max_tokens == 9
    assert ChatRequest.parse({"messages": [{"role": "user", "content": "x"}]}).options.logprobs is None
    assert ChatRequest.parse({"messages": [{"role": "user", "content": "x"}], "logprobs": True}).options.logprobs == 0
    tools_off = {"messages": [{"role": "user", "content": "x"}], "tools": [{}], "tool_choice": "none"}
    assert ChatRequest.parse(tools_off).options.n == 1
    assert ChatRequest.parse({"messages": [{"role": "user", "content": "x"}],
                              "return_token_ids": True}).options.return_token_ids is True


def test_a_completion_prompt_gets_the_special_tokens_unless_told_not_to(tiny_models):
    # vLLM's add_special_tokens: the tiny Llama's tokenizer puts BOS (id 0) before a text prompt
    from hosttune_engine.model.tokenizer import Tokenizer

    builder = PromptBuilder(Tokenizer(tiny_models["llama"]), 1024, 256)
    ids = {}
    for body in ({"prompt": "hi"}, {"prompt": "hi", "add_special_tokens": False}):
        req = CompletionRequest.parse(body)
        ids[req.add_special_tokens] = asyncio.run(builder.encode(req.prompts[0], req.add_special_tokens))
    assert ids[True] == [0, *ids[False]] and ids[False][0] != 0


@pytest.mark.parametrize("field,value", [("echo", True), ("chat_template", "{{ messages }}")])
def test_chat_fields_that_change_the_prompt_are_refused_not_ignored(field, value):
    messages = [{"role": "user", "content": "x"}]
    with pytest.raises(ApiError) as err:
        ChatRequest.parse({"messages": messages, field: value})
    assert (err.value.param, err.value.message) == (field, f"{field} is not supported by this server")
    neutral = {"echo": False, "chat_template": None}[field]
    assert ChatRequest.parse({"messages": messages, field: neutral}).options.n == 1


def test_continue_final_message_ends_the_prompt_inside_the_final_message(tiny_models):
    from hosttune_engine.model.tokenizer import Tokenizer

    builder = PromptBuilder(Tokenizer(tiny_models["qwen2"]), 1024, 256)
    messages = ({"role": "user", "content": "hi"}, {"role": "assistant", "content": "The answer is"})
    whole = builder.render_chat(messages, add_generation_prompt=False)
    continued = builder.render_chat(messages, False, None, continue_final=True)
    assert whole.startswith(continued) and continued.endswith("\nThe answer is") and len(continued) < len(whole)
    with pytest.raises(ApiError) as err:  # vLLM's rule: the generation prompt would start a new message
        ChatRequest.parse({"messages": list(messages), "continue_final_message": True})
    assert err.value.param == "continue_final_message" and "add_generation_prompt" in err.value.message
    req = ChatRequest.parse({"messages": list(messages), "continue_final_message": True,
                             "add_generation_prompt": False})
    assert req.continue_final_message and not req.add_generation_prompt


def test_chat_and_tokenized_messages_get_special_tokens_only_when_asked(tiny_models):
    # the template writes what the model wants; add_special_tokens puts the tokenizer's BOS (id 0) before it too
    from hosttune_engine.model.tokenizer import Tokenizer

    builder = PromptBuilder(Tokenizer(tiny_models["llama"]), 1024, 256)
    messages = [{"role": "user", "content": "hi"}]
    ids = {}
    for body in ({"messages": messages}, {"messages": messages, "add_special_tokens": True}):
        req = ChatRequest.parse(body)
        ids[req.add_special_tokens] = asyncio.run(builder.encode_chat(req.messages, True, None,
                                                                      req.add_special_tokens))
        tok = TokenizeRequest.parse(body)
        assert asyncio.run(builder.encode_chat(tok.messages, True, None, tok.add_special_tokens)) == ids[
            req.add_special_tokens]
    assert ids[True] == [0, *ids[False]]


def test_a_lone_surrogate_names_the_field_it_came_in(tiny_models):
    from hosttune_engine.model.tokenizer import Tokenizer

    builder = PromptBuilder(Tokenizer(tiny_models["llama"]), 1024, 256)
    for param, encode in (("prompt", builder.encode("a\ud800")),
                          ("messages", builder.encode_chat([{"role": "user", "content": "a\ud800"}]))):
        with pytest.raises(ApiError) as err:
            asyncio.run(encode)
        assert (err.value.param, err.value.message) == (param, f"{param}: not valid Unicode (a lone surrogate escape?)")


def test_tokenize_parsing():
    assert TokenizeRequest.parse({"prompt": "hi"}).add_special_tokens is True
    assert TokenizeRequest.parse({"messages": [{"role": "user", "content": "x"}]}).add_special_tokens is False
    with pytest.raises(ApiError):
        TokenizeRequest.parse({"prompt": "a", "messages": []})
    chat = {"messages": [{"role": "user", "content": "x"}], "add_generation_prompt": False}
    assert TokenizeRequest.parse({**chat, "continue_final_message": True}).continue_final_message is True
    assert TokenizeRequest.parse({"prompt": "a", "continue_final_message": True}).continue_final_message is False


@pytest.mark.parametrize("top_p", [0, 1.5, -1])
def test_top_p_out_of_range_is_a_field_fault(top_p):
    # a fault of the body: named, and answered before the model, the server's phase or admission are looked at
    with pytest.raises(ApiError) as err:
        CompletionRequest.parse({"prompt": "hi", "top_p": top_p, "model": "not checked yet"})
    assert (err.value.message, err.value.param) == (f"top_p must be in (0, 1], got {float(top_p)}.", "top_p")


def test_sampling_errors_become_400():
    options = CompletionRequest.parse({"prompt": "hi"}).options
    with pytest.raises(ApiError) as err:
        options.sampling(0)
    assert "max_tokens must be an integer >= 1" in err.value.message


@pytest.mark.parametrize("num_prompt,requested,default,expected", [
    (10, None, 16, 16), (1020, None, 16, 4), (10, None, None, 1014), (10, 1014, 16, 1014),
])
def test_max_tokens_for(num_prompt, requested, default, expected):
    assert PromptBuilder(None, 1024, 100).max_tokens_for(num_prompt, requested, default) == expected


@pytest.mark.parametrize("num_prompt,requested,message", [
    (1024, None, "your request has 1024 input tokens"),
    (10, 1015, "you requested 1025 tokens (10 in the prompt, 1015 in the completion)"),
    (0, None, "the prompt is empty"),
])
def test_context_errors(num_prompt, requested, message):
    with pytest.raises(ApiError) as err:
        PromptBuilder(None, 1024, 100).max_tokens_for(num_prompt, requested, 16)
    assert message in err.value.message


def test_without_a_tokenizer_each_route_says_what_still_works():
    builder = PromptBuilder(None, 1024, 100)
    with pytest.raises(ApiError, match="no tokenizer .* for text prompts; send token ids instead") as text:
        asyncio.run(builder.encode("hello"))
    with pytest.raises(ApiError, match="for chat messages; send token ids to /v1/completions") as chat:
        builder.render_chat([{"role": "user", "content": "hi"}])
    with pytest.raises(ApiError, match="for turning token ids into text") as tokens:
        asyncio.run(builder.decode([1, 2]))
    with pytest.raises(ApiError, match="for logprobs, which show each token as text; ask without logprobs") as lps:
        builder.check_logprobs(0)
    assert (text.value.param, chat.value.param, tokens.value.param) == ("prompt", "messages", "tokens")
    assert lps.value.param == "logprobs"
    assert asyncio.run(builder.encode([1, 2])) == [1, 2]
    builder.check_logprobs(None)


def test_chat_template_kwargs_may_set_the_templates_own_add_generation_prompt(tiny_models):
    # as in vLLM, chat_template_kwargs are the template's arguments and win over the request's defaults
    from hosttune_engine.model.tokenizer import Tokenizer

    builder = PromptBuilder(Tokenizer(tiny_models["llama"]), 1024, 256)
    messages = [{"role": "user", "content": "hi"}]
    req = ChatRequest.parse({"messages": messages, "chat_template_kwargs": {"add_generation_prompt": False}})
    rendered = builder.render_chat(req.messages, req.add_generation_prompt, req.template_kwargs)
    assert rendered == builder.render_chat(req.messages, False) != builder.render_chat(req.messages, True)


def test_chat_template_kwargs_may_set_the_special_tokens_but_not_the_messages(tiny_models):
    """As in transformers, they win over bos_token; they were a 400 quoting jinja2's render() arguments."""
    from hosttune_engine.model.tokenizer import Tokenizer
    from hosttune_engine.server.schemas.tokenize import TokenizeRequest

    builder = PromptBuilder(Tokenizer(tiny_models["llama"]), 1024, 256)
    messages = [{"role": "user", "content": "hi"}]
    assert builder.render_chat(messages, True, {"bos_token": "<X>"}).startswith("<X>[user] hi")
    for request in (ChatRequest, TokenizeRequest):
        with pytest.raises(ApiError) as err:
            request.parse({"messages": messages, "chat_template_kwargs": {"messages": []}})
        assert (err.value.param, err.value.message) == (
            "chat_template_kwargs", "chat_template_kwargs must not set messages; send them as the request's messages")


def test_continuous_usage_stats_is_a_boolean_that_counts_only_with_include_usage():
    def options(**stream_options):
        return CompletionRequest.parse({"prompt": "hi", "stream": True, "stream_options": stream_options}).options

    assert options(include_usage=True, continuous_usage_stats=True).continuous_usage is True
    assert options(continuous_usage_stats=True).continuous_usage is False  # as in vLLM
    with pytest.raises(ApiError) as err:
        options(include_usage=True, continuous_usage_stats="yes")
    assert (err.value.param, err.value.message) == (
        "stream_options.continuous_usage_stats", "stream_options.continuous_usage_stats must be a boolean, got a string")


def test_generation_config_says_whose_sampling_defaults_requests_get(tmp_path):
    """--generation-config as vLLM takes it: auto (the model folder's file), vllm (none) or another folder; a value
    that is neither is one line at start."""
    from hosttune_engine.errors import ConfigError
    from hosttune_engine.server.cli import _parser, config_from_args
    from hosttune_engine.server.state import ServerState

    model, other = tmp_path / "model", tmp_path / "other"
    for folder, temperature in ((model, 0.7), (other, 0.3)):
        folder.mkdir()
        (folder / "generation_config.json").write_text(json.dumps({"temperature": temperature}))

    def temperature(*flags):
        config = config_from_args(_parser().parse_args(["serve", "--model", str(model), *flags]))
        return ServerState(config).sampling_defaults.temperature

    assert temperature() == temperature("--generation-config", "auto") == 0.7
    assert temperature("--generation-config", "vllm") is None
    assert temperature("--generation-config", str(other)) == 0.3
    with pytest.raises(ConfigError, match=r"^generation_config '/nowhere' is no folder: give auto"):
        temperature("--generation-config", "/nowhere")
