"""Server-Sent Events in OpenAI's chunk format, for completions and chat completions.

A batch of engine outputs becomes at most one chunk per choice (outputs that
arrived together are merged), all written with one socket write. Text the
engine holds back (it could still become a stop string) delays a chunk; the
logprobs of those tokens wait and go out with it.
"""

from __future__ import annotations

from hosttune_engine.core.messages import TokenOutput
from hosttune_engine.server import responses as r
from hosttune_engine.server.generation import Choice, Generation

DONE = b"data: [DONE]\n\n"


def sse(body: dict) -> bytes:
    return b"data: " + r.dumps(body) + b"\n\n"


class ChunkWriter:
    def __init__(self, gen: Generation, chat: bool, model: str, created: int, include_usage: bool,
                 want_logprobs: bool, logprob_entries):
        self.gen, self.chat, self.model, self.created = gen, chat, model, created
        self.include_usage = include_usage
        self.want_logprobs = want_logprobs
        self.logprob_entries = logprob_entries  # TokenLogprob list -> LogprobEntry list
        self._pending_lps: dict[int, list] = {c.index: [] for c in gen.choices}
        self._text_offsets: dict[int, int] = {c.index: 0 for c in gen.choices}

    def _chunk(self, choices: list[dict], usage_body: dict | None = None) -> bytes:
        build = r.chat_chunk if self.chat else r.completion_chunk
        return sse(build(self.gen.request_id, self.created, self.model, choices, self.include_usage, usage_body))

    def opening(self) -> bytes:
        """Chat streams start with the assistant role, one chunk per choice, as OpenAI's do."""
        if not self.chat:
            return b""
        return b"".join(self._chunk([r.chat_delta_choice(c.index, {"role": "assistant", "content": ""}, None)])
                        for c in self.gen.choices)

    def chunks(self, batch: list[tuple[Choice, TokenOutput]]) -> bytes:
        merged: dict[int, tuple[Choice, str, list, bool]] = {}
        for choice, out in batch:
            _, text, lps, _ = merged.get(choice.index, (choice, "", [], False))
            merged[choice.index] = (choice, text + out.new_text, lps + list(out.new_logprobs or ()), out.finished)
        return b"".join(self._choice_chunk(*m) for m in merged.values())

    def _choice_chunk(self, choice: Choice, text: str, logprobs: list, finished: bool) -> bytes:
        pending = self._pending_lps[choice.index]
        pending.extend(logprobs)
        if not text and not finished:
            return b""
        lp_body = self._logprobs(choice.index, pending) if self.want_logprobs else None
        pending.clear()
        reason, stop = (choice.finish_reason, choice.stop_reason) if finished else (None, None)
        if self.chat:
            delta = {"content": text} if text else {}
            return self._chunk([r.chat_delta_choice(choice.index, delta, lp_body, reason, stop)])
        return self._chunk([r.completion_choice(choice.index, text, lp_body, reason, stop)])

    def _logprobs(self, index: int, logprobs: list) -> dict:
        entries = self.logprob_entries(logprobs)
        if self.chat:
            return r.chat_logprobs(entries)
        body = r.completion_logprobs(entries, self._text_offsets[index])
        self._text_offsets[index] += sum(len(e.token.text) for e in entries)
        return body

    def closing(self) -> bytes:
        """The usage chunk (when asked for) and the end marker."""
        if not self.include_usage:
            return DONE
        usage_body = r.usage(self.gen.num_prompt_tokens, self.gen.num_output_tokens)
        return self._chunk([], usage_body) + DONE
