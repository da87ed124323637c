"""Reboot a host and wait until it is back: a new boot, answering over its transport again."""

from __future__ import annotations

import time

from hosttune.errors import TransportError
from hosttune.config.inventory import Host
from hosttune.transport import open_transport

REBOOT = ("sh", "-c", "systemctl reboot 2>/dev/null || reboot")


def cannot_reboot(host: Host) -> str | None:
    """Why hosttune leaves this host's reboot to its operator, or None: it reboots the host and waits for it."""
    if host.connection.transport == "local":  # hosttune itself would go down with it, and wait for nothing
        return "this machine runs hosttune, which cannot wait for its own reboot: reboot it by hand"
    return None


def parse_boot_marker(text: str) -> str:
    """boot_id plus the start time of PID 1: a VM gets a new boot_id, a container a new PID 1."""
    boot_id, _, stat = text.partition("\n")
    fields = stat.rpartition(")")[2].split()  # after "(comm)", which may contain spaces
    start = fields[19] if len(fields) > 19 else ""
    return f"{boot_id.strip()}/{start}"


def boot_marker(host: Host) -> str:
    with open_transport(host.connection, read_only=True) as transport:
        result = transport.read(["cat", "/proc/sys/kernel/random/boot_id", "/proc/1/stat"], timeout=host.connection.timeout_s)
    if not result.ok:
        raise TransportError(f"{host.name}: cannot read the boot id: {result.stderr.strip()}")
    return parse_boot_marker(result.stdout)


def _same_boot(host: Host, before: str) -> bool:
    """The host still answers from the boot it was in: a reboot command that failed (sudo without a password, an
    inhibitor lock) started none. One going down already does not answer, or answers from a new boot."""
    try:
        return boot_marker(host) == before
    except TransportError:
        return False


def reboot_and_wait(host: Host, timeout_s: float = 600.0, poll_s: float = 1.0) -> str | None:
    """Reboot; None once the host answers from a new boot, else why not."""
    try:
        before = boot_marker(host)
    except TransportError as exc:
        return f"not rebooted: {exc}"
    try:
        with open_transport(host.connection) as transport:
            result = transport.change(REBOOT, timeout=30)
    except TransportError:
        result = None  # the connection often drops before the command returns
    if result is not None and result.rc > 0 and _same_boot(host, before):
        return f"not rebooted: {result.stderr.strip()[-300:] or f'the reboot command exited {result.rc}'}"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        time.sleep(poll_s)
        try:
            if boot_marker(host) != before:
                return None
        except TransportError:
            continue
    return f"did not come back within {timeout_s:.0f}s of the reboot"
