"""apply's monitor: hosttune itself in a virtualenv on the host, the host's profile, systemd timers that run
its checks there (a regular pass and a bounded --active one) and the Prometheus alert rules over what they write.

Pure: the wheels are uploaded from monitor.wheels on the controller; nothing here runs.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import yaml

from hosttune import __version__
from hosttune.actions.base import Command, Directory, FileWrite, Op, Remove, Service, Step, blocked
from hosttune.actions.needs import VENV_BYTES_PER_WHEEL_BYTE, NeedSpace, NeedVenv
from hosttune.rendering import render
from hosttune.actions.units import DAEMON_RELOAD
from hosttune.checks.service_monitor import ACTIVE_TIMER, METRICS_FILES, PASS_TIMEOUT_S, STATUS_DIR, STATUS_FILES, TIMER, wanted_timers
from hosttune.config.inventory import Host
from hosttune.config.profile import Profile
from hosttune.probes.facts import Facts
from hosttune.quoting import systemd_exec

HOME = "/opt/hosttune-monitor"
VENV, WHEELS = f"{HOME}/venv", f"{HOME}/wheels"
CONF = "/etc/hosttune/monitor"
PROFILE_FILE, RULES_FILE = f"{CONF}/profile.yaml", f"{CONF}/hosttune-alerts.yml"
UNIT_DIR = "/etc/systemd/system"


def host_profile(profile: Profile) -> bytes:
    """The host's desired state as a playbook the monitor on the host reads (its wheels stay on the controller)."""
    sections = {f.name: dataclasses.asdict(getattr(profile, f.name)) for f in dataclasses.fields(profile)
                if f.name not in ("name", "description")}
    sections["monitor"]["wheels"] = None
    doc = {"name": profile.name, "description": f"{profile.description} (written by hosttune apply for the monitor)",
           "settings": _plain(sections)}
    return yaml.safe_dump(doc, sort_keys=False).encode()


def _plain(value):
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def alert_rules(profile: Profile) -> bytes:
    spec = profile.monitor
    return render("hosttune-alerts.yml.j2", interval_s=spec.interval_s, active_interval_s=spec.active_interval_s)


def pass_argv(profile: Profile, active: bool) -> tuple[str, ...]:
    argv = (f"{VENV}/bin/hosttune", "monitor", "--profile", PROFILE_FILE, "--textfile-dir", profile.monitor.textfile_dir)
    return (*argv, "--active") if active else argv


def timer_units(profile: Profile) -> dict[str, bytes]:
    """Unit name → content: each pass's oneshot service and its timer."""
    units = {}
    for timer, interval in wanted_timers(profile).items():
        active = timer == ACTIVE_TIMER
        service, what = timer.replace(".timer", ".service"), "checks under GPU load" if active else "checks"
        units[service] = render("hosttune-monitor.service.j2", what=what, textfile_dir=profile.monitor.textfile_dir,
                                exec_start=systemd_exec(pass_argv(profile, active)),
                                timeout_s=PASS_TIMEOUT_S[timer])
        units[timer] = render("hosttune-monitor.timer.j2", what=what, service=service,
                              interval_s=int(interval.removesuffix("s")),
                              first_s=min(300 if active else 15, int(interval.removesuffix("s"))))
    return units


def install_ops(facts: Facts, profile: Profile) -> tuple[Op, ...]:
    """The wheels uploaded, the virtualenv made (rollback removes it only where this run made it), hosttune installed.
    pip keeps no cache and its temporary files in the virtualenv, as deploy's does: all it writes is where `room` is
    checked."""
    wheels = sorted(Path(profile.monitor.wheels).glob("*.whl"))
    undo = ("rm", "-rf", "--", VENV) if facts.monitor.installed is None else None
    pip = ("env", f"TMPDIR={VENV}", f"{VENV}/bin/pip", "install", "--disable-pip-version-check", "--no-cache-dir",
           "--no-index", "--find-links", WHEELS, "--upgrade", f"hosttune=={__version__}")
    room = NeedSpace(VENV, VENV_BYTES_PER_WHEEL_BYTE * sum(w.stat().st_size for w in wheels))
    return (
        Directory(WHEELS),
        *(FileWrite(f"{WHEELS}/{w.name}", source=w) for w in wheels),
        Command(("python3", "-m", "venv", VENV), undo=undo, offline=False,
                requires=(NeedVenv("python3"),)),
        Command(pip, offline=False, timeout=900, requires=(room,)),
    )


def retire_active_ops(profile: Profile) -> tuple[Op, ...]:
    """With monitor.active_interval_s null, the active pass an earlier apply installed: its timer stopped, its units
    and its last status and metrics removed (they would read as a pass gone stale)."""
    if ACTIVE_TIMER in wanted_timers(profile):
        return ()
    service = ACTIVE_TIMER.replace(".timer", ".service")
    return (Service(ACTIVE_TIMER, enabled=False, running=False),
            *(Remove(f"{UNIT_DIR}/{unit}") for unit in (ACTIVE_TIMER, service)),
            Remove(f"{STATUS_DIR}/{STATUS_FILES[ACTIVE_TIMER]}"),
            Remove(f"{profile.monitor.textfile_dir}/{METRICS_FILES[ACTIVE_TIMER]}"))


def unit_ops(profile: Profile) -> tuple[Op, ...]:
    units = timer_units(profile)
    timers = [name for name in units if name.endswith(".timer")]
    return (
        Directory(profile.monitor.textfile_dir),
        FileWrite(PROFILE_FILE, host_profile(profile)),
        FileWrite(RULES_FILE, alert_rules(profile)),
        *(FileWrite(f"{UNIT_DIR}/{name}", body) for name, body in units.items()),
        *retire_active_ops(profile),
        DAEMON_RELOAD,
        *(Service(name, enabled=True, running=True) for name in timers),
    )


def not_in_image(facts: Facts, profile: Profile) -> str | None:
    """With the monitor on, what an image's plan says it leaves out: the monitor runs on the host booted from it."""
    if not (facts.image and profile.monitor.enabled):
        return None
    return ("monitor.installed: not baked into the image: `hosttune apply` installs the monitor (its virtualenv, "
            "profile and timers) on each host once it runs from the image")


def monitor(facts: Facts, profile: Profile, host: Host) -> list[Step]:
    if profile.monitor.wheels is None:
        return [blocked("monitor.installed", "monitor.wheels is not set: a folder of the hosttune wheel and its "
                                             "dependencies (`pip wheel PATH-TO-HOSTTUNE -w DIR`) to install from")]
    summary = f"hosttune {__version__} checks on the host: {', '.join(wanted_timers(profile))}"
    return [Step(("monitor.installed",), summary, install_ops(facts, profile) + unit_ops(profile),
                 notes=(f"metrics: {profile.monitor.textfile_dir}/hosttune*.prom; alert rules: {RULES_FILE}",
                        f"stop it: systemctl disable --now {TIMER}" + (f" {ACTIVE_TIMER}" if ACTIVE_TIMER in
                                                                        wanted_timers(profile) else "")))]
