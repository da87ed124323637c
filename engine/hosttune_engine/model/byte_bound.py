"""The fewest tokens a text can be, from its UTF-8 bytes or its characters, known without tokenizing it.

For byte-level BPE (GPT-2, Llama 3, Qwen, SmolLM) with nothing before it that drops characters: the `tokenizers`
library first takes out the added tokens a text holds (each one token for its content's bytes), then
pre-tokenizes the rest, where ByteLevel turns each byte into one character of its 256-character alphabet and
splits keep every character; BPE then covers each character of a split by one token, or, where the vocabulary
lacks it, drops it. So every byte of a text, but those dropped, is in exactly one token. Weigh byte b as 1 / the
length of the longest token that holds it (0 if dropped): a token of k bytes holds none whose longest is shorter
than k, so its bytes weigh at most 1 in all, and a text has at least as many tokens as its bytes weigh.
SentencePiece's BPE (Llama 2, Mistral, Gemma) works on characters instead: its normalizer or Metaspace turns
each space into U+2581 and may put one in front (only more to tokenize), and BPE covers each character by one
token, or, where the vocabulary lacks the character, by a token for each of its bytes (byte fallback) or by an
unknown token that may take in its neighbours. So the same weights hold per character: 1 / the longest token
that holds it, 1 for a character spelled in bytes, 0 for one left unknown.
It does not hold where a normalizer may drop or shorten text (NFKC, Strip), an added token takes in the spaces
beside it (`lstrip`, `rstrip`), or truncation drops tokens: those tokenizers have no bound.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from itertools import groupby

import numpy as np

KEPT_BY_SPLITS = ("Isolated", "MergedWithPrevious", "MergedWithNext", "Contiguous")  # not "Removed"
SPACE_MARK = "\u2581"  # SentencePiece's space


@dataclass(frozen=True)
class ByteBound:
    weights: tuple[float, ...]  # [byte] 1 / the length of the longest token holding it; 0 for a dropped byte

    def fewest_tokens(self, text: str) -> int:
        """At least this many tokens: a bound, not a count (`encode` gives that). Milliseconds a megabyte."""
        counts = np.bincount(np.frombuffer(text.encode(), dtype=np.uint8), minlength=256)  # [byte]
        return int(counts @ np.asarray(self.weights))  # rounded down: never above


@dataclass(frozen=True)
class CharBound:
    weights: np.ndarray = field(compare=False)  # [code point] what one character weighs; the last, any past it

    def fewest_tokens(self, text: str) -> int:
        """At least this many tokens, as ByteBound's: tens of milliseconds a megabyte."""
        points = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)  # [char]
        return int(self.weights[np.minimum(points, len(self.weights) - 1)].sum())  # rounded down: never above


def byte_bound(tok, byte_alphabet: dict[str, int]) -> ByteBound | None:
    """The bound of a `tokenizers.Tokenizer` whose byte-level alphabet is `byte_alphabet` (character -> byte), or
    None where its pipeline gives no such guarantee."""
    if tok.truncation is not None or tok.normalizer is not None or type(tok.model).__name__ != "BPE":
        return None
    if tok.model.continuing_subword_prefix or tok.model.end_of_word_suffix:  # characters spelled two ways
        return None
    if tok.pre_tokenizer is None or not _keeps_every_byte(json.loads(tok.pre_tokenizer.__getstate__())):
        return None
    added = list(tok.get_added_tokens_decoder().values())
    if any(a.lstrip or a.rstrip for a in added):
        return None
    vocab = tok.get_vocab(with_added_tokens=False)
    longest = [0] * 256  # [byte] the longest token that holds it
    for length, strings in groupby(sorted(vocab, key=len), key=len):  # one alphabet character a byte
        for c in set("".join(strings)).intersection(byte_alphabet):  # the last length written is the longest
            longest[byte_alphabet[c]] = length
    for content in (a.content.encode() for a in added):
        for b in set(content):
            longest[b] = max(longest[b], len(content))
    kept = {byte_alphabet[c] for c in byte_alphabet if c in vocab}  # BPE starts from these; it drops the rest
    return ByteBound(tuple(1 / longest[b] if b in kept else 0.0 for b in range(256)))


