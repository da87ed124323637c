"""A host's deploy as data: the release it gets, and the operations that install and activate it.

Nothing here talks to a host; host.py reads the state, asks for these operations and hands
them to the executor, so `--dry-run` prints what a real deploy does.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Union

from hosttune.build.wheelhouse import Entry
from hosttune.deploy.access import Access, launched_with_key
from hosttune.deploy.placement import Placement
from hosttune.deploy.release import (CURRENT, PREVIOUS, UNIT_DIR, VENV_PLACEHOLDER, Release, manifest_path, meta_dir,
                                     release_dir, release_id, wheel_path)
from hosttune.deploy.settings import ServeSettings, drain_seconds, flag_argv
from hosttune.deploy.state import HostState
from hosttune.deploy.units import RAY_UNIT, SERVE_UNIT, UNIT_NAMES, UnitSpec, render_unit
from hosttune.presets import EnginePreset, substitute
from hosttune.quoting import join

INSTALL_TIMEOUT_S = 1800.0


@dataclass(frozen=True)
class Upload:
    """A wheel from the wheelhouse, written to `path` (atomically, its hash checked on arrival)."""

    local: Path
    path: str
    sha256: str


@dataclass(frozen=True)
class WriteFile:
    path: str
    content: bytes
    mode: int = 0o644


@dataclass(frozen=True)
class Link:
    path: str
    target: str


@dataclass(frozen=True)
class Remove:
    path: str


@dataclass(frozen=True)
class Run:
    argv: tuple[str, ...]
    timeout: float = 300.0
    fail_on_stderr: tuple[str, ...] = ()  # an exit 0 still fails when stderr mentions any of these


Op = Union[Upload, WriteFile, Link, Remove, Run]


def describe(op: Op) -> str:
    if isinstance(op, Upload):
        return f"upload {op.local.name} to {op.path}"
    if isinstance(op, WriteFile):
        return f"write {op.path} ({len(op.content)} bytes)"
    if isinstance(op, Link):
        return f"link {op.path} -> {op.target}"
    if isinstance(op, Remove):
        return f"remove {op.path}"
    return join(op.argv)


@dataclass(frozen=True)
class Role:
    """A host's part: serving alone, or the Ray head / a Ray worker of a multi-node vLLM group."""

    kind: str = "single"  # single | head | worker
    num_nodes: int = 1
    address: str = "127.0.0.1"
    head_address: str = ""


def unit_specs(preset: EnginePreset, settings: ServeSettings, placement: Placement, venv: str, role: Role,
               access: Access = Access()) -> list[UnitSpec]:
    multi = preset.multinode
    values = dict(venv=venv, model=settings.model, port=settings.port, num_gpus=placement.num_gpus,
                  num_nodes=role.num_nodes, address=role.address, head_address=role.head_address,
                  ray_port=multi.ray_port if multi else "")
    env = {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}  # indices as nvidia-smi prints them
    if placement.gpus:
        env["CUDA_VISIBLE_DEVICES"] = placement.cuda_visible_devices
    env.update(settings.env)
    prefix = placement.numactl_prefix()
    specs = []
    if role.kind in ("head", "worker"):
        command = multi.head_command if role.kind == "head" else multi.worker_command
        specs.append(UnitSpec(RAY_UNIT, f"hosttune Ray {role.kind} for {preset.name}",
                              (*prefix, *(substitute(a, values) for a in command)), env, venv, 10.0))
    if role.kind != "worker":
        flags = {**settings.flags, **(multi.flags if role.kind == "head" else {})}
        command = tuple(substitute(a, values) for a in preset.serve.command)
        if access.key and preset.serve.api_key_flag:
            command = launched_with_key(command, preset.serve.api_key_env, preset.serve.api_key_flag)
        argv = (*prefix, *command, *flag_argv(flags, values, preset.serve.false_flag))
        ray = (RAY_UNIT,) if role.kind == "head" else ()
        env_files = (access.env_file,) if access.key else ()
        specs.append(UnitSpec(SERVE_UNIT, f"hosttune {preset.name} engine serving {settings.model}", argv, env, venv,
                              drain_seconds(preset, flags), after=ray, requires=ray, env_files=env_files))
    return specs


def make_release(preset: EnginePreset, settings: ServeSettings, placement: Placement, entry: Entry,
                 role: Role = Role(), access: Access = Access()) -> Release:
    """The release for these settings: units rendered once with a placeholder id, hashed, then named."""
    specs = unit_specs(preset, settings, placement, release_dir(VENV_PLACEHOLDER), role, access)
    drafts = {s.name: render_unit(s, VENV_PLACEHOLDER) for s in specs}
    summary = {"model": settings.model, "port": settings.port, "gpus": list(placement.gpus),
               "numa_nodes": list(placement.numa_nodes), "role": role.kind, "flags": settings.flags, "env": settings.env}
    if access.key:  # the key file and which key it holds (a new key is a new release), never the key
        summary["api_key"] = {"file": access.env_file, "fingerprint": access.fingerprint}
    rid = release_id(preset.name, entry.wheels, drafts, summary)
    units = {name: body.replace(VENV_PLACEHOLDER.encode(), rid.encode()) for name, body in drafts.items()}
    skip = len(placement.numactl_prefix())
    programs = tuple(dict.fromkeys(s.argv[skip].replace(VENV_PLACEHOLDER, rid) for s in specs))
    return Release(rid, preset.name, entry.key.name, entry.wheels, entry.has_deps, units, summary, programs)


