"""Remediation across an inventory: every host surveyed (read-only, the plan), then each host's ladders
climbed, all hosts sharing one circuit breaker."""

from __future__ import annotations

import time
from typing import Callable

from hosttune.config.inventory import Inventory
from hosttune.config.profile import Profile
from hosttune.fleet_runner import DEFAULT_FORKS, FleetRunner
from hosttune.remediate.breaker import Breaker, BreakerPolicy
from hosttune.remediate.climb import Context, HostRemediation, remediate_host
from hosttune.remediate.survey import Survey, survey_host, survey_state
from hosttune.remediate.xid import XidPolicy


def survey_fleet(inventory: Inventory, profiles: dict[str, Profile], policy: XidPolicy, forks: int = DEFAULT_FORKS,
                 on_host_done: Callable[[str, object], None] | None = None) -> list[Survey]:
    return FleetRunner(forks, on_host_done=on_host_done).map(
        lambda h: survey_host(h, profiles[h.name], policy, is_plan=True), list(inventory.hosts), name=lambda h: h.name)


def state_fleet(inventory: Inventory, forks: int = DEFAULT_FORKS) -> list[Survey]:
    """Every host's serving state and cordon, without the probe (uncordon's plan)."""
    return FleetRunner(forks).map(survey_state, list(inventory.hosts), name=lambda h: h.name)


def breaker_for(surveys: list[Survey], policy: BreakerPolicy, now: float | None = None) -> Breaker:
    """The fleet's breaker, counting the hosts already cordoned within its window."""
    cordoned = [s.snapshot.cordon.at for s in surveys if s.snapshot.cordon is not None]
    return Breaker(policy, len(surveys), cordoned, time.time() if now is None else now)


def remediate_fleet(surveys: list[Survey], ctx: Context, forks: int = DEFAULT_FORKS,
                    on_host_done: Callable[[str, object], None] | None = None) -> list[HostRemediation]:
    return FleetRunner(forks, on_host_done=on_host_done).map(
        lambda s: remediate_host(s, ctx), surveys, name=lambda s: s.host.name)
