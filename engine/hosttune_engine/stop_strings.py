"""A request's stop strings, indexed once so that matching costs the new text, not the strings (torch-free)."""

from __future__ import annotations

from hosttune_engine.stop_automaton import StopAutomaton

# The distinct prefixes a request's stop strings may have in all: each is a state of their automaton, which
# takes 16 bytes for the request's life and 2 to 3 us of Python, holding the GIL, to build (1.8 s for 500,000
# strings of 9 characters, 555,559 states, on a 2-core test machine). Characters the strings share cost a
# comparison in C: how many there are in all is left to the body's limit (the server's --max-body-bytes).
MAX_STATES = 1 << 20


class StopStrings(tuple):
    """The stop strings as a tuple, with their `StopAutomaton` (None for none).

    Building it walks every string once; a request with many of them (a large
    body) builds it where the body is parsed, not on the engine thread.
    """

    def __new__(cls, strings=()):
        self = super().__new__(cls, strings)
        self.automaton = StopAutomaton(self, MAX_STATES) if self else None
        self.max_len = self.automaton.max_len if self else 0
        return self

    def too_costly(self) -> str | None:
        """Why indexing these would take too long, or None."""
        if self.automaton is None or self.automaton.is_complete:
            return None
        return (f"stop: its strings have more than {MAX_STATES} distinct prefixes (the states of their matcher); "
                "use fewer or shorter strings")
