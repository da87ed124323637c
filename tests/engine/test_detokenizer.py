"""Incremental detokenization and stop strings with a fake byte tokenizer (no torch)."""

import dataclasses

from hosttune_engine.core.detokenizer import IncrementalDetokenizer
from hosttune_engine.sampling import SamplingParams


class ByteTokenizer:
    """Token id = one UTF-8 byte; decode shows U+FFFD for a cut multi-byte character."""

    def decode(self, ids, skip_special_tokens=True):
        return bytes(ids).decode("utf-8", errors="replace")


def feed(text: str, params: SamplingParams, finish_at_end=True):
    d = IncrementalDetokenizer(ByteTokenizer(), list(b"ctx: "), params)
    pieces, stop = [], None
    data = text.encode()
    for i, b in enumerate(data):
        stop = d.add_token(b)
        pieces.append(d.take_new_text(finished=stop is not None or (finish_at_end and i == len(data) - 1)))
        if stop:
            break
    return pieces, stop, d


def test_text_grows_and_waits_for_whole_characters():
    pieces, stop, d = feed("aé€b", SamplingParams())
    assert "".join(pieces) == "aé€b" and stop is None
    assert all("\ufffd" not in p for p in pieces)
    assert pieces[1] == "" and pieces[2] == "é"  # é is two bytes: nothing after the first


def test_stop_string_cuts_text_and_is_never_streamed():
    pieces, stop, _ = feed("hello STOP world", SamplingParams(stop=["STOP", "xyz"]))
    assert stop == "STOP"
    assert "".join(pieces) == "hello "
    assert not any("S" in p for p in pieces)


def test_stop_string_kept_when_asked():
    pieces, stop, _ = feed("hello STOP world", SamplingParams(stop=["STOP"], include_stop_str_in_output=True))
    assert "".join(pieces) == "hello STOP"


def test_held_back_text_is_released_at_the_end():
    pieces, stop, _ = feed("abcST", SamplingParams(stop=["STOP"]))
    assert stop is None and "".join(pieces) == "abcST"
    assert pieces == ["a", "b", "c", "", "ST"]  # only "S", then "ST", could have begun "STOP"


def test_cut_character_at_the_end_is_flushed():
    d = IncrementalDetokenizer(ByteTokenizer(), [], SamplingParams())
    d.add_token(0x61)
    d.add_token(0xE2)  # first byte of a three-byte character
    assert d.take_new_text(finished=False) == "a"
    assert d.take_new_text(finished=True) == "\ufffd"


class PieceTokenizer:
    """Token id = an index into `pieces`: one token may bring several characters."""

    def __init__(self, pieces):
        self.pieces = pieces

    def decode(self, ids, skip_special_tokens=True):
        return "".join(self.pieces[i] for i in ids)


def feed_pieces(pieces, params: SamplingParams):
    d = IncrementalDetokenizer(PieceTokenizer(["ctx"] + pieces), [0], params)
    for i in range(1, len(pieces) + 1):
        if stop := d.add_token(i):
            return stop, d.text
    return None, d.text


def test_of_matches_in_one_token_the_earliest_start_wins_then_the_shortest():
    assert feed_pieces(["xAB", "CDEy"], SamplingParams(stop=["CD", "BCD", "ABCDE"])) == ("ABCDE", "x")
    assert feed_pieces(["xABCy"], SamplingParams(stop=["ABC", "AB"])) == ("AB", "x")


def test_a_stop_string_across_three_tokens_is_found_where_the_last_one_ends_it():
    params = SamplingParams(stop=["nomatch", "LONGSTOP"], include_stop_str_in_output=True)
    assert feed_pieces(["ab LO", "NGS", "TOP and", " more"], params) == ("LONGSTOP", "ab LONGSTOP")


def test_stop_strings_are_indexed_once_and_kept_by_replace():
    params = SamplingParams(stop=["ab", "c", "ab"])
    assert params.stop == ("ab", "c", "ab") and params.max_stop_len == 2
    assert dataclasses.replace(params, seed=3).stop is params.stop


def test_stop_strings_are_looked_for_once_more_than_min_tokens_are_out():
    """As vLLM: a stop string within the first min_tokens tokens is not one; one that ends after them is, even
    when it began inside them."""
    params = SamplingParams(stop=["ab"], min_tokens=4, max_tokens=16)
    pieces, stop, _ = feed("abxab", params)
    assert stop == "ab" and "".join(pieces) == "abx"
    pieces, stop, _ = feed("xxxaby", params)  # "ab" ends with the 5th token
    assert stop == "ab" and "".join(pieces) == "xxx"
    pieces, stop, _ = feed("xxabyy", params)  # ends with the 4th: within min_tokens
    assert stop is None and "".join(pieces) == "xxabyy"
