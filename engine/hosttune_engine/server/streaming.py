"""Server-Sent Events in OpenAI's chunk format, for completions and chat completions.

A batch of engine outputs becomes at most one chunk per choice (outputs that
arrived together are merged), all written with one socket write. Text the
engine holds back (it could still become a stop string) delays a chunk; the
logprobs of those tokens wait and go out with it. With `return_token_ids` every
batch that adds tokens is a chunk, text or not (a model without a tokenizer has
none), carrying the ids it adds and, first in a choice's stream, the prompt's:
in a completion choice's first chunk, or in chat's opening chunks, as vLLM does.
"""

from __future__ import annotations

from hosttune_engine.core.messages import TokenOutput
from hosttune_engine.server import responses as r
from hosttune_engine.server.generation import Choice, Generation
from hosttune_engine.server.schemas.options import GenerationOptions

DONE = b"data: [DONE]\n\n"


def sse(body: dict) -> bytes:
    return b"data: " + r.dumps(body) + b"\n\n"


class ChunkWriter:
    def __init__(self, gen: Generation, chat: bool, model: str, created: int, options: GenerationOptions,
                 logprob_entries):
        self.gen, self.chat, self.model, self.created = gen, chat, model, created
        self.include_usage = options.include_usage
        self.continuous_usage = options.continuous_usage
        self.want_logprobs = options.logprobs is not None
        self.want_ids = options.return_token_ids
        self.logprob_entries = logprob_entries  # TokenLogprob list -> LogprobEntry list
        self._pending_lps: dict[int, list] = {c.index: [] for c in gen.choices}
        self._text_offsets: dict[int, int] = {c.index: 0 for c in gen.choices}
        self._prompt_shown: set[int] = set()  # completion choices whose prompt ids went out

    def _chunk(self, choices: list[dict], usage_body: dict | None = None, prompt_token_ids=None) -> bytes:
        build = r.chat_chunk if self.chat else r.completion_chunk
        body = build(self.gen.shown_id, self.created, self.model, choices, self.include_usage, usage_body)
        return sse(r.with_token_ids(body, prompt_token_ids=prompt_token_ids))

    def opening(self) -> bytes:
        """Chat streams start with the assistant role, one chunk per choice, as OpenAI's do."""
        if not self.chat:
            return b""
        prompt = self.gen.prompts[0] if self.want_ids else None
        return b"".join(self._chunk([r.chat_delta_choice(c.index, {"role": "assistant", "content": ""}, None)],
                                    self._usage_so_far(c, 0), prompt) for c in self.gen.choices)

    def chunks(self, batch: list[tuple[Choice, TokenOutput]]) -> bytes:
        merged: dict[int, tuple[Choice, str, list, list, bool]] = {}
        for choice, out in batch:
            _, text, lps, ids, _ = merged.get(choice.index, (choice, "", [], [], False))
            merged[choice.index] = (choice, text + out.new_text, lps + list(out.new_logprobs or ()),
                                    ids + list(out.new_token_ids), out.finished)
        return b"".join(self._choice_chunk(*m) for m in merged.values())

    def _choice_chunk(self, choice: Choice, text: str, logprobs: list, ids: list, finished: bool) -> bytes:
        pending = self._pending_lps[choice.index]
        pending.extend(logprobs)
        if not text and not finished and not (self.want_ids and ids):
            return b""
        lp_body = self._logprobs(choice.index, pending) if self.want_logprobs else None
        pending.clear()
        reason, stop = (choice.finish_reason, choice.stop_reason) if finished else (None, None)
        if self.chat:
            delta = {"content": text} if text else {}
            body = r.chat_delta_choice(choice.index, delta, lp_body, reason, stop)
        else:
            body = r.completion_choice(choice.index, text, lp_body, reason, stop)
        return self._chunk([self._with_ids(choice, body, ids)], self._usage_so_far(choice))

    def _usage_so_far(self, choice: Choice, num_output_tokens: int | None = None) -> dict | None:
        """With continuous usage, a choice's chunk counts its prompt and the tokens generated so far (vLLM's); the
        role chunks that open a chat count none."""
        if not self.continuous_usage:
            return None
        done = choice.num_output_tokens if num_output_tokens is None else num_output_tokens
        return r.usage(len(choice.prompt_token_ids), done)

    def _with_ids(self, choice: Choice, body: dict, ids: list) -> dict:
        if not self.want_ids:
            return body
        show_prompt = not self.chat and choice.index not in self._prompt_shown
        self._prompt_shown.add(choice.index)
        return r.with_token_ids(body, ids, choice.prompt_token_ids if show_prompt else None)

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
