"""The check on hosttune's own monitor on the host: installed at this version, its timers running at their intervals."""

from __future__ import annotations

from hosttune import __version__
from hosttune.checks.base import Check, is_systemd, na, unmanaged
from hosttune.checks.findings import Severity, Status, Verdict
from hosttune.config.profile import Profile
from hosttune.probes.facts import Facts
from hosttune.probes.facts_serve import TimerState

TIMER, ACTIVE_TIMER = "hosttune-monitor.timer", "hosttune-monitor-active.timer"
STATUS_DIR = "/var/lib/hosttune/monitor"
STATUS_FILES = {TIMER: "status.json", ACTIVE_TIMER: "status-active.json"}  # what each timer's pass writes
METRICS_FILES = {TIMER: "hosttune.prom", ACTIVE_TIMER: "hosttune-active.prom"}  # in node_exporter's textfile folder
AHEAD_SLACK_S = 60  # a pass that ends just before NTP steps the clock back is not wrong
PASS_TIMEOUT_S = {TIMER: 300, ACTIVE_TIMER: 900}  # a pass may take this long (GPU load and dcgmi diag -r 1 in the active one)


def stale(timer: str, interval_s: int, age_s: float | None, installed_s: float | None) -> str | None:
    """Why a pass's status is stale, or None: it was written within two intervals and the pass's timeout.

    age_s: since the pass last wrote its status (None: never; below 0: dated ahead of the host's clock, which
    would read as fresh until the clock caught up); installed_s: since its timer was installed.
    """
    limit = 2 * interval_s + PASS_TIMEOUT_S[timer]
    what = "active pass" if timer == ACTIVE_TIMER else "regular pass"
    if age_s is not None and age_s < -AHEAD_SLACK_S:
        return (f"the {what}'s status is dated {-age_s:.0f}s ahead of the host's clock (the clock was set back?): "
                "it cannot say when the pass last ran")
    if age_s is None:
        if installed_s is not None and installed_s <= limit:
            return None  # its first run is due
        return f"the {what} never wrote its status"
    if age_s > limit:
        return f"the {what} last wrote its status {age_s:.0f}s ago (every {interval_s}s)"
    return None


def version_fault(installed: str | None) -> str | None:
    """Why the monitor's hosttune is not this controller's, or None: the one rule of `check` and `status`."""
    if installed == __version__:
        return None
    return f"hosttune {installed or 'not installed'} (this controller runs {__version__})"


def wanted_timers(profile: Profile) -> dict[str, str]:
    """Timer name → its OnUnitActiveSec= value; the active pass only where it has an interval."""
    spec = profile.monitor
    wanted = {TIMER: f"{spec.interval_s}s"}
    if spec.active_interval_s is not None:
        wanted[ACTIVE_TIMER] = f"{spec.active_interval_s}s"
    return wanted


def _timer_fault(timer: TimerState, interval: str) -> str | None:
    if timer.load != "loaded":
        return f"{timer.name} not installed"
    if timer.active != "active" or timer.enabled != "enabled":
        return f"{timer.name} {timer.active or '?'}, {timer.enabled or '?'}"
    if timer.interval != interval:
        return f"{timer.name} every {timer.interval or '?'} (wanted {interval})"
    return None


def _unwanted_active(timer: TimerState, wanted: dict[str, str]) -> str | None:
    """The active pass's timer left running where the profile now has none: each run refuses, its status goes stale."""
    if timer.name in wanted or timer.load != "loaded" or (timer.active != "active" and timer.enabled != "enabled"):
        return None
    return f"{timer.name} {timer.active or '?'}, {timer.enabled or '?'}, but monitor.active_interval_s is null"


def installed(facts: Facts, profile: Profile) -> Verdict:
    """hosttune of this version is in its virtualenv on the host and its timers run at the profile's intervals."""
    if not profile.monitor.enabled:
        return unmanaged("monitor.enabled is off in the profile")
    if facts.image or not is_systemd(facts):
        return na("the monitor runs on systemd timers: a running systemd host only")
    wanted = wanted_timers(profile)
    desired = f"hosttune {__version__}; " + ", ".join(f"{n} every {i}" for n, i in wanted.items())
    monitor = facts.monitor
    faults = [f for f in (version_fault(monitor.installed),) if f]
    faults += [f for name, interval in wanted.items() if (f := _timer_fault(monitor.timer(name), interval))]
    faults += [f for f in (_unwanted_active(monitor.timer(ACTIVE_TIMER), wanted),) if f]
    active = f"hosttune {monitor.installed or '-'}; " + (", ".join(
        f"{t.name} {t.active} every {t.interval or '?'}" for t in monitor.timers if t.load == "loaded") or "no timers")
    if faults:
        return Verdict(Status.DRIFT, desired, None, active, "; ".join(faults), subjects=tuple(wanted))
    return Verdict(Status.OK, desired, None, active)


def _age(monitor, name: str) -> float | None:
    when = monitor.written.get(name)
    return None if when is None or monitor.now is None else float(monitor.now - when)


def fresh(facts: Facts, profile: Profile) -> Verdict:
    """Each pass of the monitor wrote its status within two of its intervals (plus the time a pass may take)."""
    if not profile.monitor.enabled:
        return unmanaged("monitor.enabled is off in the profile")
    monitor = facts.monitor
    wanted = {n: int(i.removesuffix("s")) for n, i in wanted_timers(profile).items() if monitor.timer(n).load == "loaded"}
    if facts.image or not is_systemd(facts) or not wanted:
        return na("the monitor's timers are not installed (monitor.installed)")
    faults = {n: why for n, interval in wanted.items()
              if (why := stale(n, interval, _age(monitor, STATUS_FILES[n]), _age(monitor, n)))}
    active = ", ".join(f"{STATUS_FILES[n]} " + (f"{max(age, 0.0):.0f}s old" if (age := _age(monitor, STATUS_FILES[n])) is not None
                                                 else "not written") for n in wanted)
    desired = "written within 2 intervals"
    if faults:
        return Verdict(Status.DRIFT, desired, None, active, "; ".join(faults.values()), subjects=tuple(faults))
    return Verdict(Status.OK, desired, None, active)


CHECKS = (
    Check("monitor.installed", "hosttune checks itself on the host", Severity.WARNING,
          "Without checks running on the host between operator runs, a stopped engine or a failing GPU is found "
          "when users notice, not within an interval.",
          "installs hosttune in /opt/hosttune-monitor/venv (from monitor.wheels), the host's profile, the "
          "Prometheus alert rules and the hosttune-monitor timers (regular and --active passes)", False, installed),
    Check("monitor.stale", "hosttune's checks on the host are current", Severity.WARNING,
          "A status file that stopped changing means the checks stopped: the fleet table and the metrics show an old "
          "state as if it were now.",
          "none by apply: systemctl status hosttune-monitor.service (its journal says why the pass fails or hangs)",
          False, fresh),
)
