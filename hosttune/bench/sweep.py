"""The rate sweep: the highest open-loop request rate at which the SLO still holds.

Each step is a short open-loop run at one rate (same prompts, seed and burstiness).
A step holds when the SLO is met *and* the server kept up: the number of requests in
flight did not grow over the step by more than chance allows (a server past saturation
builds a queue that a short step may not yet show in its percentiles; see metrics.py).
The rate grows by `growth` per step until a step breaks (or `max_rate` is reached),
then the gap between the highest rate that held and the lowest that broke is halved
(in log space) until it is within `precision`. The answer is the highest rate that
held. A step where the client fell behind is marked (`is_client_bound`): the client's
lateness can only make latencies look worse, so a step that held still held, but a
step that broke there may have broken because of the client. A signal (Ctrl-C, SIGTERM)
that cuts a step short ends the sweep: that step is kept but judges no rate. So does a step
no request arrived in (a low rate over a short step: a lower one would see fewer still), and one whose every
request failed (a server gone or refusing: its rate is not what broke it, and each later step would fail alike).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

from hosttune.bench.benchmark import BenchSpec, measure
from hosttune.bench.metrics import Slo, Summary, summarize
from hosttune.bench.record import RunRecord
from hosttune.bench.units import rate_text
from hosttune.errors import BenchError


@dataclass(frozen=True)
class SweepConfig:
    start_rate: float = 1.0
    max_rate: float = 10_000.0
    growth: float = 2.0
    precision: float = 0.05  # stop when the bracket's width is this fraction of its low end
    max_steps: int = 20

    def __post_init__(self) -> None:
        if not 0 < self.start_rate <= self.max_rate < math.inf:
            raise BenchError("--sweep-start must be positive and at most --sweep-max, a finite rate")
        if not 1 < self.growth < math.inf:
            raise BenchError(f"--sweep-growth {self.growth:g}: give a factor > 1 between steps, e.g. 2")
        if not 0 < self.precision < 1:
            raise BenchError(f"--sweep-precision {self.precision:g}: give a fraction between 0 and 1, e.g. 0.05")
        assert self.max_steps >= 1


@dataclass(frozen=True)
class SweepPoint:
    rate: float
    summary: Summary
    run: RunRecord

    @property
    def is_held(self) -> bool:
        return not self.run.stopped_by and bool(self.summary.slo_met) and self.summary.is_kept_up

    @property
    def is_empty(self) -> bool:
        """No request arrived in the step's window: it judges no rate."""
        return not self.run.stopped_by and self.summary.num_requests == 0

    @property
    def is_failed(self) -> bool:
        """Every measured request failed: the step judges no rate, and the sweep ends there."""
        return not self.run.stopped_by and 0 < self.summary.num_requests == self.summary.num_failed

    @property
    def verdict(self) -> str:
        """held, broke, or why the step judges no rate."""
        if self.run.stopped_by:
            return f"stopped by {self.run.stopped_by}"
        if self.is_empty:
            return "no request arrived"
        if self.is_failed:
            return "every request failed"
        return "held" if self.is_held else "broke"

    @property
    def is_client_bound(self) -> bool:
        """The client fell behind: a broken SLO here may be the client's doing."""
        return self.summary.lag.is_behind


@dataclass(frozen=True)
class SweepResult:
    url: str
    slo: Slo
    points: tuple[SweepPoint, ...]  # in the order they ran
    max_rate: float | None  # highest rate that held; None if even the first broke
    first_broken: float | None  # lowest rate that broke; None if none did
    is_capped: bool  # reached max_rate without breaking
    stopped_by: str | None = None  # the signal that ended the sweep before its answer


def empty_note(result: SweepResult) -> str:
    """What to do about a step no request arrived in ('' when none)."""
    empty = [p for p in result.points if p.is_empty]
    if not empty:
        return ""
    rate, duration = empty[0].rate, empty[0].run.window[1] - empty[0].run.window[0]
    return (f"no request arrived in the step at {rate_text(rate)} requests/s (its {duration:g} s expect "
            f"{rate * duration:.2g} on average): the sweep ended there; give a longer --duration")


def next_rate(held: float | None, broken: float | None, config: SweepConfig) -> float | None:
    """The next rate to try, or None when the bracket is narrow enough."""
    if broken is None:
        rate = config.start_rate if held is None else held * config.growth
        return None if held is not None and held >= config.max_rate else min(rate, config.max_rate)
    if held is None:  # even the first rate broke: look lower
        lower = broken / config.growth
        return lower if lower >= config.start_rate / 100 else None
    if broken / held - 1 <= config.precision:
        return None
    return math.sqrt(held * broken)


async def sweep(spec: BenchSpec, url: str, slo: Slo, config: SweepConfig,
                on_point: Callable[[SweepPoint], None] | None = None) -> SweepResult:
    """Run the sweep against one endpoint; `spec.load` gives duration and burstiness."""
    if spec.load.rate is None:
        raise BenchError("a sweep drives an open-loop rate: drop --users")
    held: float | None = None
    broken: float | None = None
    points: list[SweepPoint] = []
    while len(points) < config.max_steps:
        rate = next_rate(held, broken, config)
        if rate is None:
            break
        run = await measure(spec.with_load(rate=rate), url)
        point = SweepPoint(rate, summarize(run, slo, spec.lag_limit), run)
        points.append(point)
        if on_point:
            on_point(point)
        if run.stopped_by or point.is_empty or point.is_failed:
            break
        if point.is_held:
            held = rate
        else:
            broken = rate
    return result_of(url, slo, points, config, points[-1].run.stopped_by if points else None)


def result_of(url: str, slo: Slo, points: list[SweepPoint], config: SweepConfig,
              stopped_by: str | None = None) -> SweepResult:
    """The sweep's answer from the steps run: the bracket only narrows, so the highest rate that held and the
    lowest that broke (a step a signal cut short, that no request arrived in or whose every request failed, judges
    neither)."""
    held = max((p.rate for p in points if p.is_held), default=None)
    broken = min((p.rate for p in points if p.verdict == "broke"), default=None)
    is_capped = broken is None and held is not None and held >= config.max_rate
    return SweepResult(url, slo, tuple(points), held, broken, is_capped, stopped_by)