# Clone an installed virtualenv as hard links (seconds, no copy of torch), then point its scripts at
# the new folder. sed -i writes a new file, so the old release's scripts stay as they were; bytecode
# caches are left out (they name the old paths). Releases are never changed in place after this.
_CLONE = r"""set -eu
new=$1 old=$2
rm -rf -- "$new"; mkdir -p -- "$new"
cd -- "$old"
find . -mindepth 1 -maxdepth 1 ! -name .hosttune -exec cp -al -- {} "$new"/ \;
find "$new" -name __pycache__ -type d -prune -exec rm -rf -- {} +
grep -rlIF -- "$old" "$new/bin" "$new/pyvenv.cfg" | while IFS= read -r f; do
    [ -L "$f" ] || sed -i "s|$old|$new|g" -- "$f"
done
"""


def wheel_set(release: Release, python: str) -> str:
    """What a virtualenv was installed from: the interpreter and the exact wheels."""
    text = "\n".join([python, str(release.offline), *sorted(w.sha256 for w in release.wheels)])
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def install_ops(release: Release, entry: Entry, state: HostState, python: str = "python3") -> list[Op]:
    """Upload the wheels the host lacks; make the virtualenv unless this release is installed already.

    A release with the same wheel set as an installed one (a change of flags or model) is
    cloned from it; otherwise pip installs the wheels into a fresh virtualenv.
    """
    ops: list[Op] = [Upload(entry.file(w), wheel_path(w), w.sha256) for w in release.wheels
                     if state.wheels.get(wheel_path(w)) != w.sha256]
    if state.is_complete:
        return ops
    venv, wheels = release.dir, wheel_set(release, python)
    donor = next((d for d, ws in sorted(state.installed.items()) if ws == wheels and d.rstrip("/") != venv), None)
    if donor:
        ops.append(Run(("sh", "-c", _CLONE, "sh", venv, donor.rstrip("/")), INSTALL_TIMEOUT_S))
    else:
        ops += _pip_ops(release, python)
    ops += [WriteFile(f"{meta_dir(release.id)}/{name}", body) for name, body in release.units.items()]
    ops.append(WriteFile(f"{meta_dir(release.id)}/wheelset", wheels.encode()))
    ops.append(WriteFile(manifest_path(release.id), release.manifest()))  # last: the release is complete
    return ops


def _pip_ops(release: Release, python: str) -> list[Op]:
    venv = release.dir
    pip = (f"{venv}/bin/pip", "install", "--no-compile", "--disable-pip-version-check", "--quiet")
    if release.offline:  # exactly the wheels resolved at build time, nothing from an index
        install = (*pip, "--no-index", "--no-deps", *(wheel_path(w) for w in release.wheels))
    else:
        install = (*pip, *(wheel_path(w) for w in release.wheels if w.kind == "engine"))
    ops: list[Op] = [Run(("rm", "-rf", "--", venv)), Run((python, "-m", "venv", venv)), Run(install, INSTALL_TIMEOUT_S)]
    if release.offline:
        ops.append(Run((f"{venv}/bin/pip", "check", "--disable-pip-version-check")))
    return ops


_EXECUTABLE = 'for p do [ -x "$p" ] || { echo "$p is not executable" >&2; exit 1; }; done'


def verify_ops(release: Release) -> list[Op]:
    """Before the release's units replace the live ones: the programs they run exist (behind numactl,
    systemd-analyze only looks at numactl), and systemd-analyze verify accepts the units."""
    ops: list[Op] = [Run(("sh", "-c", _EXECUTABLE, "sh", *release.programs))] if release.programs else []
    # systemd ignores a setting it cannot parse (a warning, exit 0); in a unit hosttune rendered that is a bug.
    verify = ("systemd-analyze", "verify", *(f"{meta_dir(release.id)}/{name}" for name in release.units))
    return ops + [Run(verify, fail_on_stderr=tuple(f"{name}:" for name in release.units))]


def activate_ops(release: Release, state: HostState, *, keep_previous: bool = False,
                 start: tuple[str, ...] | None = None) -> list[Op]:
    """Make the release live: its units in place, `current` (and `previous`) linked, restarted in order.

    start: the units to (re)start now (default: all of them); a multi-node head starts Ray
    first and its server only once the workers have joined (start_ops).
    """
    ops: list[Op] = []
    for name in state.units:
        if name not in release.units:  # a role this host no longer has (e.g. multi-node → single)
            ops += [Run(("systemctl", "disable", "--now", name)), Remove(f"{UNIT_DIR}/{name}")]
    ops += [WriteFile(f"{UNIT_DIR}/{name}", body) for name, body in release.units.items()]
    if not keep_previous and state.current and state.current != release.dir:
        ops.append(Link(PREVIOUS, state.current))
    ops.append(Link(CURRENT, release.dir))
    names = [n for n in UNIT_NAMES if n in release.units]
    ops += [Run(("systemctl", "daemon-reload")), Run(("systemctl", "enable", "--quiet", *names))]
    return ops + start_ops([n for n in names if start is None or n in start])


def start_ops(names: list[str]) -> list[Op]:
    return [Run(("systemctl", "restart", name), 900.0) for name in names]  # a restart waits for the old one to drain


def is_unchanged(release: Release, state: HostState) -> bool:
    """The same release is live: same folder, same unit files, every unit active."""
    if state.current != release.dir or not state.is_complete or set(state.units) != set(release.units):
        return False
    return all(state.units[n].sha256 == hashlib.sha256(body).hexdigest() and state.units[n].active == "active"
               for n, body in release.units.items())
