"""Sampling parameters of one request (torch-free)."""

from __future__ import annotations

from dataclasses import dataclass, field

from hosttune_engine.errors import ConfigError
from hosttune_engine.stop_strings import StopStrings


@dataclass(frozen=True)
class SamplingParams:
    """How to pick tokens for one request and when to stop.

    `temperature=0` is greedy. `top_k=0` and `top_p=1` disable those filters.
    `logprobs=None` returns no log-probabilities; `logprobs=n` returns the chosen
    token's log-probability and the `n` most likely alternatives (raw model
    distribution, before temperature and filters). Stop strings are cut from the
    text unless `include_stop_str_in_output`; stop tokens and EOS end the request
    and are kept in `token_ids`, their text left out unless
    `include_stop_str_in_output` (as in vLLM).
    """

    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop: tuple[str, ...] = field(default=())
    stop_token_ids: tuple[int, ...] = field(default=())
    ignore_eos: bool = False
    logprobs: int | None = None
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    presence_penalty: float = 0.0  # output tokens: logit -= presence * (seen) + frequency * count
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0  # prompt and output tokens: a positive logit / it, a negative one * it
    min_p: float = 0.0  # drop tokens less probable than min_p times the most probable (after temperature)
    min_tokens: int = 0  # EOS and stop token ids cannot be sampled before this many tokens are out
    logit_bias: tuple[tuple[int, float], ...] = field(default=())  # (token id, bias), bias within +-100

    def __post_init__(self) -> None:
        stop = (self.stop,) if isinstance(self.stop, str) else self.stop or ()
        object.__setattr__(self, "stop", stop if isinstance(stop, StopStrings) else StopStrings(stop))
        object.__setattr__(self, "stop_token_ids", tuple(self.stop_token_ids or ()))
        if self.top_k == -1:
            object.__setattr__(self, "top_k", 0)
        bias = self.logit_bias.items() if isinstance(self.logit_bias, dict) else self.logit_bias or ()
        object.__setattr__(self, "logit_bias", tuple((int(t), max(-100.0, min(100.0, float(b)))) for t, b in bias))
        self._validate()

    def _validate(self) -> None:
        if not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise ConfigError(f"max_tokens must be an integer >= 1, got {self.max_tokens!r}")
        if self.temperature < 0:
            raise ConfigError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ConfigError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ConfigError(f"top_k must be >= 0 (0 or -1 disables it), got {self.top_k}")
        if self.logprobs is not None and not 0 <= self.logprobs <= 20:
            raise ConfigError(f"logprobs must be between 0 and 20, got {self.logprobs}")
        if any(not s for s in self.stop):
            raise ConfigError("stop strings must not be empty")
        if (costly := self.stop.too_costly()) is not None:
            raise ConfigError(costly)
        if any(t < 0 for t in self.stop_token_ids):
            raise ConfigError("stop_token_ids must be non-negative token ids")
        self._validate_adjustments()

    def _validate_adjustments(self) -> None:
        """vLLM's ranges and words."""
        for name in ("presence_penalty", "frequency_penalty"):
            if not -2.0 <= getattr(self, name) <= 2.0:
                raise ConfigError(f"{name} must be in [-2, 2], got {getattr(self, name)}.")
        if not self.repetition_penalty > 0.0:
            raise ConfigError(f"repetition_penalty must be greater than zero, got {self.repetition_penalty}.")
        if not 0.0 <= self.min_p <= 1.0:
            raise ConfigError(f"min_p must be in [0, 1], got {self.min_p}.")
        if not isinstance(self.min_tokens, int) or self.min_tokens < 0:
            raise ConfigError(f"min_tokens must be greater than or equal to 0, got {self.min_tokens}.")
        if self.min_tokens > self.max_tokens:
            raise ConfigError(f"min_tokens must be less than or equal to max_tokens={self.max_tokens}, "
                              f"got {self.min_tokens}.")
        if any(t < 0 for t, _ in self.logit_bias):
            raise ConfigError("logit_bias must map non-negative token ids to biases")

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0 or self.top_k == 1

    @property
    def counts_tokens(self) -> bool:
        """Its logits depend on the tokens so far (a penalty): the sequence keeps its output-token counts."""
        return self.presence_penalty != 0 or self.frequency_penalty != 0 or self.repetition_penalty != 1

    @property
    def adjusts_logits(self) -> bool:
        """Some setting changes the logits before the sampler (penalties, min_p, min_tokens, logit_bias)."""
        return self.counts_tokens or self.min_p > 0 or self.min_tokens > 0 or bool(self.logit_bias)

    @property
    def max_stop_len(self) -> int:
        return self.stop.max_len
