"""A request's stop strings, indexed once so that matching costs the new text, not the number of strings (torch-free)."""

from __future__ import annotations

from itertools import groupby


class StopStrings(tuple):
    """The stop strings as a tuple, with them grouped by length in sets.

    Building it walks every string once; a request with many of them (a large
    body) builds it where the body is parsed, not on the engine thread. Finding
    the matches that end in n new characters is then n lookups per distinct
    length, however many strings there are.
    """

    def __new__(cls, strings=()):
        self = super().__new__(cls, strings)
        self.by_length = _by_length(self)
        self.max_len = self.by_length[-1][0] if self.by_length else 0
        return self

    def earliest_match(self, text: str, num_new_chars: int) -> tuple[int, str] | None:
        """(index, string) of the match that starts first among those ending in the last `num_new_chars`
        characters of `text` (of two starting together, the shorter), or None."""
        best = None
        for end in range(len(text) - num_new_chars + 1, len(text) + 1):
            for n, group in self.by_length:
                if n > end:
                    break
                start = end - n  # a shorter match at this start ended earlier and is already best
                if (best is None or start < best[0]) and text[start:end] in group:
                    best = (start, text[start:end])
        return best


def _by_length(strings: tuple[str, ...]) -> tuple[tuple[int, frozenset[str]], ...]:
    """(length, strings of that length), shortest first."""
    lengths = set(map(len, strings))
    if len(lengths) == 1:  # one set of them all, without sorting them
        return ((lengths.pop(), frozenset(strings)),)
    return tuple((n, frozenset(group)) for n, group in groupby(sorted(strings, key=len), key=len))
