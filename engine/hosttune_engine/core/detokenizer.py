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
    the state's depth) are held back. As in vLLM, none is looked for until more
    than `min_tokens` tokens are out; then from just before the new text.
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
        self.num_tokens = 0
        self.scanned = params.min_tokens == 0  # the automaton has read the text so far

    def add_token(self, token_id: int) -> str | None:
        """Append a token; return the stop string it completed, if any (the text is cut there)."""
        self.ids.append(token_id)
        self.num_tokens += 1
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
        if not self.params.stop or self.num_tokens <= self.params.min_tokens:
            return None
        # a match ending before the new characters would have been found when they came
        start = len(self.text) - num_new_chars
        if not self.scanned:  # the first look after min_tokens: a match may end in the new characters
            self.stop_state, start, self.scanned = 0, max(0, start - self.params.max_stop_len + 1), True
        self.stop_state, index, length = self.params.stop.automaton.scan(self.stop_state, self.text, start)
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
        if not finished and self.params.stop:  # before the first look, what a match ending later may begin with
            end -= self.params.stop.automaton.held(self.stop_state) if self.scanned else self.params.max_stop_len - 1
        if end <= self.num_emitted:
            return ""
        new, self.num_emitted = self.text[self.num_emitted : end], end
        return new
