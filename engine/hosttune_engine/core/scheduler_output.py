"""One step's schedule: which sequences run and with how many new tokens (torch-free)."""

from __future__ import annotations

from dataclasses import dataclass, field

from hosttune_engine.core.sequence import Sequence


@dataclass
class SchedulerOutput:
    """One step's work. Prefill chunks (more than one new token) come before decodes."""

    seqs: list[Sequence] = field(default_factory=list)
    num_new_tokens: list[int] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)
    estimate_s: float | None = None  # the cost model's time of a step held to a time budget

    @property
    def is_empty(self) -> bool:
        return not self.seqs

    @property
    def num_tokens(self) -> int:
        return sum(self.num_new_tokens)

    @property
    def num_prefill_seqs(self) -> int:
        return sum(1 for n in self.num_new_tokens if n > 1)

    def sample_mask(self) -> list[bool]:
        """Which sequences reach their last token this step, so get a sampled token."""
        return [s.num_computed_tokens + n == len(s.token_ids) for s, n in zip(self.seqs, self.num_new_tokens)]