def _keeps_every_byte(state: dict) -> bool:
    """A ByteLevel pre-tokenizer, alone or in a sequence with splits that keep every character."""
    kind = state.get("type")
    if kind == "Sequence":
        parts = state.get("pretokenizers", [])
        return any(p.get("type") == "ByteLevel" for p in parts) and all(_keeps(p) for p in parts)
    return kind == "ByteLevel"


def _keeps(part: dict) -> bool:
    kind = part.get("type")
    return kind in ("ByteLevel", "Digits") or (kind == "Split" and part.get("behavior") in KEPT_BY_SPLITS)


def char_bound(tok) -> CharBound | None:
    """The bound of a SentencePiece-style BPE `tokenizers.Tokenizer` (characters, not bytes), or None where its
    pipeline gives no such guarantee."""
    if tok.truncation is not None or type(tok.model).__name__ != "BPE":
        return None
    if tok.model.continuing_subword_prefix or tok.model.end_of_word_suffix:
        return None
    try:
        states = [json.loads(c.__getstate__()) for c in (tok.normalizer, tok.pre_tokenizer) if c is not None]
    except Exception:  # a custom (Python) component cannot be read, so it cannot be vouched for
        return None
    marks = [_space_mark(state) for state in states]
    added = list(tok.get_added_tokens_decoder().values())
    if None in marks or any(a.lstrip or a.rstrip for a in added):
        return None
    space = next((m for m in marks if m), " ")  # what a space is when BPE sees it
    vocab = tok.get_vocab(with_added_tokens=False)  # its byte tokens too: nothing says no merge makes one
    longest: dict[str, int] = {}  # [char] the longest token that holds it
    for token in vocab:
        for c in set(token):
            longest[c] = max(longest.get(c, 0), len(token))
    kept = {t for t in vocab if len(t) == 1}  # BPE starts from these; the rest are bytes or unknown
    in_bytes = tok.model.byte_fallback and all(tok.token_to_id(f"<0x{b:02X}>") is not None for b in range(256))
    unknown = 1.0 if in_bytes else 0.0
    chars = {*longest, *(c for a in added for c in a.content), " "}
    weights = np.full(max(map(ord, chars)) + 2, unknown)  # [code point]
    for c in chars:
        seen = space if c == " " else c
        weights[ord(c)] = 1 / longest[seen] if seen in kept else unknown
    for a in added:  # one token for the whole content, matched before or after the normalizer
        for c in set(a.content):
            weights[ord(c)] = min(weights[ord(c)], 1 / len(a.content))
            if c == space:
                weights[ord(" ")] = min(weights[ord(" ")], 1 / len(a.content))
    return CharBound(weights)


def _space_mark(state: dict) -> str | None:
    """What a normalizer or pre-tokenizer turns a space into: '' where it keeps spaces and every other character
    (splits that keep all, a prepended mark), the mark where it replaces them, None where it may do anything else."""
    kind = state.get("type")
    if kind == "Sequence":
        parts = [_space_mark(p) for p in (state.get("normalizers") or state.get("pretokenizers") or [])]
        return None if None in parts or len({p for p in parts if p}) > 1 else next((p for p in parts if p), "")
    if kind == "Replace":
        content = state.get("content")
        return content if state.get("pattern") == {"String": " "} and isinstance(content, str) and len(content) == 1 \
            else None
    if kind == "Metaspace":
        return state.get("replacement") if len(state.get("replacement", "")) == 1 else None
    if kind == "Prepend" or (kind == "Split" and state.get("behavior") in KEPT_BY_SPLITS):
        return ""
    return None
