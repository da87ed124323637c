"""A host's deploy as data: the release it gets, and the operations that install and activate it.

Nothing here talks to a host; host.py reads the state, asks for these operations and hands
them to hosttune.execute, so `--dry-run` prints what a real deploy does.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass

from hosttune.actions.base import Command, FileWrite, Op, Remove, Symlink
from hosttune.actions.needs import VENV_BYTES_PER_WHEEL_BYTE, Need, NeedSpace, NeedVenv, size_text
from hosttune.build.wheelhouse import Entry
from hosttune.deploy.access import Access, launched_with_key
from hosttune.deploy.errors import DeployError
from hosttune.deploy.placement import Layout, Placement
from hosttune.deploy.release import (CURRENT, PREVIOUS, UNIT_DIR, VENV_PLACEHOLDER, Release, copy_name, manifest_path,
                                     meta_dir, release_dir, release_id, wheel_path)
from hosttune.deploy.settings import ServeSettings, drain_seconds, flag_argv
from hosttune.deploy.state import HostState
from hosttune.deploy.units import RAY_UNIT, REPLICA_UNITS, SERVE_UNIT, UNIT_NAMES, UnitSpec, render_unit
from hosttune.presets import EnginePreset, substitute

INSTALL_TIMEOUT_S = 1800.0
GB = 10**9


@dataclass(frozen=True)
class Role:
    """A host's part: serving alone, or the Ray head / a Ray worker of a multi-node vLLM group."""

    kind: str = "single"  # single | head | worker
    num_nodes: int = 1
    address: str = "127.0.0.1"
    head_address: str = ""


def placeholder_values(preset: EnginePreset, settings: ServeSettings, placement: Placement, venv: str,
                       role: Role = Role(), port: object = None) -> dict:
    multi = preset.multinode
    return dict(venv=venv, model=settings.model, port=settings.port if port is None else port,
                num_gpus=placement.tp, num_nodes=role.num_nodes, address=role.address,
                head_address=role.head_address, ray_port=multi.ray_port if multi else "")


def serve_flags(preset: EnginePreset, settings: ServeSettings, placement: Placement, role: Role = Role()) -> dict:
    """The engine's flags: settings, the multi-node head's, the replica's TP when above one, and its part of
    the memory flag when replicas share its GPUs."""
    flags = {**settings.flags, **(preset.multinode.flags if role.kind == "head" else {})}
    if placement.tp > 1 and preset.serve.tp_flag:
        flags[preset.serve.tp_flag] = placement.tp
    if placement.share > 1 and preset.serve.memory_flag:
        whole = float(flags.get(preset.serve.memory_flag, preset.serve.memory_share))
        flags[preset.serve.memory_flag] = math.floor(round(whole / placement.share * 1000, 6)) / 1000
    return flags


def check_sharing(preset: EnginePreset, layout: Layout, host: str) -> None:
    """Replicas share a GPU only on an engine whose memory flag gives each its part."""
    if layout.replicas_per_gpu > 1 and not preset.serve.memory_flag:
        raise DeployError(f"{host}: {preset.name} has no memory flag in its preset (serve.memory_flag) to give "
                          f"{layout.replicas_per_gpu} replicas a GPU each their part; deploy one replica a GPU")


def serve_argv(preset: EnginePreset, flags: dict, values: dict, access: Access = Access()) -> tuple[str, ...]:
    """The engine's command line; an engine that takes its key only as a flag runs behind the key launcher."""
    command = tuple(substitute(a, values) for a in preset.serve.command)
    if access.key and preset.serve.api_key_flag:
        command = launched_with_key(command, preset.serve.api_key_env, preset.serve.api_key_flag)
    return (*command, *flag_argv(flags, values, preset.serve.false_flag))


def key_env_files(access: Access) -> tuple[str, ...]:
    """The EnvironmentFile= that gives a unit its key (never its text or argv)."""
    return (access.env_file,) if access.key else ()


def key_summary(summary: dict, access: Access) -> dict:
    """The key file and which key it holds (a new key is a new release), never the key."""
    if access.key:
        summary["api_key"] = {"file": access.env_file, "fingerprint": access.fingerprint}
    return summary


