"""A plain text far over the context, with no special token to cut it at, is refused from its bytes: the
real SmolLM2 tokenizer (byte-level BPE), never asked to tokenize it."""

import asyncio

import pytest
from tokenizers import Tokenizer as HFTokenizer, models, normalizers, pre_tokenizers

from hosttune_engine.model.byte_bound import byte_bound
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
    assert tok._byte_bound.fewest_tokens(text) <= len(tok.encode(text, add_special_tokens=False))


def test_a_byte_weighs_one_over_the_longest_token_that_holds_it(tok):
    assert tok._byte_bound.fewest_tokens("#" * 4000) == 50 <= len(tok.encode("#" * 4000))  # 80 #s, one token
    assert tok._byte_bound.fewest_tokens("e" * 2500) == 100  # "ManagementPlaneProtection", 25 characters


def test_no_bound_where_a_normalizer_may_drop_characters():
    hf = HFTokenizer(models.BPE({c: i for i, c in enumerate(BYTE_LEVEL)}, []))
    hf.pre_tokenizer = pre_tokenizers.ByteLevel()
    assert byte_bound(hf, BYTE_LEVEL) is not None
    hf.normalizer = normalizers.Strip()
    assert byte_bound(hf, BYTE_LEVEL) is None
