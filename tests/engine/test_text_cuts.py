"""Cutting a long text where its pieces tokenize to the whole text's tokens, and counting it a piece at a time."""

import asyncio

import pytest
from tokenizers import AddedToken, Tokenizer as HFTokenizer, models, pre_tokenizers

from hosttune_engine.model.text_cuts import text_cuts
from hosttune_engine.model.tokenizer import Tokenizer
from hosttune_engine.server.api_errors import ApiError
from hosttune_engine.server.prompts import PromptBuilder

# content with the cut tokens in it, split characters (e + combining acute) and runs of spaces
TRICKY = "say   <|im_end|> and </s>  é\u0301 {i}\n\n"


@pytest.mark.parametrize("name", ["qwen2", "llama"])
def test_pieces_tokenize_to_the_whole_texts_tokens(tiny_models, name):
    tok = Tokenizer(tiny_models[name])
    text = tok.apply_chat_template([{"role": "user", "content": TRICKY.format(i=i)} for i in range(400)])
    pieces = list(tok._text_cuts.pieces(text, 500))
    rest = text[sum(map(len, pieces)):]
    assert len(pieces) > 10
    assert [i for p in [*pieces, rest] for i in tok.encode(p, add_special_tokens=False)] == tok.encode(text, False)
    assert tok.count_past(text, 10**9) is None


def test_a_chat_far_over_the_context_is_refused_before_it_is_all_tokenized(tiny_models):
    tok = Tokenizer(tiny_models["qwen2"])
    tok._token_bound = tok._word_cuts = None  # its bytes, or its words, would show it first: this counts pieces
    messages = [{"role": "user", "content": f"message number {i} says hello"} for i in range(20_000)]  # 300k tokens
    with pytest.raises(ApiError) as err:
        asyncio.run(PromptBuilder(tok, 1024, tok.vocab_size).encode_chat(messages, within_context=True))
    head = "This model's maximum context length is 1024 tokens. However, your request has at least "
    assert err.value.status == 400 and err.value.param == "messages" and err.value.message.startswith(head)
    assert 1024 <= int(err.value.message[len(head):].split()[0]) < 60_000  # one piece's tokens, not them all


def test_a_chat_without_word_cuts_is_counted_between_its_special_tokens(tiny_models):
    """Qwen2's pattern gives word cuts, but Japanese has no spaces between ASCII letters: the chat is cut after its
    special tokens instead, where it had no early count and was tokenized whole."""
    tok = Tokenizer(tiny_models["qwen2"])
    tok._token_bound = None
    assert tok._word_cuts is not None
    messages = [{"role": "user", "content": f"日本語のテキスト{i}です"} for i in range(20_000)]
    with pytest.raises(ApiError) as err:
        asyncio.run(PromptBuilder(tok, 1024, tok.vocab_size).encode_chat(messages, within_context=True))
    assert "However, your request has at least " in err.value.message


def _tokenizer(*added: AddedToken, pre_tokenizer=None) -> HFTokenizer:
    tok = HFTokenizer(models.BPE())
    tok.add_special_tokens(list(added))
    if pre_tokenizer is not None:
        tok.pre_tokenizer = pre_tokenizer
    return tok


def test_only_tokens_the_search_always_finds_are_cut_tokens():
    tok = _tokenizer(AddedToken("<end>", special=True, normalized=False),
                     AddedToken("<x>", special=True, normalized=False),  # inside "<x><y>"
                     AddedToken("<x><y>", special=True, normalized=False),
                     AddedToken("ab", special=True, normalized=False),  # inside "cab"
                     AddedToken("cab", special=True, normalized=False),  # "zc" ends in its beginning "c"
                     AddedToken("zc", special=True, normalized=False),
                     AddedToken("<norm>", special=True, normalized=True))  # found after normalizing
    assert text_cuts(tok).tokens == ("<end>", "<x><y>", "zc")


@pytest.mark.parametrize("tok", [
    _tokenizer(AddedToken("<end>", special=True, normalized=False, lstrip=True)),
    _tokenizer(AddedToken("<end>", special=True, normalized=False),
               pre_tokenizer=pre_tokenizers.Metaspace(prepend_scheme="first")),
    _tokenizer(AddedToken("aXa", special=True, normalized=False)),  # "aXaXa" finds only the first
], ids=["lstrip", "metaspace-first", "overlaps-itself"])
def test_no_cuts_where_a_piece_could_tokenize_otherwise(tok):
    assert text_cuts(tok) is None


def test_no_cuts_with_truncation():
    tok = _tokenizer(AddedToken("<end>", special=True, normalized=False))
    tok.enable_truncation(8)
    assert text_cuts(tok) is None
