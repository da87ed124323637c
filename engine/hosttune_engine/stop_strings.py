"""A request's stop strings, indexed once so that matching costs the new text, not the number of strings (torch-free)."""

from __future__ import annotations

from itertools import groupby

# The characters one new character of the output is checked against: one window of each distinct stop length.
# Past it a request slows every stream on the engine thread (2,999 lengths of up to 3,000 characters took 2.2 ms a
# character); one stop string of up to this many characters, or any number of strings of one length, stay under.
MAX_LENGTHS_SUM = 16384


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
        self.lengths_sum = sum(n for n, _ in self.by_length)
        return self

    def too_costly(self) -> str | None:
        """Why matching these would slow every stream (the lengths checked at each new character), or None."""
        if self.lengths_sum <= MAX_LENGTHS_SUM:
            return None
        return (f"stop: its strings have {len(self.by_length)} different lengths, which sum to {self.lengths_sum} "
                f"characters, each checked at every new character of the output; at most {MAX_LENGTHS_SUM}: use "
                "fewer different lengths")

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
