"""Model folders: config parsing, safetensors shards, dummy weights, clear errors, tokenizer."""

import json
import re
import shutil

import pytest
import torch

from hosttune_engine import LLM, SamplingParams
from hosttune_engine.errors import ModelLoadError, UnsupportedModelError
from hosttune_engine.model.loader import load_model
from hosttune_engine.model.model_config import ModelConfig
from hosttune_engine.model.tokenizer import Tokenizer


def copy(src, dst, edit=None):
    shutil.copytree(src, dst)
    if edit:
        cfg = json.loads((dst / "config.json").read_text())
        edit(cfg)
        (dst / "config.json").write_text(json.dumps(cfg))
    return dst


def test_config_parsing(tiny_models):
    llama = ModelConfig.from_folder(tiny_models["llama"])
    assert (llama.num_heads, llama.num_kv_heads, llama.head_dim) == (4, 1, 32)
    assert not llama.qkv_bias and not llama.tie_word_embeddings and llama.rope_scaling["rope_type"] == "llama3"
    qwen = ModelConfig.from_folder(tiny_models["qwen2"])
    assert qwen.qkv_bias and not qwen.o_proj_bias and qwen.tie_word_embeddings
    assert qwen.head_dim == 16 and qwen.eos_token_ids


def test_unsupported_architecture_and_features(tmp_path, tiny_models):
    bad = copy(tiny_models["llama"], tmp_path / "m", lambda c: c.update(architectures=["GPT2LMHeadModel"]))
    with pytest.raises(UnsupportedModelError, match="GPT2LMHeadModel.*supported: LlamaForCausalLM"):
        ModelConfig.from_folder(bad)
    sw = copy(tiny_models["qwen2"], tmp_path / "sw", lambda c: c.update(use_sliding_window=True))
    with pytest.raises(UnsupportedModelError, match="sliding-window"):
        ModelConfig.from_folder(sw)
    rope = copy(tiny_models["llama"], tmp_path / "rope", lambda c: c.update(rope_scaling={"rope_type": "yarn", "factor": 4}))
    with pytest.raises(UnsupportedModelError, match="yarn"):
        LLM(str(rope))


@pytest.mark.parametrize("field", ["tie_word_embeddings", "attention_bias", "mlp_bias", "use_sliding_window"])
def test_a_switch_in_config_json_that_is_not_true_or_false_is_refused_naming_the_file(tmp_path, tiny_models, field):
    # "false" in quotes is a non-empty string: read as true, a tied head would drop the checkpoint's lm_head
    folder = copy(tiny_models["qwen2"], tmp_path / "m", lambda c: c.update({field: "false"}))
    with pytest.raises(ModelLoadError, match=re.escape(f"{folder / 'config.json'}: {field} must be true or false, "
                                                       "got 'false'; fix config.json")):
        ModelConfig.from_folder(folder)


@pytest.mark.parametrize("act, supported", [("silu", True), ("swish", True), ("gelu", False), ("relu", False)])
def test_an_activation_other_than_silu_is_refused_naming_config_json(tmp_path, tiny_models, act, supported):
    # the MLP runs SwiGLU whatever config.json says: another activation would serve wrong tokens without an error
    folder = copy(tiny_models["qwen2"], tmp_path / "m", lambda c: c.update(hidden_act=act))
    if supported:
        assert ModelConfig.from_folder(folder).hidden_size == 128
        return
    with pytest.raises(UnsupportedModelError, match=re.escape(f"{folder / 'config.json'}: hidden_act {act!r} is not "
                                                              "supported; the MLP runs silu (SwiGLU)")):
        ModelConfig.from_folder(folder)


