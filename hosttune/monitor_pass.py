"""One pass of the monitor on its own host (what apply's timers run): check this machine against the profile
apply wrote, and make the status document and the metrics of what was found. Writes nothing itself."""

from __future__ import annotations

import time
from dataclasses import dataclass, replace

from hosttune import __version__
from hosttune.checks import active as active_checks
from hosttune.config.inventory import local_inventory
from hosttune.config.profile import load_profile
from hosttune.errors import HosttuneError
from hosttune.fleet import HostReport, check_host
from hosttune.status_file import StatusDoc, status_doc


class MonitorPassError(HosttuneError):
    """A pass that cannot run as asked."""


ACTIVE_IDS = frozenset(c.id for c in active_checks.CHECKS)  # what only the --active pass judges


@dataclass(frozen=True)
class PassResult:
    report: HostReport
    doc: StatusDoc


def run_pass(profile_path: str, active: bool = False) -> PassResult:
    """The regular pass checks everything; the active pass loads the GPUs and keeps only what that judges."""
    profile = load_profile(profile_path)
    if active and profile.monitor.active_interval_s is None:  # no timer would ever write it again: stale for good
        raise MonitorPassError(f"{profile_path}: monitor.active_interval_s is null, so this host has no active pass "
                               "and its status would go stale; hosttune check --active runs one without writing it")
    host = replace(local_inventory().hosts[0], profile=profile_path)
    start = time.monotonic()
    report = check_host(host, profile, active)
    if active:
        report = replace(report, findings=tuple(f for f in report.findings if f.check_id in ACTIVE_IDS))
    interval = profile.monitor.active_interval_s if active else profile.monitor.interval_s
    doc = status_doc(report, "active" if active else "regular", interval or 0, time.time(),
                     time.monotonic() - start, __version__)
    return PassResult(report, doc)
