"""The prefix router between a host's nginx and its replicas (deploy.router), as files.

nginx stays the host's front: it listens on the service port (or deploy.nginx's, with its TLS),
keeps the router's admin API off the network and passes the API key on to the replicas, which
check it as before. Behind it the router (presets/router.yaml: prefix_router.py) keeps each prompt
prefix on one replica and spreads new ones over them. Its scripts ship in the release's .hosttune/
beside replica_lb.py and run with the release's python through the `current` link, so its unit is
the same text release after release: a redeploy that changes the engine restarts the replicas one
at a time and never the router. replica_lb.py takes replicas out of it and puts them back, as it
does nginx's servers.

Pure, like replicas.py: files and argv from the layout and the preset.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, replace

from hosttune.rendering import render
from hosttune.deploy.access import Access
from hosttune.deploy.front import LOOPBACK, front_upstream
from hosttune.deploy.placement import Layout
from hosttune.deploy.release import CURRENT
from hosttune.deploy.settings import flag_argv
from hosttune.deploy.units import Upstream
from hosttune.presets import RouterPreset
from hosttune.quoting import systemd_exec
from hosttune.transport.base import bundled_script

# The router's admin API: the replicas it routes to.
ADMIN_PATHS = ("add_worker", "remove_worker", "list_workers")
# Prompts that are no generation, kept out of the router's prefix table: nginx sends them to a replica itself.
DIRECT_PATHS = ("tokenize", "detokenize")


@dataclass(frozen=True)
class RouterPorts:
    """On the loopback address, after the replicas' ports."""

    listen: int  # where nginx sends every request
    metrics: int  # the router's own Prometheus /metrics

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.listen}"


def router_ports(layout: Layout) -> RouterPorts:
    last = max(r.port for r in layout.replicas if r.port)
    return RouterPorts(last + 1, last + 2)


def router_files(router: RouterPreset) -> dict[str, bytes]:
    """The router's scripts as the host runs them, by name."""
    return {name: bundled_script("hosttune.deploy", name).encode() for name in router.files}


def scripts_digest(router: RouterPreset) -> str:
    digest = hashlib.sha256()
    for name, text in router_files(router).items():
        digest.update(name.encode() + b"\0" + text)
    return digest.hexdigest()[:16]


def router_flags(router: RouterPreset, ports: RouterPorts, health: str) -> list[str]:
    """The router's flags: on the loopback address at `ports`, its policy, health checks and the preset's."""
    flags = {"host": LOOPBACK, "port": ports.listen, "policy": router.policy, "prometheus-host": LOOPBACK,
             "prometheus-port": ports.metrics, "health-check-endpoint": health, **router.flags}
    return flag_argv(flags, {}, None)


def router_argv(router: RouterPreset, ports: RouterPorts, health: str) -> tuple[str, ...]:
    """The live release's python running its router script (both through `current`, found when it starts)."""
    # /usr/bin/env: systemd-analyze verify checks the program exists, and `current` may not yet
    return ("/usr/bin/env", f"{CURRENT}/bin/python", f"{CURRENT}/.hosttune/{router.script}",
            *router_flags(router, ports, health))


def render_router_unit(router: RouterPreset, ports: RouterPorts, health: str, sync: tuple[str, ...]) -> bytes:
    """sync: replica_lb.py's sync, through `current` too, run once the router has started. The scripts' digest
    in it restarts the router when a release brings other scripts, and only then."""
    return render("hosttune-router.service.j2", policy=router.policy, current=CURRENT, digest=scripts_digest(router),
                  exec_start=systemd_exec(router_argv(router, ports, health)), exec_start_post=systemd_exec(sync))


def router_upstream(access: Access, engine: str, listen: int, ports: RouterPorts, layout: Layout) -> Upstream:
    """The host's nginx front with the router as its one backend, its admin API answered 404, tokenizing
    sent to the replicas."""
    return replace(front_upstream(access, engine, (ports.listen,), listen=listen, tries=1), private_paths=ADMIN_PATHS,
                   direct_paths=DIRECT_PATHS, direct_backends=tuple(f"{LOOPBACK}:{r.port}" for r in layout.replicas))


def router_targets(ports: RouterPorts, host: str, engine: str) -> list[dict]:
    """The router's own /metrics (requests and prefixes per replica) for Prometheus' file_sd."""
    return [{"targets": [f"{LOOPBACK}:{ports.metrics}"], "labels": {"job": "hosttune-router", "host": host,
                                                                    "engine": engine}}]