def unit_specs(preset: EnginePreset, settings: ServeSettings, placement: Placement, venv: str, role: Role,
               access: Access = Access()) -> list[UnitSpec]:
    multi = preset.multinode
    values = placeholder_values(preset, settings, placement, venv, role)
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
        flags = serve_flags(preset, settings, placement, role)
        ray = (RAY_UNIT,) if role.kind == "head" else ()
        specs.append(UnitSpec(SERVE_UNIT, f"hosttune {preset.name} engine serving {settings.model}",
                              (*prefix, *serve_argv(preset, flags, values, access)), env, venv,
                              drain_seconds(preset, flags), after=ray, requires=ray,
                              environment_files=key_env_files(access)))
    return specs


def make_release(preset: EnginePreset, settings: ServeSettings, placement: Placement, entry: Entry,
                 role: Role = Role(), access: Access = Access(), shape: dict | None = None) -> Release:
    """The release for these settings: units rendered once with a placeholder id, hashed, then named.

    shape: what the release records as its shape (hosttune.deploy.shape.record), for the next deploy."""
    specs = unit_specs(preset, settings, placement, release_dir(VENV_PLACEHOLDER), role, access)
    drafts = {s.name: render_unit(s, VENV_PLACEHOLDER) for s in specs}
    summary = {"model": settings.model, "port": settings.port, "gpus": list(placement.gpus),
               "numa_nodes": list(placement.numa_nodes), "role": role.kind, "flags": settings.flags, "env": settings.env}
    key_summary(summary, access)
    if shape:
        summary["shape"] = shape
    skip = len(placement.numactl_prefix())
    programs = tuple(dict.fromkeys(s.argv[skip] for s in specs))
    return named_release(preset, entry, drafts, summary, programs)


def named_release(preset: EnginePreset, entry: Entry, units: dict[str, bytes], summary: dict, programs: tuple[str, ...],
                  meta: dict[str, bytes] | None = None, files: dict[str, bytes] | None = None) -> Release:
    """Everything drafted with the placeholder id is hashed into the id, then given it."""
    meta, files = meta or {}, files or {}
    rid = release_id(preset.name, entry.wheels, {**units, **{f"meta/{k}": v for k, v in meta.items()},
                                                 **{f"file{k}": v for k, v in files.items()}}, summary)

    def named(body: bytes) -> bytes:
        return body.replace(VENV_PLACEHOLDER.encode(), rid.encode())

    return Release(rid, preset.name, entry.key.name, entry.wheels, entry.has_deps,
                   {n: named(b) for n, b in units.items()}, summary,
                   tuple(p.replace(VENV_PLACEHOLDER, rid) for p in programs),
                   {n: named(b) for n, b in meta.items()}, {p: named(b) for p, b in files.items()},
                   0 if entry.has_deps else round(preset.build.index_deps_gb * GB))


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
    ops: list[Op] = [FileWrite(wheel_path(w), source=entry.file(w)) for w in release.wheels
                     if state.wheels.get(wheel_path(w)) != w.sha256]
    if state.is_complete:
        return ops
    venv, wheels = release.dir, wheel_set(release, python)
    donor = next((d for d, ws in sorted(state.installed.items()) if ws == wheels and d.rstrip("/") != venv), None)
    if donor:
        ops.append(Command(("sh", "-c", _CLONE, "sh", venv, donor.rstrip("/")), timeout=INSTALL_TIMEOUT_S))
    else:
        ops += _pip_ops(release, python)
    ops += [FileWrite(f"{meta_dir(release.id)}/{name}", body) for name, body in release.units.items()]
    ops += [FileWrite(f"{meta_dir(release.id)}/{name}", body) for name, body in release.meta.items()]
    ops += [FileWrite(f"{meta_dir(release.id)}/{copy_name(path)}", body) for path, body in release.files.items()]
    ops.append(FileWrite(f"{meta_dir(release.id)}/wheelset", wheels.encode()))
    ops.append(FileWrite(manifest_path(release.id), release.manifest()))  # last: the release is complete
    return ops


def pip_tmp(release: Release) -> str:
    """Where pip's temporary files (its downloads from an index) go: in the virtualenv, on the filesystem whose
    space is checked, not /tmp or TMPDIR, which may be another."""
    return f"{release.dir}/.pip-tmp"


