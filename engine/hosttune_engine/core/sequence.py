"""One request's token state as the scheduler and block manager see it (torch-free)."""

from __future__ import annotations

import itertools
from collections import Counter
from enum import Enum

from hosttune_engine.sampling import SamplingParams

_counter = itertools.count()


class SequenceStatus(Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class Sequence:
    """Prompt plus generated tokens, how many of them have KV in the cache, and where.

    `num_computed_tokens` counts tokens whose keys and values are in the KV cache;
    a step computes `token_ids[num_computed_tokens : num_computed_tokens + n]`.
    `block_hashes[i]` is the chained hash of full block i (filled lazily).
    While a step scheduled ahead of the one before is in flight, the last of
    `token_ids` may be a placeholder for a token still on the device
    (`has_pending_token`): it is set when that step is collected.
    """

    def __init__(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        sampling: SamplingParams,
        priority: int = 0,
        arrival_time: float = 0.0,
    ) -> None:
        self.request_id = request_id
        self.token_ids = list(prompt_token_ids)
        self.num_prompt_tokens = len(prompt_token_ids)
        self.sampling = sampling
        self.priority = priority
        self.arrival_time = arrival_time
        self.first_scheduled_time: float | None = None  # time.monotonic() when it first ran
        self.index = next(_counter)  # admission order; ties in priority break on it
        self.status = SequenceStatus.WAITING
        self.finish_reason: str | None = None
        self.stop_reason: str | int | None = None
        self.num_computed_tokens = 0
        self.num_cached_tokens = 0  # prefix-cache hit when first scheduled
        self.num_preemptions = 0
        self.block_table: list[int] = []
        self.block_hashes: list[int] = []
        self.has_pending_token = False
        # what a penalty reads, kept only where the request sets one: each output token's count, the prompt's ids
        self.output_counts: Counter[int] | None = Counter() if sampling.counts_tokens else None
        self.prompt_ids = tuple(set(prompt_token_ids)) if sampling.counts_tokens else ()

    def __repr__(self) -> str:
        return (
            f"Sequence({self.request_id!r}, tokens={self.num_tokens}, "
            f"computed={self.num_computed_tokens}, {self.status.value})"
        )

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_known_tokens(self) -> int:
        """Tokens whose ids are on the host (all but a pending one)."""
        return len(self.token_ids) - self.has_pending_token

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def num_uncomputed_tokens(self) -> int:
        return len(self.token_ids) - self.num_computed_tokens

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED

    def append_token(self, token_id: int) -> None:
        self.token_ids.append(token_id)
        if self.output_counts is not None:
            self.output_counts[token_id] += 1

    def hold_pending_token(self, placeholder: int) -> None:
        """A token that a step in flight samples, appended before its id is known."""
        self.token_ids.append(placeholder)
        self.has_pending_token = True

    def set_pending_token(self, token_id: int) -> None:
        self.token_ids[-1] = token_id
        self.has_pending_token = False
        if self.output_counts is not None:
            self.output_counts[token_id] += 1

    def block_tokens(self, block_index: int, block_size: int) -> tuple[int, ...]:
        start = block_index * block_size
        return tuple(self.token_ids[start : start + block_size])
