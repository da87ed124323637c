"""Stop strings matched by their automaton: the same matches as checking every string at every character, and a
cost a character that does not grow with their number or lengths (torch-free)."""

import random
import time

import pytest

from hosttune_engine.core.detokenizer import IncrementalDetokenizer
from hosttune_engine.errors import ConfigError
from hosttune_engine.sampling import SamplingParams
from hosttune_engine.stop_automaton import StopAutomaton
from hosttune_engine.stop_strings import MAX_STATES, StopStrings


def _reference(stops, text: str, start: int):
    """The match that starts first among those ending after `start`, of two starting together the shorter."""
    matches = [(end - len(s), len(s)) for end in range(start + 1, len(text) + 1) for s in stops
               if end >= len(s) and text.endswith(s, 0, end)]
    return min(matches, default=(-1, 0))


def _could_begin(stops, text: str) -> int:
    """How many of the last characters of `text` could still begin a stop string."""
    return max(k for k in range(len(text) + 1) if any(s.startswith(text[len(text) - k:]) for s in stops))


def test_matches_and_held_characters_are_those_of_checking_every_string():
    rng = random.Random(7)
    for trial in range(400):
        alphabet = "ab" if trial % 2 else "abc"
        stops = StopStrings(["".join(rng.choices(alphabet, k=rng.randint(1, 5))) for _ in range(rng.randint(1, 6))])
        state, text = 0, ""
        while True:
            start, text = len(text), text + "".join(rng.choices(alphabet + "x", k=rng.randint(0, 4)))
            state, index, length = stops.automaton.scan(state, text, start)
            assert (index, length) == _reference(stops, text, start), (stops, text, start)
            if length or len(text) > 40:
                break
            assert stops.automaton.held(state) == _could_begin(stops, text), (stops, text)


def _seconds_a_char(stop: list[str], text: str) -> float:
    """Fastest of three: the text fed four characters a token, stop strings checked at each."""
    params = SamplingParams(stop=stop)
    pieces = ["ctx"] + [text[i:i + 4] for i in range(0, len(text), 4)]
    best = float("inf")
    for _ in range(3):
        d = IncrementalDetokenizer(PieceTokenizer(pieces), [0], params)
        started = time.perf_counter()
        for i in range(1, len(pieces)):
            assert d.add_token(i) is None
        best = min(best, time.perf_counter() - started)
    return best / len(text)


class PieceTokenizer:
    def __init__(self, pieces):
        self.pieces = pieces

    def decode(self, ids, skip_special_tokens=True):
        return "".join(self.pieces[i] for i in ids)


def test_three_thousand_lengths_cost_a_character_what_one_does():
    """Checking one window a distinct length took 2,999 lengths 2.2 ms a character; the automaton moves a state
    a character (and back down fail links no more often than it went up), whatever the lengths."""
    rng = random.Random(3)
    text = "".join("z" * rng.randint(1, 400) + "a" for _ in range(60))  # deep into the strings, then out
    many = _seconds_a_char(["z" * n + "q" for n in range(1, 3000)], text)
    one = _seconds_a_char(["z" * 2999 + "q"], text)
    assert many < 3 * one, (many, one)


def test_a_match_is_cut_and_nothing_is_held_but_what_could_begin_one():
    params = SamplingParams(stop=["z" * n + "q" for n in range(1, 3000)])
    d = IncrementalDetokenizer(PieceTokenizer(["ctx", "abc zz", "zz", "q tail"]), [0], params)
    assert (d.add_token(1), d.take_new_text(False)) == (None, "abc ")
    assert (d.add_token(2), d.take_new_text(False)) == (None, "")
    assert (d.add_token(3), d.text, d.take_new_text(True)) == ("zzzzq", "abc ", "")


def test_stop_strings_past_a_million_distinct_prefixes_are_refused():
    """Each distinct prefix is a state of the automaton, built in Python (2 to 3 us each) and kept for the
    request's life. Characters the strings share cost a comparison in C, so their total is left to the server's
    body limit (8 MiB unless --max-body-bytes says otherwise): 2,999 lengths hold 4.5 million characters, and
    make 5,999 states."""
    half = MAX_STATES // 2 + 1
    with pytest.raises(ConfigError, match=f"stop: its strings have more than {MAX_STATES} distinct prefixes"):
        SamplingParams(stop=["a" * half, "b" * half])
    # states: "", "a", "aa", "aaa", "aab"
    assert [StopAutomaton(["aaa", "aab"], n).is_complete for n in (4, 5)] == [False, True]
    assert SamplingParams(stop=["z" * n + "q" for n in range(1, 3000)]).stop.automaton.num_states == 5999