def test_missing_files(tmp_path, tiny_models):
    with pytest.raises(ModelLoadError, match="no config.json"):
        ModelConfig.from_folder(tmp_path)
    no_weights = tmp_path / "nw"
    no_weights.mkdir()
    shutil.copy(tiny_models["qwen2"] / "config.json", no_weights)
    with pytest.raises(ModelLoadError, match="no \\*.safetensors.*dummy"):
        LLM(str(no_weights))
    shard = copy(tiny_models["llama"], tmp_path / "shard")
    (shard / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(ModelLoadError, match="shards listed .* missing: model-00002"):
        LLM(str(shard))
    missing_field = copy(tiny_models["llama"], tmp_path / "mf", lambda c: c.pop("hidden_size"))
    with pytest.raises(ModelLoadError, match="'hidden_size' is missing"):
        ModelConfig.from_folder(missing_field)


@pytest.mark.parametrize("text, message", [
    ("[1, 2]", "holds a JSON list, not an object"),
    ('"LlamaForCausalLM"', "holds a JSON str, not an object"),
])
def test_a_config_json_that_is_not_an_object_is_one_error(tmp_path, text, message):
    (tmp_path / "config.json").write_text(text)
    with pytest.raises(ModelLoadError, match=message):
        ModelConfig.from_folder(tmp_path)


@pytest.mark.parametrize("name, data, message", [
    ("config.json", b'{"vocab_size": "\xff"}', r"config.json: cannot read JSON: 'utf-8' codec can't decode byte 0xff"),
    ("generation_config.json", b'{"eos_token_id": "\xff"}', r"generation_config.json: cannot read JSON: 'utf-8'"),
    ("generation_config.json", b"[2]", r"generation_config.json: holds a JSON list, not an object of generation "
                                       r"settings"),
])
def test_a_json_file_that_is_not_utf8_or_not_an_object_is_one_error(tmp_path, tiny_models, name, data, message):
    folder = copy(tiny_models["llama"], tmp_path / "m")
    (folder / name).write_bytes(data)
    with pytest.raises(ModelLoadError, match=message):
        ModelConfig.from_folder(folder)


@pytest.mark.parametrize("field", ["quantization_config", "rope_scaling", "rope_parameters"])
def test_a_settings_field_that_is_not_an_object_is_one_error(tmp_path, tiny_models, field):
    bad = copy(tiny_models["qwen2"], tmp_path / "m", lambda c: c.update({field: "awq"}))
    with pytest.raises(ModelLoadError, match=f"{field} must be an object of settings, got 'awq'; fix config.json"):
        ModelConfig.from_folder(bad)


@pytest.mark.parametrize("field, value", [("hidden_size", "128"), ("num_attention_heads", 0),
                                          ("num_key_value_heads", 2.5), ("vocab_size", True)])
def test_a_size_that_is_not_a_positive_integer_names_the_field(tmp_path, tiny_models, field, value):
    bad = copy(tiny_models["llama"], tmp_path / "m", lambda c: c.update({field: value}))
    with pytest.raises(ModelLoadError, match=f"{field} must be a positive integer, got {value!r}"):
        ModelConfig.from_folder(bad)


@pytest.mark.parametrize("field, value, message", [
    ("hidden_size", None, "required field 'hidden_size' is missing"),  # null is absent, as in Hugging Face's reader
    ("num_attention_heads", None, "required field 'num_attention_heads' is missing"),
    ("architectures", 5, "architectures must be an array of names, got 5"),
    ("rope_theta", "x", "rope_theta must be a positive number, got 'x'"),
    ("rms_norm_eps", True, "rms_norm_eps must be a positive number, got True"),
    # with generation_config.json's EOS (1) after it
    ("eos_token_id", {"a": 1}, "eos_token_id must be a token id or an array of them, got [{'a': 1}, 1]"),
    ("bos_token_id", "1", "bos_token_id must be a token id, got '1'"),
])
def test_a_field_of_the_wrong_type_names_it(tmp_path, tiny_models, field, value, message):
    bad = copy(tiny_models["llama"], tmp_path / "m", lambda c: c.update({field: value}))
    with pytest.raises(ModelLoadError, match=re.escape(message)):
        ModelConfig.from_folder(bad)


@pytest.mark.parametrize("scaling, message", [
    ({"type": "linear"}, "rope_scaling linear needs factor, a positive number; got None"),
    ({"rope_type": "linear", "factor": "x"}, "rope_scaling linear needs factor, a positive number; got 'x'"),
    ({"rope_type": "llama3", "factor": 8.0}, "rope_scaling llama3 needs low_freq_factor, a positive number; got None"),
    ({"rope_type": "yarn", "factor": 4.0}, "rope scaling type 'yarn' is not supported (default, linear, llama3 are)"),
])
def test_rope_scaling_is_checked_with_the_config(tmp_path, tiny_models, scaling, message):
    # before the model is built (and, in serve, before the socket opens), not as a KeyError from the rotary table
    bad = copy(tiny_models["llama"], tmp_path / "m", lambda c: c.update(rope_scaling=scaling))
    with pytest.raises(ModelLoadError, match=re.escape(message)):
        ModelConfig.from_folder(bad)


def test_optional_fields_given_as_null_take_their_defaults(tmp_path, tiny_models):
    nulls = copy(tiny_models["llama"], tmp_path / "m",
                 lambda c: c.update(max_position_embeddings=None, rms_norm_eps=None, rope_theta=None))
    cfg = ModelConfig.from_folder(nulls)
    assert (cfg.max_position_embeddings, cfg.rms_norm_eps, cfg.rope_theta) == (4096, 1e-6, 10000.0)


def test_a_context_past_the_models_positions_is_refused_not_shortened(tiny_models):
    from hosttune_engine import Engine, EngineConfig
    from hosttune_engine.errors import ConfigError

    with pytest.raises(ConfigError, match="max_model_len=4096 is past the model's 1024 positions .*give at most 1024"):
        Engine(EngineConfig(model=str(tiny_models["llama"]), device="cpu", max_model_len=4096))
    assert Engine(EngineConfig(model=str(tiny_models["llama"]), device="cpu", max_model_len=1024)).max_model_len == 1024


def test_a_cpu_kv_cache_that_cannot_hold_one_whole_context_is_refused(tiny_models):
    # as on a GPU, and as vLLM refuses it: /v1/models would advertise a context no request could use
    from hosttune_engine import Engine, EngineConfig
    from hosttune_engine.errors import ConfigError

    tiny = 3e-5  # GiB: two blocks of the tiny Llama's cache (12 KiB each)
    with pytest.raises(ConfigError, match=r"^the KV cache fits \d+ tokens, fewer than max_model_len=1024; raise "
                                          r"cpu_kv_cache_gib or lower max_model_len$"):
        Engine(EngineConfig(model=str(tiny_models["llama"]), device="cpu", cpu_kv_cache_gib=tiny))
    eng = Engine(EngineConfig(model=str(tiny_models["llama"]), device="cpu", cpu_kv_cache_gib=tiny, max_model_len=16))
    assert eng.max_model_len == 16 <= eng.stats().num_kv_blocks * 16


def test_the_triton_backend_on_a_cpu_without_the_interpreter_is_refused_in_one_line(tiny_models, monkeypatch):
    # Triton has no CPU driver: without its interpreter the first kernel launch raised from deep inside Triton
    from hosttune_engine import Engine, EngineConfig
    from hosttune_engine.errors import ConfigError

    monkeypatch.delenv("TRITON_INTERPRET")
    with pytest.raises(ConfigError, match=r"^kernel_backend='triton' on the CPU needs TRITON_INTERPRET=1 \(Triton's "
                                          r"interpreter, slow\); use kernel_backend 'auto' or 'torch'$"):
        Engine(EngineConfig(model=str(tiny_models["llama"]), device="cpu", kernel_backend="triton"))


def test_a_tokenizer_folder_named_but_without_tokenizer_json_is_refused(tmp_path, tiny_models):
    from hosttune_engine import Engine, EngineConfig

    with pytest.raises(ModelLoadError, match=f"{tmp_path} has no tokenizer.json"):
        Engine(EngineConfig(model=str(tiny_models["qwen2"]), device="cpu", tokenizer=str(tmp_path)))


@pytest.mark.parametrize("name, text, message", [
    ("tokenizer.json", "{bad", "tokenizer.json: cannot read it as a tokenizer"),
    ("tokenizer_config.json", "{bad", "tokenizer_config.json: cannot read JSON"),
    ("tokenizer_config.json", "[]", "tokenizer_config.json: holds a JSON list, not an object"),
    ("tokenizer_config.json", '{"eos_token": 5}', r"tokenizer_config.json: eos_token must be a string \(or an object "
                                                  r"with its content\), got 5"),
    ("tokenizer_config.json", '{"bos_token": {"content": true}}', "bos_token must be a string"),
    ("tokenizer_config.json", '{"chat_template": 5}', "chat_template must be a string or an array of named templates"),
    ("tokenizer_config.json", '{"chat_template": [{"name": "default"}]}', "chat_template must be a string or an array"),
    # a template that does not compile is the folder's fault, found at load, not a 400 to every chat request
    ("tokenizer_config.json", '{"chat_template": "{% if %}"}',
     r"tokenizer_config.json: chat template line 1: Expected an expression, got 'end of statement block'$"),
])
def test_a_malformed_tokenizer_file_is_one_error_naming_it(tmp_path, tiny_models, name, text, message):
    folder = copy(tiny_models["qwen2"], tmp_path / "m")
    (folder / name).write_text(text)
    with pytest.raises(ModelLoadError, match=message):
        Tokenizer(folder)


def test_a_chat_template_file_that_does_not_compile_or_is_not_utf8_is_one_error_naming_it(tmp_path, tiny_models):
    folder = copy(tiny_models["qwen2"], tmp_path / "m")
    (folder / "tokenizer_config.json").write_text('{"eos_token": "<|im_end|>"}')
    (folder / "chat_template.jinja").write_text("{{ bos_token }}\n{% for m in messages %}{{ m.content }}")
    with pytest.raises(ModelLoadError, match=re.escape(f"{folder / 'chat_template.jinja'}: chat template line 2: "
                                                       "Unexpected end of template.")):
        Tokenizer(folder)
    (folder / "chat_template.jinja").write_bytes(b"{{ bos_token }}\xff")
    with pytest.raises(ModelLoadError, match=re.escape(f"{folder / 'chat_template.jinja'}: cannot read it as UTF-8 "
                                                       "text: 'utf-8' codec can't decode byte 0xff in position 15")):
        Tokenizer(folder)


def test_a_corrupt_or_truncated_weights_file_or_index_is_one_error_naming_it(tmp_path, tiny_models):
    garbage = copy(tiny_models["qwen2"], tmp_path / "garbage")
    (garbage / "model.safetensors").write_bytes(b"garbage")
    truncated = copy(tiny_models["qwen2"], tmp_path / "truncated")
    whole = (truncated / "model.safetensors").read_bytes()
    (truncated / "model.safetensors").write_bytes(whole[:len(whole) // 2])
    index = copy(tiny_models["llama"], tmp_path / "index")
    (index / "model.safetensors.index.json").write_text('{"metadata": {}}')
    for folder, message in [(garbage, "garbage/model.safetensors: not a readable safetensors file"),
                            (truncated, "truncated/model.safetensors: not a readable safetensors file .*download"),
                            (index, "index/model.safetensors.index.json: not a safetensors index .*weight_map")]:
        with pytest.raises(ModelLoadError, match=message):
            LLM(str(folder), device="cpu")


def test_shape_mismatch_names_the_tensor(tmp_path, tiny_models):
    bad = copy(tiny_models["llama"], tmp_path / "m", lambda c: c.update(intermediate_size=300))
    with pytest.raises(ModelLoadError, match="mlp.*shape .* does not match"):
        LLM(str(bad))


def test_missing_and_unexpected_tensors(tmp_path, tiny_models):
    from safetensors.torch import load_file, save_file

    src = tiny_models["qwen2"] / "model.safetensors"
    tensors = load_file(str(src))
    missing = copy(tiny_models["qwen2"], tmp_path / "missing")
    save_file({k: v for k, v in tensors.items() if "layers.1.mlp.up_proj" not in k}, str(missing / "model.safetensors"))
    with pytest.raises(ModelLoadError, match="missing from the checkpoint: model.layers.1.mlp.up_proj.weight"):
        LLM(str(missing))
    extra = copy(tiny_models["qwen2"], tmp_path / "extra")
    save_file({**tensors, "model.layers.0.mlp.extra.weight": torch.zeros(2)}, str(extra / "model.safetensors"))
    with pytest.raises(ModelLoadError, match="does not have: model.layers.0.mlp.extra.weight"):
        LLM(str(extra))


def test_dummy_weights_from_config_alone(tmp_path, tiny_models):
    folder = tmp_path / "cfg-only"
    folder.mkdir()
    shutil.copy(tiny_models["qwen2"] / "config.json", folder)
    llm = LLM(str(folder), load_format="dummy")
    assert llm.tokenizer is None
    out = llm.generate([[5, 6, 7]], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))[0]
    assert len(out.token_ids) == 4 and out.text == ""
    model = load_model(ModelConfig.from_folder(folder), folder, "dummy", torch.device("cpu"), torch.float32, seed=3)
    again = load_model(ModelConfig.from_folder(folder), folder, "dummy", torch.device("cpu"), torch.float32, seed=3)
    assert torch.equal(model.model.embed_tokens.weight, again.model.embed_tokens.weight)
    assert model.lm_head.weight is model.model.embed_tokens.weight  # tied
    assert torch.equal(model.model.norm.weight, torch.ones_like(model.model.norm.weight))


def test_fused_projections_hold_the_checkpoint_parts(tiny_models):
    from safetensors.torch import load_file

    path = tiny_models["qwen2"]
    model = load_model(ModelConfig.from_folder(path), path, "auto", torch.device("cpu"), torch.float32)
    t = load_file(str(path / "model.safetensors"))
    qkv = model.model.layers[2].self_attn.qkv_proj
    want = torch.cat([t[f"model.layers.2.self_attn.{n}_proj.weight"] for n in "qkv"])
    assert torch.equal(qkv.weight, want)
    assert torch.equal(qkv.bias, torch.cat([t[f"model.layers.2.self_attn.{n}_proj.bias"] for n in "qkv"]))


@pytest.mark.parametrize("model", ["llama", "qwen2"])
def test_tokenizer_and_chat_template_match_transformers(tiny_models, model):
    from transformers import AutoTokenizer

    path = tiny_models[model]
    ours, theirs = Tokenizer(path), AutoTokenizer.from_pretrained(str(path))
    for text in ["The quick brown fox", "Numbers: 3.14 and 42!", " leading space", "héllo wörld"]:
        assert ours.encode(text) == theirs(text)["input_ids"]
        assert ours.decode(ours.encode(text)) == theirs.decode(theirs(text)["input_ids"], skip_special_tokens=True)
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}]
    assert ours.apply_chat_template(messages) == theirs.apply_chat_template(messages, tokenize=False,
                                                                            add_generation_prompt=True)
    assert ours.eos_token_id == ModelConfig.from_folder(path).eos_token_ids[0]