def _pip_ops(release: Release, python: str) -> list[Op]:
    """A fresh virtualenv and pip's install into it. pip keeps no cache (~/.cache/pip) and its temporary files in
    the virtualenv, so that all it writes is on the filesystem `room` is checked on."""
    venv, tmp = release.dir, pip_tmp(release)
    pip = ("env", f"TMPDIR={tmp}", f"{venv}/bin/pip", "install", "--no-compile", "--disable-pip-version-check",
           "--quiet", "--no-cache-dir")
    room = NeedSpace(venv, VENV_BYTES_PER_WHEEL_BYTE * sum(w.size for w in release.wheels) + release.index_deps,
                     _space_note(release))
    if release.offline:  # exactly the wheels resolved at build time, nothing from an index
        install = (*pip, "--no-index", "--no-deps", *(wheel_path(w) for w in release.wheels))
        check = [Command((f"{venv}/bin/pip", "check", "--disable-pip-version-check"))]
    else:
        install, check = (*pip, *(wheel_path(w) for w in release.wheels if w.kind == "engine")), []
    return [Command(("rm", "-rf", "--", venv)), Command((python, "-m", "venv", venv), requires=(NeedVenv(python),)),
            Command(("mkdir", "-p", "--", tmp)), Command(install, timeout=INSTALL_TIMEOUT_S, requires=(room,)),
            Command(("rm", "-rf", "--", tmp)), *check]


_WHERE_PIP_WRITES = ("pip keeps no cache and its temporary files in the virtualenv (--no-cache-dir, TMPDIR), not in "
                     "~/.cache/pip or /tmp, which may be other filesystems")


def _space_note(release: Release) -> str:
    """Where pip writes; from an index, also what of the space is an estimate, and why."""
    if not release.index_deps:
        return _WHERE_PIP_WRITES
    return (f"{size_text(release.index_deps)} of it an estimate of {release.engine}'s dependencies (torch and its CUDA "
            f"libraries), which pip fetches from the package index into the virtualenv: the wheelhouse has no deps/ "
            f"(hosttune build --deps puts them there, counted exactly); {_WHERE_PIP_WRITES}")


_EXECUTABLE = 'for p do [ -x "$p" ] || { echo "$p is not executable" >&2; exit 1; }; done'


def verify_ops(release: Release) -> list[Op]:
    """Before the release's units replace the live ones: the programs they run exist (behind numactl,
    systemd-analyze only looks at numactl), and systemd-analyze verify accepts the units."""
    ops: list[Op] = [Command(("sh", "-c", _EXECUTABLE, "sh", *release.programs))] if release.programs else []
    # systemd ignores a setting it cannot parse (a warning, exit 0); in a unit hosttune rendered that is a bug.
    verify = ("systemd-analyze", "verify", *(f"{meta_dir(release.id)}/{name}" for name in release.units))
    return ops + [Command(verify, fail_on_stderr=tuple(f"{name}:" for name in release.units))]


def activate_ops(release: Release, state: HostState, *, keep_previous: bool = False,
                 start: tuple[str, ...] | None = None, requires: tuple[Need, ...] = ()) -> list[Op]:
    """Make the release live: its units in place, `current` (and `previous`) linked, restarted in order.

    start: the units to (re)start now (default: all of them); a multi-node head starts Ray
    first and its server only once the workers have joined (start_ops).
    requires: what the units need to serve (the model, their ports), checked before anything is sent.
    """
    ops: list[Op] = []
    for name in state.units:
        # a role this host no longer has (e.g. multi-node → single); replicas go through rolling.leave_ops
        if name not in release.units and name not in REPLICA_UNITS:
            ops += [Command(("systemctl", "disable", "--now", name)), Remove(f"{UNIT_DIR}/{name}")]
    ops += [FileWrite(f"{UNIT_DIR}/{name}", body) for name, body in release.units.items()]
    if not keep_previous and state.current and state.current != release.dir:
        ops.append(Symlink(PREVIOUS, state.current))
    ops.append(Symlink(CURRENT, release.dir))
    names = [n for n in UNIT_NAMES if n in release.units]
    ops += [Command(("systemctl", "daemon-reload")), Command(("systemctl", "enable", "--quiet", *names), requires=requires)]
    return ops + start_ops([n for n in names if start is None or n in start])


def start_ops(names: list[str]) -> list[Op]:
    return [Command(("systemctl", "restart", name), timeout=900.0) for name in names]  # a restart waits for the old one to drain


def is_unchanged(release: Release, state: HostState) -> bool:
    """The same release is live: same folder, same unit files, every unit active."""
    if state.current != release.dir or not state.is_complete or set(state.units) != set(release.units):
        return False
    return all(state.units[n].sha256 == hashlib.sha256(body).hexdigest() and state.units[n].active == "active"
               for n, body in release.units.items())
