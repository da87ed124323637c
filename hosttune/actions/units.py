"""Boot-time oneshot units: a script in /usr/local/sbin run by a unit rendered from templates/."""

from __future__ import annotations

from hosttune.actions.base import Command, FileWrite, Op, Service
from hosttune.rendering import render
from hosttune.checks.base import is_systemd
from hosttune.checks.boot_scripts import script_path
from hosttune.probes.facts import Facts

DAEMON_RELOAD = Command(("systemctl", "daemon-reload"), regenerate=True, offline=False)


def unit_path(name: str) -> str:
    return f"/etc/systemd/system/{name}.service"


def boot_unit(name: str, description: str, script: bytes, *, environment_file: str = "",
              after: tuple[str, ...] = ()) -> tuple[Op, ...]:
    """The script, its unit, a daemon-reload, and the unit enabled (not started: the caller writes the live value)."""
    unit = render("hosttune-boot.service.j2", description=description, script=script_path(name),
                  environment_file=environment_file, after=after)
    return (
        FileWrite(script_path(name), script, 0o755),
        FileWrite(unit_path(name), unit, 0o644),
        DAEMON_RELOAD,
        Service(f"{name}.service", enabled=True),
    )


def lasting(facts: Facts, *, is_by_unit: bool = True) -> str:
    """How long a setting holds: from every boot on, or, when a boot unit writes it again and there is no systemd
    for one, until the next. An image (--root) has no running kernel to write now: it holds from its first boot."""
    is_at_boot = is_systemd(facts) or not is_by_unit
    if facts.image:
        return "at the image's first boot" if is_at_boot else "not at boot: the image has no systemd for its boot unit"
    return "now and at boot" if is_at_boot else "now, until the next boot"


