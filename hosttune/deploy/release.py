"""Releases on a host: a versioned virtualenv with the units it runs, and the links that say which is live.

    /opt/hosttune/wheels/<sha256[:16]>/<name>.whl   uploaded once, shared by releases
    /opt/hosttune/releases/<id>/                     the virtualenv (bin/, lib/)
    /opt/hosttune/releases/<id>/.hosttune/           release.json and the release's unit files
    /opt/hosttune/current  -> releases/<id>          what the units run now
    /opt/hosttune/previous -> releases/<id>          what --rollback and a failed gate go back to

A release id is a hash of everything that makes it (wheels, units, settings), so the same
deploy twice is the same release. release.json is written last: a folder without it is an
install that did not finish, and is made again. Once a new release serves, the folders past
the newest few go (prune.py), never the live one nor the one --rollback goes back to, and with them
the wheel sets no release kept names in its release.json.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field

from hosttune.build.wheelhouse import WheelFile

ROOT = "/opt/hosttune"
WHEELS = f"{ROOT}/wheels"
RELEASES = f"{ROOT}/releases"
CURRENT = f"{ROOT}/current"
PREVIOUS = f"{ROOT}/previous"
UNIT_DIR = "/etc/systemd/system"
VENV_PLACEHOLDER = "@RELEASE@"


def release_dir(release_id: str) -> str:
    return f"{RELEASES}/{release_id}"


def release_name(folder: str | None) -> str | None:
    """The id of the release in a release folder (what `current` and `previous` point at)."""
    return folder.rstrip("/").rsplit("/", 1)[-1] if folder else None


def meta_dir(release_id: str) -> str:
    return f"{release_dir(release_id)}/.hosttune"


def manifest_path(release_id: str) -> str:
    return f"{meta_dir(release_id)}/release.json"


def copy_name(path: str) -> str:
    """Where a release keeps its copy of a host file (for rollback): .hosttune/host-<name>."""
    return "host-" + path.rstrip("/").rsplit("/", 1)[-1]


def wheel_path(wheel: WheelFile) -> str:
    """Content-addressed: two builds of hosttune_engine-0.1.0 with different code never collide."""
    return f"{WHEELS}/{wheel.sha256[:16]}/{wheel.name}"


def release_id(engine: str, wheels: tuple[WheelFile, ...], units: dict[str, bytes], settings: dict) -> str:
    """engine-<hash>: the same wheels, units and settings give the same id on every host and run."""
    digest = hashlib.sha256()
    digest.update(json.dumps([engine, sorted(w.sha256 for w in wheels), settings], sort_keys=True, default=str).encode())
    for name in sorted(units):
        digest.update(name.encode() + b"\0" + units[name] + b"\0")
    return f"{engine}-{digest.hexdigest()[:12]}"


@dataclass(frozen=True)
class Release:
    """One host's release: what gets installed, and the units that run it."""

    id: str
    engine: str
    entry: str  # the wheelhouse key the wheels came from
    wheels: tuple[WheelFile, ...]
    offline: bool  # every dependency is among the wheels: pip installs with --no-index
    units: dict[str, bytes] = field(hash=False)  # unit name → content, in start order
    settings: dict = field(hash=False)  # model, port, gpus, numa, flags, env: for people reading release.json
    programs: tuple[str, ...] = ()  # what the units execute (behind numactl, which verify alone would check)
    meta: dict[str, bytes] = field(default_factory=dict, hash=False)  # more files of .hosttune/ (replica env files, ...)
    files: dict[str, bytes] = field(default_factory=dict, hash=False)  # host files outside the release (nginx), by path
    index_deps: int = 0  # bytes pip takes for the dependencies it fetches from the index (an estimate; 0: offline)

    @property
    def replicas(self) -> list[dict]:
        """The replicas of a host that runs several ({index, port, gpus, numa_nodes}); [] when it runs one service."""
        return list(self.settings.get("replicas", []))

    @property
    def key_file(self) -> str | None:
        """The key file on the host that the release's units read their API key from (its gates read it too)."""
        return (self.settings.get("api_key") or {}).get("file")

    @property
    def dir(self) -> str:
        return release_dir(self.id)

    def manifest(self) -> bytes:
        doc = {"id": self.id, "engine": self.engine, "entry": self.entry, "offline": self.offline,
               "wheels": [{"name": w.name, "sha256": w.sha256} for w in self.wheels],
               "units": sorted(self.units), "settings": self.settings, "programs": list(self.programs),
               "meta": sorted(self.meta), "files": {path: copy_name(path) for path in sorted(self.files)}}
        return (json.dumps(doc, indent=1, sort_keys=True, default=str) + "\n").encode()
