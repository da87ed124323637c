"""One sweep: every candidate config of a kernel checked against the reference on each case, then timed on
it; a candidate's time is its sum over the cases. Candidates not started by the deadline are left out."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field

from hosttune_engine.tuner.cases import Case
from hosttune_engine.tuner.timing import Timer, relative_error

TOL = 2e-2  # max |error| / max |reference| a candidate may have (bf16 outputs)


@dataclass(frozen=True)
class Tried:
    config: dict
    ms: float | None  # summed over the cases; None: it failed, was wrong, or did not apply
    error: str = ""


@dataclass(frozen=True)
class SweepResult:
    kernel: str
    cases: tuple[str, ...]
    tried: tuple[Tried, ...]
    skipped: int  # candidates left out past the deadline

    @property
    def best(self) -> Tried | None:
        ran = [t for t in self.tried if t.ms is not None]
        return min(ran, key=lambda t: t.ms) if ran else None


@dataclass
class Deadline:
    seconds: float
    start: float = field(default_factory=time.perf_counter)

    def passed(self) -> bool:
        return time.perf_counter() - self.start > self.seconds

    def elapsed(self) -> float:
        return time.perf_counter() - self.start


def sweep(kernel: str, candidates: list[dict], cases: list[Case], timer: Timer, deadline: Deadline,
          must: int = 1) -> SweepResult:
    """Each candidate on every case: the first `must` whatever the time, the others until the deadline."""
    tried = []
    for cfg in candidates:
        if len(tried) >= must and deadline.passed():
            break
        tried.append(_try(cfg, cases, timer))
    return SweepResult(kernel, tuple(c.name for c in cases), tuple(tried), len(candidates) - len(tried))


def _try(cfg: dict, cases: list[Case], timer: Timer) -> Tried:
    total = 0.0
    for case in cases:
        try:
            first = case.call(cfg, 0)
            if first is None:
                return Tried(cfg, None, "not applicable")
            err = relative_error(first(), case.want)
            if not err <= TOL:
                return Tried(cfg, None, f"wrong result on {case.name}: error {err:.1e}")
            total += timer.per_call_ms([case.call(cfg, i) for i in range(case.copies)])
        except Exception as e:  # a config that does not compile or fit is reported and skipped
            return Tried(cfg, None, f"{type(e).__name__}: {str(e)[:160]}")
    return Tried(cfg, total)


def config_key(cfg: dict) -> str:
    return json.dumps(cfg, sort_keys=True)
