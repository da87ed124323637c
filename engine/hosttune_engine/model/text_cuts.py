"""Where a long text can be cut so that its pieces tokenize to exactly the whole text's tokens.

The `tokenizers` library first splits a text at its added tokens (those not
normalized, found left to right, longest first), then normalizes, pre-tokenizes
and tokenizes each split on its own. So a cut right after an added token that
the whole text's search finds anyway changes nothing, provided no step looks
at where its split lies in the text (Metaspace's `prepend_scheme: first` does),
nothing is random (BPE dropout), and no truncation or padding is set. That
search finds every occurrence of a token T when no other added token holds T,
and none (T included) ends in a proper beginning of T; and no added token
reaches for the spaces or words around it (`lstrip`, `rstrip`, `single_word`).
Counting a text's tokens a piece at a time can then stop as soon as the count
passes a limit: the whole text has at least that many.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator

MODELS = ("BPE", "WordPiece", "WordLevel", "Unigram")  # each tokenizes one pre-token at a time, as a pure function


class TextCuts:
    """Cut tokens of one tokenizer, and the pieces of a text that end in one of them."""

    def __init__(self, tokens: tuple[str, ...]):
        self.tokens = tokens
        self._pattern = re.compile("|".join(map(re.escape, tokens)))

    def pieces(self, text: str, min_chars: int) -> Iterator[str]:
        """Leading pieces of `text`, each of at least `min_chars` characters and ending in a cut token; what
        follows the last is not given."""
        start = 0
        while (found := self._pattern.search(text, start + min_chars)) is not None:
            yield text[start : found.end()]
            start = found.end()


def text_cuts(tok) -> TextCuts | None:
    """The cuts of a `tokenizers.Tokenizer`, or None if its pipeline gives no such guarantee."""
    added = list(tok.get_added_tokens_decoder().values())
    if not _is_split_independent(tok) or any(a.lstrip or a.rstrip or a.single_word for a in added):
        return None
    contents = [a.content for a in added if not a.normalized]
    if any("\0" in c for c in contents):
        return None
    joined, endings = "\0".join(contents), {c[i:] for c in contents for i in range(1, len(c))}
    tokens = tuple(a.content for a in added
                   if a.special and not a.normalized and _is_always_found(a.content, joined, endings))
    return TextCuts(tokens) if tokens else None


def _is_split_independent(tok) -> bool:
    if tok.truncation is not None or tok.padding is not None or tok.encode_special_tokens:
        return False
    if type(tok.model).__name__ not in MODELS or getattr(tok.model, "dropout", None):
        return False
    try:  # a custom (Python) normalizer or pre-tokenizer cannot be read, so it cannot be vouched for
        states = [json.loads(c.__getstate__()) for c in (tok.normalizer, tok.pre_tokenizer) if c is not None]
    except Exception:
        return False
    return not _prepends_first_only(states)


def _prepends_first_only(state) -> bool:
    """Whether a pre-tokenizer's state holds a Metaspace that prepends only to the text's first split."""
    if isinstance(state, dict):
        if state.get("type") == "Metaspace" and state.get("prepend_scheme", "always") not in ("always", "never"):
            return True
        return any(_prepends_first_only(v) for v in state.values())
    return isinstance(state, list) and any(_prepends_first_only(v) for v in state)


def _is_always_found(token: str, joined: str, endings: set[str]) -> bool:
    """No other added token holds `token` (it is once in `joined`, the contents between NULs), and none ends in
    a proper beginning of it (`endings`: their proper endings)."""
    return joined.count(token) == 1 and not any(token[:j] in endings for j in range(1, len(token)))
