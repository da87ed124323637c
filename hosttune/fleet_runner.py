"""The one fleet runner: every command that works on many hosts (check, apply, rollback, build,
deploy, verify) runs them through it.

`map` runs one job per host, at most `forks` at a time, and gives the results back in
inventory order; `rollout` adds batches (--serial) and a failure budget (--max-fail-percent):
once more than that share of the hosts tried has failed, later batches are skipped.
`on_host_done(name, outcome)` hears about each host as it finishes (a progress display).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from enum import Enum
from threading import Lock
from typing import Callable, Iterable, Sequence, TypeVar

DEFAULT_FORKS = 50

# Exit code bits, ORed over the hosts of a run.
EXIT_DRIFT = 1
EXIT_ERROR = 2
EXIT_UNREACHABLE = 4

T = TypeVar("T")
R = TypeVar("R")


class Outcome(str, Enum):
    """How one host's run ended; printed as its value."""

    OK = "ok"  # nothing needed changing
    CHANGED = "changed"
    PLANNED = "planned"  # a dry run: what would change
    DEPLOYED = "deployed"
    UNCHANGED = "unchanged"  # the release asked for is live and healthy already
    ROLLED_BACK = "rolled-back"
    RESTORED = "restored"
    NOTHING = "nothing"  # nothing to roll back
    FAILED = "failed"
    UNREACHABLE = "unreachable"
    SKIPPED = "skipped"  # not tried: the failure budget or a canary stopped the rollout

    def __str__(self) -> str:
        return self.value

    @property
    def is_failure(self) -> bool:
        return self in (Outcome.FAILED, Outcome.UNREACHABLE)

    @property
    def exit_bits(self) -> int:
        """2 for a failed host, 4 for an unreachable one; what else a host's result means is its command's to say."""
        return {Outcome.FAILED: EXIT_ERROR, Outcome.UNREACHABLE: EXIT_UNREACHABLE}.get(self, 0)


def exit_code(results: Iterable) -> int:
    """The bits of every host's result (each has `exit_bits`), ORed."""
    code = 0
    for result in results:
        code |= result.exit_bits
    return code


def batches(items: Sequence[T], serial: int | None) -> list[list[T]]:
    size = serial or len(items) or 1
    return [list(items[i:i + size]) for i in range(0, len(items), size)]


def over_budget(outcomes: Iterable[Outcome], max_fail_percent: float | None) -> bool:
    tried = [o for o in outcomes if o is not Outcome.SKIPPED]  # skipped hosts must not dilute the budget
    if max_fail_percent is None or not tried:
        return False
    return sum(1 for o in tried if o.is_failure) * 100.0 / len(tried) > max_fail_percent


class FleetRunner:
    """Runs jobs over hosts: `forks` at a time, in batches of `serial`, within `max_fail_percent`."""

    def __init__(self, forks: int = DEFAULT_FORKS, serial: int | None = None, max_fail_percent: float | None = None,
                 on_host_done: Callable[[str, object], None] | None = None):
        self.forks, self.serial, self.max_fail_percent = forks, serial, max_fail_percent
        self.on_host_done = on_host_done
        self._lock = Lock()

    def done(self, name: str, outcome: object) -> None:
        """Tell the callback that host `name` finished (one call at a time, from any thread)."""
        if self.on_host_done:
            with self._lock:
                self.on_host_done(name, outcome)

    def map(self, work: Callable[[T], R], items: Sequence[T], name: Callable[[T], str] | None = None) -> list[R]:
        """work(item) for every item, at most `forks` at once; results in the items' order.

        name: the host an item is about; given, each result is reported to on_host_done as it comes.
        """
        if not items:
            return []

        def one(item: T) -> R:
            result = work(item)
            if name:
                self.done(name(item), result)
            return result

        with ThreadPoolExecutor(max_workers=max(1, min(self.forks, len(items)))) as pool:
            return list(pool.map(one, items))

    def rollout(self, items: Sequence[T], run_batch: Callable[[list[T]], list[R]],
                skip: Callable[[T, str], list[R]], before: Sequence[R] = ()) -> list[R]:
        """Batch by batch; once the failure budget is spent, every later item gets skip(item, why).

        Results have a `state` (an Outcome); run_batch and skip give one result per host.
        before: results of hosts run already (canaries), which count against the budget too.
        """
        results: list[R] = []
        for batch in batches(items, self.serial):
            if over_budget((r.state for r in [*before, *results]), self.max_fail_percent):
                why = f"not run: more than {self.max_fail_percent:g}% of hosts failed"
                results += [r for item in batch for r in skip(item, why)]
                continue
            results += run_batch(batch)
        return results
