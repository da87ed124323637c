"""The circuit breaker: once cordoning one more host would put more than --max-cordoned-percent of the
fleet out within the window, the ladder stops on every host and says why.

A cordon asks first (`can_cordon`, then `cordon` under one lock, so parallel hosts cannot both take the
last place); once open, `why` is the reason every host's recap gives.
"""

from __future__ import annotations

from dataclasses import dataclass
from threading import Lock

from hosttune.errors import HosttuneError


class BreakerError(HosttuneError):
    """A circuit breaker setting that cannot hold."""


@dataclass(frozen=True)
class BreakerPolicy:
    max_cordoned_percent: float = 10.0
    window_s: float = 3600.0

    def __post_init__(self) -> None:
        if not 0 <= self.max_cordoned_percent <= 100:
            raise BreakerError(f"--max-cordoned-percent {self.max_cordoned_percent:g} is not between 0 and 100")
        if self.window_s <= 0:
            raise BreakerError("the breaker's window must be longer than 0 s")


class Breaker:
    def __init__(self, policy: BreakerPolicy, num_hosts: int, cordoned_at: list[float], now: float):
        self.policy = policy
        self.num_hosts = max(num_hosts, 1)
        self.num_cordoned = sum(1 for at in cordoned_at if at >= now - policy.window_s)
        self.why = ""
        self._lock = Lock()

    @property
    def is_open(self) -> bool:
        return bool(self.why)

    def _share(self, count: int) -> float:
        return 100.0 * count / self.num_hosts

    @property
    def room(self) -> int:
        """How many more hosts may be cordoned before the breaker opens."""
        allowed = int(self.policy.max_cordoned_percent * self.num_hosts / 100)
        while self._share(allowed + 1) <= self.policy.max_cordoned_percent:
            allowed += 1
        while allowed > 0 and self._share(allowed) > self.policy.max_cordoned_percent:
            allowed -= 1
        return max(0, allowed - self.num_cordoned)

    def summary(self) -> str:
        """What the plan needs to know: how many cordons this run may make before the breaker stops it."""
        hosts = "host" if self.num_hosts == 1 else "hosts"
        return (f"circuit breaker: {self.num_cordoned} of {self.num_hosts} {hosts} cordoned within "
                f"{self.policy.window_s / 60:g} min; {self.room} more may be (--max-cordoned-percent "
                f"{self.policy.max_cordoned_percent:g}), a cordon past that stops remediation on every host")

    def cordon(self, host: str) -> str:
        """Take a place for this host's cordon: "" when granted, else why not (the breaker is open then)."""
        with self._lock:
            if self.why:
                return self.why
            after = self.num_cordoned + 1
            if self._share(after) > self.policy.max_cordoned_percent:
                self.why = (f"circuit breaker open: cordoning {host} would make {after} of {self.num_hosts} hosts "
                            f"({self._share(after):.0f}%) cordoned within {self.policy.window_s / 60:g} min, over "
                            f"--max-cordoned-percent {self.policy.max_cordoned_percent:g}; remediation stopped on every host")
                return self.why
            self.num_cordoned = after
            return ""
