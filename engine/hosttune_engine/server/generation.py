"""One HTTP request's sequences in the engine: n choices per prompt, their outputs and timings.

`Generation.start` submits every choice; iterating `updates()` yields each
output with the choice it belongs to, in engine order, until all are finished.
`abort()` stops whatever is still running: the handler calls it however it
ends (finished, client gone, error), so KV blocks are never left behind.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field, replace

from hosttune_engine.core.messages import EngineRequest, TokenLogprob, TokenOutput
from hosttune_engine.errors import RequestError
from hosttune_engine.sampling import SamplingParams
from hosttune_engine.server.engine_client import EngineClient, RequestFailed
from hosttune_engine.server.metrics import SequenceTiming

INT64 = 2**63


@dataclass
class Choice:
    """One sequence's text, tokens and timings so far."""

    index: int
    request_id: str
    prompt_token_ids: tuple[int, ...]
    sampling: SamplingParams
    arrival: float
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    finished: bool = False
    refused: bool = False  # the engine turned it away (a RequestError, a 400): it never ran
    finish_reason: str | None = None
    stop_reason: str | int | None = None
    num_output_tokens: int = 0
    num_cached_tokens: int = 0
    queue_time: float | None = None
    first_token_time: float | None = None
    last_token_time: float | None = None
    inter_token: list[float] = field(default_factory=list)

    def add(self, out: TokenOutput, now: float) -> None:
        if out.new_token_ids:
            if self.last_token_time is not None:
                self.inter_token.append(now - self.last_token_time)
            self.first_token_time = self.first_token_time or now
            self.last_token_time = now
        self.text += out.new_text
        self.token_ids.extend(out.new_token_ids)
        self.logprobs.extend(out.new_logprobs or ())
        self.num_output_tokens, self.num_cached_tokens = out.num_output_tokens, out.num_cached_tokens
        self.queue_time = out.queue_time if out.queue_time is not None else self.queue_time
        if out.finished:
            self.finished, self.finish_reason, self.stop_reason = True, out.finish_reason, out.stop_reason

    def timing(self, now: float) -> SequenceTiming:
        ttft = self.first_token_time - self.arrival if self.first_token_time else None
        return SequenceTiming(len(self.prompt_token_ids), self.num_output_tokens, self.finish_reason or "abort",
                              now - self.arrival, ttft, self.queue_time, tuple(self.inter_token))


class Generation:
    def __init__(self, client: EngineClient, request_id: str, prompts: list[list[int]],
                 samplings: list[SamplingParams], n: int = 1, priority: int = 0, arrival: float | None = None,
                 shown_id: str | None = None):
        self.client = client
        self.request_id = request_id  # unique: the engine runs its choices by it
        self.shown_id = shown_id or request_id  # what answers and the log call it (a client's X-Request-Id)
        self.prompts = prompts
        self.priority = priority
        self.arrival = time.monotonic() if arrival is None else arrival  # when the HTTP request came in
        self.choices = [Choice(p * n + i, f"{request_id}-{p * n + i}", tuple(ids), _nth_sampling(samplings[p], i),
                               self.arrival) for p, ids in enumerate(prompts) for i in range(n)]
        self._by_id = {c.request_id: c for c in self.choices}
        self._queue: asyncio.Queue = asyncio.Queue()

    @property
    def num_prompt_tokens(self) -> int:
        return sum(len(p) for p in self.prompts)

    @property
    def num_output_tokens(self) -> int:
        return sum(c.num_output_tokens for c in self.choices)

    @property
    def is_finished(self) -> bool:
        return all(c.finished for c in self.choices)

    def start(self) -> None:
        for c in self.choices:
            self.client.submit(EngineRequest(c.request_id, c.prompt_token_ids, c.sampling, self.priority,
                                             arrival_time=self.arrival), self._queue)

    async def updates(self):
        """Yield lists of (choice, output), as many as have arrived, until every choice is finished.

        Raises the engine's error (a `RequestError` for a request it refused) if one fails.
        """
        while not self.is_finished:
            batch = [await self._queue.get()]
            while not self._queue.empty():
                batch.append(self._queue.get_nowait())
            yield [self._apply(item) for item in batch]

    def _apply(self, item: TokenOutput | RequestFailed) -> tuple[Choice, TokenOutput]:
        choice = self._by_id[item.request_id]
        if isinstance(item, RequestFailed):
            choice.finished, choice.finish_reason = True, "abort"
            choice.refused = isinstance(item.error, RequestError)
            raise item.error
        choice.add(item, time.monotonic())
        return choice, item

    def abort(self) -> None:
        for c in self.choices:
            if not c.finished:
                self.client.abort(c.request_id)


def _nth_sampling(sampling: SamplingParams, i: int) -> SamplingParams:
    """With a seed and n > 1, each choice gets its own seed, so the n samples differ and stay reproducible."""
    if i == 0 or sampling.seed is None:
        return sampling
    return replace(sampling, seed=(sampling.seed + i + INT64) % (2 * INT64) - INT64)
