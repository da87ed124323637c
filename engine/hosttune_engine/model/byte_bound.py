"""The fewest tokens a text can be, from the bytes of its UTF-8, known without tokenizing it.

For byte-level BPE (GPT-2, Llama 3, Qwen, SmolLM) with nothing before it that drops characters: the `tokenizers`
library first takes out the added tokens a text holds (each one token for its content's bytes), then
pre-tokenizes the rest, where ByteLevel turns each byte into one character of its 256-character alphabet and
splits keep every character; BPE then covers each character of a split by one token, or, where the vocabulary
lacks it, drops it. So every byte of a text, but those dropped, is in exactly one token. Weigh byte b as 1 / the
length of the longest token that holds it (0 if dropped): a token of k bytes holds none whose longest is shorter
than k, so its bytes weigh at most 1 in all, and a text has at least as many tokens as its bytes weigh.
It does not hold where a normalizer may drop or shorten text, an added token takes in the spaces beside it
(`lstrip`, `rstrip`), or truncation drops tokens: those tokenizers have no bound.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from itertools import groupby

import numpy as np

KEPT_BY_SPLITS = ("Isolated", "MergedWithPrevious", "MergedWithNext", "Contiguous")  # not "Removed"


@dataclass(frozen=True)
class ByteBound:
    weights: tuple[float, ...]  # [byte] 1 / the length of the longest token holding it; 0 for a dropped byte

    def fewest_tokens(self, text: str) -> int:
        """At least this many tokens: a bound, not a count (`encode` gives that). Milliseconds a megabyte."""
        counts = np.bincount(np.frombuffer(text.encode(), dtype=np.uint8), minlength=256)  # [byte]
        return int(counts @ np.asarray(self.weights))  # rounded down: never above


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
