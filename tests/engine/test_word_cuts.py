"""Counting a long plain text's tokens a window at a time, cut at spaces between words: the windows' counts are the
whole text's, on the real SmolLM2 tokenizer (GPT-2's pattern) and on byte-level BPE with Qwen2's and Llama 3's."""

import asyncio
import json
import random

import pytest
from tokenizers import AddedToken, Tokenizer as HFTokenizer

from hosttune_engine.model.tokenizer import Tokenizer
from hosttune_engine.model.word_cuts import KNOWN_PATTERNS, word_cuts
from hosttune_engine.server.api_errors import ApiError
from hosttune_engine.server.prompts import PromptBuilder

LLAMA3 = next(p for p in KNOWN_PATTERNS if r"\p{N}{1,3}" in p)
# words, runs of spaces and newlines, contractions, digits, punctuation, combining marks, CJK, emoji, added tokens
FRAGMENTS = ["the", "The", "x", "Z", " ", " ", " ", "  ", "   ", "\n", "\n\n", " \n", "\r\n", "\t", "it's", "'re",
             "'S", "12345", "7", ".", "...", ", ", "!?", "e\u0301", "\u0301", "é", "日本語", "🦊", "ĠĊ", "<|im_end|>",
             "-", "_", "\u00a0"]


def _texts(num: int) -> list[str]:
    rng = random.Random(0)
    return ["".join(rng.choice(FRAGMENTS) for _ in range(300)) for _ in range(num)]


def _counted_whole(tok: Tokenizer, text: str, min_chars: int) -> int:
    """The windows' counts, then the rest: its tokens past the letter before the last cut."""
    counted, end = 0, 0
    for end, num in tok._word_cuts.pieces(text, min_chars):
        counted += num
    rest = tok._count(text[end - 1:]) - tok._count(text[end - 1]) if end else tok._count(text)
    return counted + rest


@pytest.fixture(scope="module")
def smollm2_tok(smollm2):
    return Tokenizer(smollm2)


def _variant(tiny_models, tmp_path, pattern: str | None = None, normalizer: dict | None = None) -> Tokenizer:
    """The tiny Qwen2's byte-level BPE (Qwen2's pattern), with another pattern or normalizer."""
    saved = json.loads((tiny_models["qwen2"] / "tokenizer.json").read_text())
    if pattern is not None:
        saved["pre_tokenizer"]["pretokenizers"][0]["pattern"] = {"Regex": pattern}
    saved["normalizer"] = normalizer
    (tmp_path / "tokenizer.json").write_text(json.dumps(saved))
    return Tokenizer(tmp_path)


@pytest.mark.parametrize("kind", ["gpt2", "qwen2-nfc", "llama3"])
def test_the_windows_count_the_whole_texts_tokens(smollm2_tok, tiny_models, tmp_path, kind):
    tok = {"gpt2": lambda: smollm2_tok, "qwen2-nfc": lambda: _variant(tiny_models, tmp_path, normalizer={"type": "NFC"}),
           "llama3": lambda: _variant(tiny_models, tmp_path, pattern=LLAMA3)}[kind]()
    assert tok._word_cuts is not None
    for text in _texts(40):
        assert _counted_whole(tok, text, 5) == tok._count(text), text


def test_a_long_plain_text_far_over_the_context_is_refused_after_counting_a_part(smollm2_tok, monkeypatch):
    """A 128K-context model's 3.3 MB of English was tokenized whole before its 400; here, 16K tokens of context and
    300 kB of English (64K tokens), which its bytes alone do not show is too long."""
    asked = []
    encode = smollm2_tok.encode
    monkeypatch.setattr(smollm2_tok, "encode", lambda text, *a, **kw: asked.append(len(text)) or encode(text, *a, **kw))
    text = "The quick brown fox jumps over the lazy dog near the river bank. " * 4600
    assert smollm2_tok._token_bound.fewest_tokens(text) < 16_384
    with pytest.raises(ApiError) as err:
        asyncio.run(PromptBuilder(smollm2_tok, 16_384, smollm2_tok.vocab_size).encode(text, within_context=True))
    head = "This model's maximum context length is 16384 tokens. However, your request has at least "
    assert err.value.status == 400 and err.value.message.startswith(head)
    assert 16_384 < int(err.value.message[len(head):].split()[0]) < 30_000
    assert max(asked) < 70_000 and sum(asked) < len(text) // 2


@pytest.mark.parametrize("change", ["pattern", "prefix-space", "added-space", "lstrip", "nfkc"])
def test_no_word_cuts_where_something_reaches_across_a_space(tiny_models, change):
    hf = HFTokenizer.from_file(str(tiny_models["qwen2"] / "tokenizer.json"))
    assert word_cuts(hf, len) is not None
    saved = json.loads(hf.to_str())
    if change == "pattern":  # any pattern but the known ones
        saved["pre_tokenizer"]["pretokenizers"][0]["pattern"] = {"Regex": r"\S+\s*"}
    elif change == "prefix-space":
        saved["pre_tokenizer"]["pretokenizers"][1]["add_prefix_space"] = True
    elif change == "nfkc":
        saved["normalizer"] = {"type": "NFKC"}
    hf = HFTokenizer.from_str(json.dumps(saved))
    if change in ("added-space", "lstrip"):
        hf.add_special_tokens([AddedToken("<a b>") if change == "added-space" else AddedToken("<x>", lstrip=True)])
    assert word_cuts(hf, len) is None
