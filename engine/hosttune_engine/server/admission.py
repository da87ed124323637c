"""Admission control: a hard cap on sequences in flight, so overload is answered at once (HTTP 429).

The cap is `max_running` (the engine's batch size) plus `max_queue` waiting.
It counts sequences, not HTTP requests: a request with n=4 and two prompts
holds eight slots. Everything here is plain integers on the event-loop thread,
so a rejection never touches the engine loop.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass


@dataclass(frozen=True)
class Rejected:
    """Why a request was not admitted, and when to try again."""

    message: str
    retry_after_s: int


class Admission:
    def __init__(self, max_running: int, max_queue: int, retry_after_s: int = 1):
        self.max_running = max_running
        self.max_queue = max_queue
        self.retry_after_s = retry_after_s
        self.num_in_flight = 0
        self.num_rejected_total = 0

    @property
    def capacity(self) -> int:
        return self.max_running + self.max_queue

    def fits_ever(self, num_seqs: int) -> bool:
        """False for a request larger than the whole capacity: no wait will let it in (a 400, not a 429)."""
        return num_seqs <= self.capacity

    def can_admit(self, num_seqs: int) -> bool:
        return self.num_in_flight + num_seqs <= self.capacity

    def admit(self, num_seqs: int) -> Rejected | None:
        """Take `num_seqs` slots, or count a rejection and say why."""
        if not self.can_admit(num_seqs):
            self.num_rejected_total += 1
            return Rejected(
                f"The server is at capacity ({self.max_running} running + {self.max_queue} queued sequences); "
                f"retry after {self.retry_after_s} s", self.retry_after_s)
        self.num_in_flight += num_seqs
        return None

    def release(self, num_seqs: int) -> None:
        assert self.num_in_flight >= num_seqs, "released more slots than were admitted"
        self.num_in_flight -= num_seqs

    @contextmanager
    def holding(self, num_seqs: int):
        """Slots already admitted, returned when the block ends (however it ends)."""
        try:
            yield
        finally:
            self.release(num_seqs)