@pytest.mark.parametrize("model", ["llama", "qwen2"])
def test_token_bytes_join_into_the_text_parts_of_characters_included(tiny_models, model):
    tok = Tokenizer(tiny_models[model])
    text = "héllo 日本語 🎉 <|im_start|>!"
    ids = tok.encode(text, add_special_tokens=False)
    parts = [tok.token_bytes(i) for i in ids]
    assert b"".join(parts) == text.encode()
    assert any(tok.decode([i]) == "\ufffd" for i in ids)  # single tokens that hold part of a character
    assert tok.token_bytes(0) == tok.decode([0], skip_special_tokens=False).encode()  # a special token: its text


@pytest.mark.parametrize("metaspace", [False, True], ids=["replace-strip", "metaspace"])
def test_sentencepiece_token_texts_and_bytes_keep_their_spaces(tmp_path, metaspace):
    """Decoding one SentencePiece token drops its leading space: logprobs showed "the" for "\u2581the", their bytes
    did not join into the text, and text_offset fell behind it."""
    from .test_byte_bound import _sentencepiece

    tok = _sentencepiece(tmp_path, metaspace)
    text = "the engine never imports 日本"
    ids = tok.encode(text, add_special_tokens=False)
    assert any(tok._tok.id_to_token(i).startswith("\u2581") for i in ids[1:])
    assert b"".join(tok.token_bytes(i) for i in ids) == f" {text}".encode()  # the mark in front, as continuing text
    assert "".join(tok.token_text(i) for i in ids if not tok._tok.id_to_token(i).startswith("<0x")) == " " + text[:-2]
    assert tok.token_text(tok.token_to_id("</s>")) == "</s>"


def test_chat_template_is_compiled_once_per_tokenizer(tiny_models, monkeypatch):
    from hosttune_engine.model import tokenizer as tokenizer_module

    compiled = []
    compile_ = tokenizer_module._compile
    monkeypatch.setattr(tokenizer_module, "_compile", lambda t: compiled.append(t) or compile_(t))
    tok = Tokenizer(tiny_models["qwen2"])
    first = tok.apply_chat_template([{"role": "user", "content": "first question"}])
    second = tok.apply_chat_template([{"role": "user", "content": "second question"}])
    assert compiled == [tok.chat_template]
    assert first.replace("first question", "second question") == second
