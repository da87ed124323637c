"""The fewest tokens a text can be, from its UTF-8 length, known without tokenizing it.

For byte-level BPE (GPT-2, Llama 3, Qwen, SmolLM) with nothing before it that drops characters: the `tokenizers`
library first takes out the added tokens a text holds (each one token for its content's bytes), then
pre-tokenizes the rest, where ByteLevel turns each byte into one character of its 256-character alphabet and
splits keep every character; BPE then covers each character of a split by one token, or, where the vocabulary
lacks it, drops it. A vocabulary string is one character a byte, so no token stands for more bytes than the
longest string's length; a text of n bytes, not counting those it would drop, is at least n / that many tokens.
It does not hold where a normalizer may drop or shorten text, an added token takes in the spaces beside it
(`lstrip`, `rstrip`), or truncation drops tokens: those tokenizers have no bound.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

KEPT_BY_SPLITS = ("Isolated", "MergedWithPrevious", "MergedWithNext", "Contiguous")  # not "Removed"


@dataclass(frozen=True)
class ByteBound:
    max_token_bytes: int  # the most bytes of a text one token stands for
    dropped: bytes  # the bytes whose characters the vocabulary lacks: BPE drops them

    def fewest_tokens(self, text: str) -> int:
        """At least this many tokens: a bound, not a count (`encode` gives that)."""
        return -(-len(text.encode().translate(None, self.dropped)) // self.max_token_bytes)


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
    longest = max([*map(len, vocab), *(len(a.content.encode()) for a in added)], default=0)
    if not longest:  # no tokens at all
        return None
    return ByteBound(longest, bytes(sorted(b for c, b in byte_alphabet.items() if c not in vocab)))


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
