"""A plain text far over the context, with no special token to cut it at, is refused from its bytes (the real
SmolLM2 tokenizer, byte-level BPE) or its characters (SentencePiece BPE), never tokenized."""

import asyncio
import json
from pathlib import Path

import pytest
from tokenizers import Tokenizer as HFTokenizer, decoders, models, normalizers, pre_tokenizers, trainers

from hosttune_engine.model.byte_bound import byte_bound, char_bound
from hosttune_engine.model.tokenizer import BYTE_LEVEL, Tokenizer
from hosttune_engine.server.api_errors import ApiError
from hosttune_engine.server.prompts import PromptBuilder


@pytest.fixture(scope="module")
def tok(smollm2):
    return Tokenizer(smollm2)


def test_a_text_megabytes_over_the_context_is_refused_untokenized(tok, monkeypatch):
    """3.9 MB of English took 4.2 s to tokenize (840,001 tokens) before its 400 came."""
    asked = []
    encode = tok.encode
    monkeypatch.setattr(tok, "encode", lambda text, *a, **kw: asked.append(len(text)) or encode(text, *a, **kw))
    text = "The quick brown fox jumps over the lazy dog near the river bank. " * 30_000  # 1.95 MB
    with pytest.raises(ApiError) as err:
        asyncio.run(PromptBuilder(tok, 8192, tok.vocab_size).encode(text, within_context=True))
    head = "This model's maximum context length is 8192 tokens. However, your request has at least "
    assert err.value.status == 400 and err.value.param == "prompt" and err.value.message.startswith(head)
    assert len(text) // 30 < int(err.value.message[len(head):].split()[0]) < 500_000  # letters weigh 1/25 each
    assert asked == []


@pytest.mark.parametrize("text", [
    "The quick brown fox jumps over the lazy dog. " * 200,
    "#" * 80 * 50,  # its 80-character token
    ("\n" + " " * 80) * 50 + "x",  # its longest, 81 characters
    "日本語のテキストと絵文字 🦊🌍 " * 200,
    "a\x04b\x06c" * 500,  # bytes its vocabulary lacks, dropped
    "\x04" * 1000,
    "<|im_start|>user\nhi<|im_end|>" * 200,  # added tokens
])
def test_the_bound_is_never_above_the_count(tok, text):
    assert tok._token_bound.fewest_tokens(text) <= len(tok.encode(text, add_special_tokens=False))


def test_a_byte_weighs_one_over_the_longest_token_that_holds_it(tok):
    assert tok._token_bound.fewest_tokens("#" * 4000) == 50 <= len(tok.encode("#" * 4000))  # 80 #s, one token
    assert tok._token_bound.fewest_tokens("e" * 2500) == 100  # "ManagementPlaneProtection", 25 characters


def test_no_bound_where_a_normalizer_may_drop_characters():
    hf = HFTokenizer(models.BPE({c: i for i, c in enumerate(BYTE_LEVEL)}, []))
    hf.pre_tokenizer = pre_tokenizers.ByteLevel()
    assert byte_bound(hf, BYTE_LEVEL) is not None
    hf.normalizer = normalizers.Strip()
    assert byte_bound(hf, BYTE_LEVEL) is None


def _sentencepiece(tmp_path, metaspace: bool) -> Tokenizer:
    """A Llama 2-style tokenizer folder: BPE on characters, spaces made U+2581 (by a normalizer that also puts one in
    front, or by Metaspace) and back (the decoder drops a leading one), byte fallback through <0x00>..<0xFF> in its
    vocabulary. Trained on docs/design.md."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "design.md").read_text().splitlines()
    hf = HFTokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    if metaspace:
        hf.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="first", split=False)
        hf.decoder = decoders.Metaspace(prepend_scheme="first", split=False)
    else:
        hf.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")])
        hf.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(),
                                        decoders.Strip(" ", 1, 0)])
    byte_tokens = [f"<0x{b:02X}>" for b in range(256)]
    hf.train_from_iterator(text, trainer=trainers.BpeTrainer(
        vocab_size=800, special_tokens=["<unk>", "<s>", "</s>", *byte_tokens], show_progress=False))
    saved = json.loads(hf.to_str())
    saved["added_tokens"] = [a for a in saved["added_tokens"] if a["content"] not in byte_tokens]  # vocabulary only
    (tmp_path / "tokenizer.json").write_text(json.dumps(saved))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<s>", "eos_token": "</s>"}))
    return Tokenizer(tmp_path)


@pytest.mark.parametrize("metaspace", [False, True], ids=["normalizer", "metaspace"])
def test_a_sentencepiece_bound_weighs_characters_and_is_never_above_the_count(tmp_path, metaspace):
    tok = _sentencepiece(tmp_path, metaspace)
    for text in ["The engine never imports the control plane. " * 100, "  leading and   inner spaces  " * 50,
                 "日本語のテキストと絵文字 🦊🌍 " * 100, "<s>hi</s> <unk> <0x41>" * 100, "\n\n\t\x00" * 100,
                 "é\u0301 ▁▁ x" * 100]:
        fewest = tok._token_bound.fewest_tokens(text)
        assert 0 < fewest <= len(tok.encode(text, add_special_tokens=False)), text[:20]
    assert tok._token_bound.fewest_tokens("日本🦊") == 3  # characters its vocabulary lacks: a byte token each, at least


def test_a_sentencepiece_text_far_over_the_context_is_refused_untokenized(tmp_path, monkeypatch):
    tok = _sentencepiece(tmp_path, metaspace=False)
    monkeypatch.setattr(tok, "encode", lambda *a, **kw: pytest.fail("tokenized"))
    with pytest.raises(ApiError) as err:
        asyncio.run(PromptBuilder(tok, 4096, tok.vocab_size).encode("the control plane " * 20_000,
                                                                    within_context=True))
    assert err.value.status == 400 and "However, your request has at least " in err.value.message


def test_no_character_bound_where_a_normalizer_may_drop_characters(tmp_path):
    hf = HFTokenizer(models.BPE({"a": 0, "\u2581": 1}, []))
    hf.normalizer = normalizers.Replace(" ", "\u2581")
    assert char_bound(hf) is not None
    hf.normalizer = normalizers.Sequence([normalizers.Replace(" ", "\u2581"), normalizers.NFKC()])
    assert char_bound(hf) is None
    hf.normalizer, hf.pre_tokenizer = None, pre_tokenizers.ByteLevel()  # byte-level BPE: byte_bound's
    assert char_bound(hf) is None
