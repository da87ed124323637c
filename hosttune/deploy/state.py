"""What a host has now, for deploy: the live and previous release, installed wheels and units. Read-only."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from hosttune.actions.remediate import CORDON_FILE
from hosttune.transport.base import Transport, bundled_script


@dataclass(frozen=True)
class UnitFile:
    name: str
    sha256: str
    active: str  # systemctl is-active


@dataclass(frozen=True)
class HostState:
    current: str | None  # the release folder `current` points at
    previous: str | None
    is_complete: bool  # the release being deployed is installed already
    wheels: dict[str, str] = field(default_factory=dict, hash=False)  # path → sha256, of the wheels and files asked about
    units: dict[str, UnitFile] = field(default_factory=dict, hash=False)
    installed: dict[str, str] = field(default_factory=dict, hash=False)  # complete release folder → its wheel set
    instances: dict[str, str] = field(default_factory=dict, hash=False)  # hosttune-engine@N.service → is-active
    nginx: str | None = None  # the nginx binary, when the host has one
    cordon: str | None = None  # why the host is cordoned (hosttune remediate); None: it is not
    nginx_ports: frozenset[int] = frozenset()  # where this deployment's nginx (hosttune-local.conf) listens now
    releases: dict[str, int] = field(default_factory=dict, hash=False)  # every release folder → when it was written
    wheel_sets: tuple[str, ...] = ()  # every folder under /opt/hosttune/wheels
    uses: dict[str, tuple[str, ...]] = field(default_factory=dict, hash=False)  # complete release folder → its wheels' sha256

    @property
    def cordoned(self) -> str | None:
        """One line on the cordon, or None."""
        return cordon_line(self.cordon)


def cordon_line(cordon: str | None) -> str | None:
    """The cordon file's text as one line (why, and what takes it back); None: no cordon."""
    if cordon is None:
        return None
    try:
        reason = str(json.loads(cordon).get("reason", ""))
    except (ValueError, AttributeError):
        reason = "an unreadable cordon file"
    return f"cordoned ({reason or 'no reason given'}); hosttune uncordon takes it back"


def read_cordon(transport: Transport) -> str | None:
    """One line on the host's cordon (hosttune remediate), or None; read first, so that a cordoned host is
    refused before anything of its deploy is decided (its model, placement, wheels)."""
    result = transport.read(["cat", "--", CORDON_FILE], timeout=60)
    return cordon_line(result.stdout) if result.ok else None


def parse_state(text: str) -> HostState:
    values: dict[str, str] = {}
    wheels: dict[str, str] = {}
    units: dict[str, UnitFile] = {}
    installed: dict[str, str] = {}
    instances: dict[str, str] = {}
    nginx_ports: set[int] = set()
    releases: dict[str, int] = {}
    wheel_sets: set[str] = set()
    uses: dict[str, tuple[str, ...]] = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key in ("wheel", "installed"):
            digest, _, path = value.partition(" ")
            (wheels if key == "wheel" else installed)[path] = digest
        elif key == "unit":
            name, sha, active = (value.split(" ") + ["", ""])[:3]
            units[name] = UnitFile(name, sha, active)
        elif key == "instance":
            name, _, active = value.partition(" ")
            instances[name] = active
        elif key == "nginx-listen" and value.isdigit():
            nginx_ports.add(int(value))
        elif key == "release":
            written, _, path = value.partition(" ")
            releases[path] = int(written) if written.isdigit() else 0
        elif key == "wheelset":
            wheel_sets.add(value)
        elif key == "uses":
            path, _, digests = value.partition(" ")
            uses[path] = tuple(sorted(digests.split()))
        else:
            values[key] = value
    return HostState(values.get("current") or None, values.get("previous") or None, bool(values.get("complete")),
                     wheels, units, installed, instances, values.get("nginx") or None, values.get("cordon"),
                     frozenset(nginx_ports), releases, tuple(sorted(wheel_sets)), uses)


def read_state(transport: Transport, release_id: str, wheel_paths: list[str]) -> HostState:
    script = bundled_script("hosttune.deploy", "state.sh")
    return parse_state(transport.read_script(script, release_id, *wheel_paths, what="reading the deploy state"))
