"""Where a long plain text can be counted a window at a time, for the pre-tokenizer patterns of GPT-2, Llama 3 and
Qwen2 (their exact regular expressions, nothing else).

Each of those patterns makes a space between two ASCII letters ("x A") the start of a pre-token (the space and
the word after it), whatever comes before or after: none of its alternatives spans a letter then a space. And a
match that starts before that space reads no further than the space itself (letter, digit and punctuation runs
stop at it; whitespace runs and their lookahead stop before the letter; the contractions fail on it). So, with
nothing that reaches across it (added tokens with spaces or `lstrip`/`rstrip`/`single_word`, a normalizer other
than NFC, a prefix space, truncation), the pre-tokens between two such spaces are the whole text's, and BPE
tokenizes each pre-token on its own. A window from the letter before the first space to the letter after the
second tokenizes to: that letter's tokens, the whole text's tokens between the two spaces, and those of the
last space with its letter.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator

CUT = re.compile("[A-Za-z] [A-Za-z]")
GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
KNOWN_PATTERNS = frozenset((
    GPT2,
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
    r"|\s+(?!\S)|\s+",  # Llama 3
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
    r"|\s+(?!\S)|\s+",  # Qwen2
))


class WordCuts:
    """Counts the tokens of a long text a window at a time, with `count` (a text's tokens, no special ones)."""

    def __init__(self, count: Callable[[str], int]):
        self.count = count

    def pieces(self, text: str, min_chars: int) -> Iterator[tuple[int, int]]:
        """Where each of the text's leading pieces of at least `min_chars` characters ends (at a cut), with the whole
        text's tokens in it; what follows the last is not counted."""
        start = 0  # where the piece starts: the text's start, or a cut (the space)
        while (found := CUT.search(text, start + min_chars)) is not None:
            end = found.start() + 1  # the next cut
            window = text[max(start - 1, 0):end + 2]
            num = self.count(window) - self.count(text[end:end + 2])  # " A": the next piece's
            yield end, num - self.count(text[start - 1]) if start else num  # "x": the last piece's
            start = end


def word_cuts(tok, count: Callable[[str], int]) -> WordCuts | None:
    """The cuts of a `tokenizers.Tokenizer`, or None if its pipeline gives no such guarantee."""
    if tok.truncation is not None or tok.padding is not None or tok.encode_special_tokens:
        return None
    if type(tok.model).__name__ != "BPE" or getattr(tok.model, "dropout", None):
        return None
    added = list(tok.get_added_tokens_decoder().values())
    if any(a.lstrip or a.rstrip or a.single_word or " " in a.content for a in added):
        return None
    try:
        normalizer = json.loads(tok.normalizer.__getstate__()) if tok.normalizer is not None else {"type": "NFC"}
        parts = _parts(json.loads(tok.pre_tokenizer.__getstate__())) if tok.pre_tokenizer is not None else []
    except Exception:  # a custom (Python) component cannot be read, so it cannot be vouched for
        return None
    if normalizer.get("type") != "NFC" or not parts or not all(map(_keeps_cuts, parts)):
        return None
    return WordCuts(count) if any(_pattern(p) is not None for p in parts) else None


def _parts(state: dict) -> list[dict]:
    return state.get("pretokenizers", []) if state.get("type") == "Sequence" else [state]


def _keeps_cuts(part: dict) -> bool:
    """A pre-tokenizer that splits at the cuts by a known pattern, or splits only at digits, or only maps bytes."""
    kind = part.get("type")
    if kind == "ByteLevel":
        return not part.get("add_prefix_space")
    return kind == "Digits" or (kind == "Split" and _pattern(part) is not None)


def _pattern(part: dict) -> str | None:
    """The known pattern a pre-tokenizer splits by, each match a pre-token of its own."""
    if part.get("type") == "ByteLevel":
        return GPT2 if part.get("use_regex", True) else None
    if part.get("type") != "Split" or part.get("behavior") != "Isolated" or part.get("invert"):
        return None
    pattern = part.get("pattern", {}).get("Regex")
    return pattern if pattern in KNOWN_PATTERNS else None
