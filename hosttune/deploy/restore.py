"""The release live before, made live again: read back from what the host keeps of it (its release.json and
unit files), and activated in place of one that failed its gate. A deploy whose gate fails and `--rollback`
(rollback.py) both bring a release back this way."""

from __future__ import annotations

import json
from dataclasses import dataclass, replace

from hosttune.actions.base import Command, Op
from hosttune.deploy import plan as dplan
from hosttune.deploy import rolling
from hosttune.deploy.access import Access
from hosttune.deploy.errors import DeployError
from hosttune.deploy.front import NGINX_CONF, front_ops, listen_ports
from hosttune.deploy.gate import GateResult, run_gate
from hosttune.deploy.release import Release, manifest_path, meta_dir, release_name
from hosttune.deploy.settings import ServeSettings
from hosttune.deploy.state import HostState, read_state
from hosttune.deploy.units import SERVE_UNIT
from hosttune.execute.perform import run_ops
from hosttune.presets import load_preset
from hosttune.transport.base import Transport


def load_release(transport: Transport, release_dir: str) -> Release:
    """A release installed on the host, from its release.json and unit files."""
    rid = release_name(release_dir)
    text = transport.read(["cat", "--", manifest_path(rid)], timeout=60)
    if not text.ok:
        raise DeployError(f"{transport.host_name}: release {rid} has no readable release.json ({text.stderr.strip()})")
    try:
        doc = json.loads(text.stdout)
        names, meta_names, copies = list(doc["units"]), list(doc.get("meta", [])), dict(doc.get("files", {}))
        head = (doc["engine"], doc["entry"], (), doc["offline"])
        settings, programs = _checked(dict(doc["settings"])), tuple(doc.get("programs", ()))
    except (ValueError, KeyError, TypeError, AttributeError) as exc:  # cut short, edited, or not hosttune's
        raise DeployError(f"{transport.host_name}: release {rid}'s {manifest_path(rid)} is not a release.json hosttune "
                          f"wrote ({type(exc).__name__}: {exc})") from None
    units = {name: _meta_file(transport, rid, name) for name in names}
    meta = {name: _meta_file(transport, rid, name) for name in meta_names}
    files = {path: _meta_file(transport, rid, copy) for path, copy in copies.items()}
    return Release(rid, *head, units, settings, programs, meta, files)


def _checked(settings: dict) -> dict:
    """The settings a rollback and a restore read as numbers and mappings (the port, each replica's index and port,
    the key file), each of the type they are read as; else the error load_release turns into one line."""
    int(settings.get("port", 0))
    for replica in settings.get("replicas", []):
        int(replica["index"]), int(replica["port"])
    if not isinstance(settings.get("api_key") or {}, dict):
        raise TypeError(f"settings.api_key is {type(settings['api_key']).__name__}, not a mapping")
    return settings


def read_back(transport: Transport, release_dir: str | None) -> tuple[Release | None, str]:
    """The release in release_dir as the host keeps it, or why it cannot be read back ("": no release named): what a
    plan says a failed gate can bring back."""
    if not release_dir:
        return None, ""
    try:
        return load_release(transport, release_dir), ""
    except DeployError as exc:
        return None, str(exc)


def fallback_dir(before: HostState, release: Release) -> str | None:
    """What a failed gate of `release` puts back: the release live before; when the deploy restarts the live release
    itself, the one before that."""
    return before.current if before.current != release.dir else before.previous


def _meta_file(transport: Transport, rid: str, name: str) -> bytes:
    body = transport.read(["cat", "--", f"{meta_dir(rid)}/{name}"], timeout=60)
    if not body.ok:
        raise DeployError(f"{transport.host_name}: release {rid} lacks its file {name}")
    return body.stdout.encode("utf-8", "surrogateescape")


@dataclass(frozen=True)
class Back:
    """A release to make live again in place of one that failed its gate."""

    previous: Release
    failed: Release
    base: ServeSettings  # this run's deadlines
    access: Access  # the host's front, put back over one service


def bring_back(transport: Transport, back: Back, link: list[Op], failed_replica: int | None) -> GateResult:
    """Activate `back.previous` again; replicas are rolled back one at a time like a deploy."""
    previous = back.previous
    after = read_state(transport, previous.id, [])
    settings, health = settings_of(previous, back.base), load_preset(previous.engine).serve.health
    if not previous.replicas:
        run_ops(transport, rolling.leave_ops(after) + dplan.activate_ops(previous, after, keep_previous=True) + link)
        gate = run_gate(transport, SERVE_UNIT, settings, health, warmup=0, key_file=previous.key_file)
        if gate.ok and back.failed.replicas:  # leave_ops took the replicas' nginx config: the front again
            run_ops(transport, front_ops(back.access, previous.engine, (settings.port,)))
        return gate
    # Replicas after the failed one never left the previous release: only those before it, and it, go back.
    moved = None
    if failed_replica is not None and rolling.indices(previous) == rolling.indices(back.failed):
        moved = [i for i in rolling.indices(previous) if i <= failed_replica]
    run_ops(transport, out_of_the_way(previous, back.failed, failed_replica)
            + rolling.switch_ops(previous, after, keep_previous=True) + link)
    gate, bad = rolling.roll(transport, previous, settings, health, only=moved)
    run_ops(transport, rolling.retire_ops(previous, read_state(transport, previous.id, [])))
    return gate if gate is not None else GateResult(True, "done")


def out_of_the_way(previous: Release, failed: Release, failed_replica: int | None) -> list[Op]:
    """Replicas the failed roll restarted onto a port the previous release takes before the way back restarts them
    (its nginx's, at its switch, or another of its replicas', where the deploy moved the ports down): out of nginx
    and stopped first, so that what comes back can bind its ports."""
    ports = {int(r["index"]): int(r["port"]) for r in previous.replicas}
    taken = set(ports.values()) | listen_ports(previous.files.get(NGINX_CONF, b""))
    restarted = [r for r in failed.replicas if failed_replica is None or int(r["index"]) <= failed_replica]
    blocking = [int(r["index"]) for r in restarted
                if int(r["port"]) in taken and int(r["port"]) != ports.get(int(r["index"]))]
    if not blocking:
        return []
    return [*rolling.lb_ops(failed, "out", *blocking),
            Command(("systemctl", "stop", *(rolling.replica_unit(i) for i in blocking)), timeout=900.0)]


def settings_of(release: Release, base: ServeSettings) -> ServeSettings:
    """The deadlines of this run, on the port the release serves on."""
    return replace(base, port=int(release.settings.get("port", base.port)))
