"""Incremental detokenization and stop strings for one request (torch-free)."""

from __future__ import annotations

from hosttune_engine.sampling import SamplingParams

CONTEXT_TOKENS = 5  # prompt tokens decoded with the output, so leading spaces come out right


class IncrementalDetokenizer:
    """Grows a request's text token by token.

    Text is taken as the difference between decoding a window with and without
    the new tokens, and only once it no longer ends in an incomplete UTF-8
    sequence. Stop strings are matched by the request's automaton, one state a
    character; the characters that could still begin a stop string (as many as
    the state's depth) are held back.
    """

    def __init__(self, tokenizer, prompt_token_ids, params: SamplingParams):
        self.tokenizer = tokenizer
        self.params = params
        self.ids = list(prompt_token_ids[-CONTEXT_TOKENS:])
        self.prefix_offset = 0
        self.read_offset = len(self.ids)
        self.text = ""
        self.num_emitted = 0
        self.stopped = False  # a stop string cut the text: nothing more is added
        self.stop_state = 0  # the stop strings' automaton after the text so far

    def add_token(self, token_id: int) -> str | None:
        """Append a token; return the stop string it completed, if any (the text is cut there)."""
        self.ids.append(token_id)
        skip = self.params.skip_special_tokens
        before = self.tokenizer.decode(self.ids[self.prefix_offset : self.read_offset], skip_special_tokens=skip)
        after = self.tokenizer.decode(self.ids[self.prefix_offset :], skip_special_tokens=skip)
        if len(after) <= len(before) or after.endswith("\ufffd"):
            return None
        new = after[len(before) :]
        self.prefix_offset, self.read_offset = self.read_offset, len(self.ids)
        self.text += new
        return self._check_stop(len(new))

    def _check_stop(self, num_new_chars: int) -> str | None:
        if not self.params.stop:
            return None
        # a match ending before the new characters would have been found when they came
        self.stop_state, index, length = self.params.stop.automaton.scan(
            self.stop_state, self.text, len(self.text) - num_new_chars)
        if not length:
            return None
        stop = self.text[index : index + length]
        self.stopped = True
        self.text = self.text[: index + (length if self.params.include_stop_str_in_output else 0)]
        return stop

    def _flush(self) -> None:
        """At the end, bytes still waiting for the rest of a UTF-8 sequence come out as U+FFFD."""
        if self.stopped or self.read_offset == len(self.ids):
            return
        skip = self.params.skip_special_tokens
        before = self.tokenizer.decode(self.ids[self.prefix_offset : self.read_offset], skip_special_tokens=skip)
        after = self.tokenizer.decode(self.ids[self.prefix_offset :], skip_special_tokens=skip)
        self.text += after[len(before) :]
        self.prefix_offset = self.read_offset = len(self.ids)

    def take_new_text(self, finished: bool) -> str:
        """Text not yet handed out, less what a stop string could still claim."""
        if finished:
            self._flush()
        end = len(self.text)
        if not finished and self.params.stop:
            end -= self.params.stop.automaton.held(self.stop_state)
        if end <= self.num_emitted:
            return ""
        new, self.num_emitted = self.text[self.num_emitted : end], end
        return new
