"""Messages between the engine loop and whoever drives it (the offline API, the HTTP server).

Requests go in with an id, prompt token ids, sampling parameters and an optional
priority; each step sends out incremental outputs (new tokens and text); an
abort names a request id. Stats are a snapshot of counters for metrics.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from hosttune_engine.sampling import SamplingParams


@dataclass(frozen=True)
class EngineRequest:
    request_id: str
    prompt_token_ids: tuple[int, ...]
    sampling: SamplingParams = field(default_factory=SamplingParams)
    priority: int = 0  # lower runs first under scheduling_policy="priority"
    arrival_time: float = field(default_factory=time.monotonic)

    def __post_init__(self) -> None:
        object.__setattr__(self, "prompt_token_ids", tuple(self.prompt_token_ids))


@dataclass(frozen=True)
class AbortRequest:
    request_id: str


@dataclass(frozen=True)
class TokenLogprob:
    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()  # most likely alternatives, best first


@dataclass(frozen=True)
class TokenOutput:
    """What one step added to one request. `new_text` may lag tokens while it could be a stop string."""

    request_id: str
    new_token_ids: tuple[int, ...]
    new_text: str
    new_logprobs: tuple[TokenLogprob, ...] | None
    num_prompt_tokens: int
    num_output_tokens: int
    num_cached_tokens: int
    finished: bool = False
    finish_reason: str | None = None  # "stop", "length" or "abort"
    stop_reason: str | int | None = None  # the stop string or stop token that ended it; None for EOS
    queue_time: float | None = None  # seconds from arrival to first being scheduled (None: not yet)


@dataclass(frozen=True)
class EngineStats:
    """Counters a metrics layer reads; `*_total` only grow."""

    num_running: int
    num_waiting: int
    kv_usage: float  # fraction of KV blocks held by live requests
    num_kv_blocks: int
    num_free_kv_blocks: int
    prefix_cache_queries_total: int  # prompt tokens looked up in the prefix cache
    prefix_cache_hits_total: int  # of those, tokens found
    num_preemptions_total: int
    prompt_tokens_total: int
    generation_tokens_total: int
    num_finished_total: int
    kernel_compiles_total: int | None = None  # Triton kernel variants built so far (None: not counted here)
