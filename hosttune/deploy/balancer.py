"""The group balancer: an nginx upstream per group of several hosts, over the hosts serving after a
deploy, written here (deploy --nginx-dir) for the machine that balances the group.

TLS end to end: when the group's hosts serve https (deploy.nginx with tls_cert and tls_key), the
balancer listens with TLS too, with the same certificate and key, and verifies every host's
certificate against the deployment's CA (deploy.nginx.tls_ca) for the name it carries
(deploy.nginx.tls_name). A balancer in plain HTTP in front of keyed hosts would carry their key in
clear: it is refused unless the inventory says `deploy.lb_plain_http: true`.

Routing by prefix: when the group's hosts run the prefix router (deploy.router), the balancer runs
it too, over the hosts' fronts: nginx sends every request to a router on its loopback address
(lb_port + ROUTER_OFFSET, its metrics one above) that keeps each prompt prefix on one host, and the
host's own router then picks the replica. Its unit and scripts are written beside the nginx config.
A group whose hosts serve TLS keeps least_conn: the router has no setting for the private CA its
connections to them would need.
"""

from __future__ import annotations

import os
import re
from dataclasses import replace
from pathlib import Path

from hosttune.rendering import render
from hosttune.config.inventory import Host, Inventory
from hosttune.deploy.access import Front, front_for
from hosttune.deploy.errors import DeployError
from hosttune.deploy.front import LOOPBACK
from hosttune.deploy.host import HostDeploy
from hosttune.deploy.router import ADMIN_PATHS, DIRECT_PATHS, RouterPorts, router_files, router_flags
from hosttune.deploy.settings import DEFAULT_PORT
from hosttune.deploy.shape import declared
from hosttune.deploy.units import Upstream, render_nginx
from hosttune.fleet_runner import Outcome
from hosttune.presets import load_router
from hosttune.quoting import systemd_exec

_ADDRESS = re.compile(r"^[A-Za-z0-9.:\[\]-]+$")
_PATH = re.compile(r"^[A-Za-z0-9_./@+:-]+$")  # what goes into nginx's config unquoted
ROUTER_OFFSET = 1000  # the group's router listens on 127.0.0.1:(lb_port + this), its /metrics one above
ROUTER_VENV = "/opt/hosttune/router"  # where the balancing machine has the router (a venv, its scripts inside)


def balanced_groups(inventory: Inventory) -> dict[str, list[Host]]:
    """The groups that get a balancer: several hosts, not one multi-node vLLM (which serves one model)."""
    return {group: hosts for group, hosts in inventory.groups.items()
            if len(hosts) > 1 and not (hosts[0].deploy.get("multinode") and declared(hosts[0]).engine in (None, "vllm"))}


def check_balancers(inventory: Inventory, folder: Path | None = None, router: bool | None = None) -> None:
    """Before any host changes: every group's balancer can be written, with TLS where its hosts have it, into
    `folder` (--nginx-dir) when given, and its prefix router (`router`: --router/--no-router) has ports."""
    groups = balanced_groups(inventory)
    for hosts in groups.values():
        _tls_of(hosts)
        if routes_by_prefix(hosts, router):
            _check_router_ports(hosts)
    if groups and folder is not None:
        _check_folder(folder)


def _check_router_ports(hosts: list[Host]) -> None:
    lb_port = hosts[0].deploy.get("lb_port")
    if isinstance(lb_port, bool) or not isinstance(lb_port, int):
        return  # the default, or a value the host's settings refuse (deploy.lb_port must be a port number)
    if lb_port + ROUTER_OFFSET + 1 > 65535:
        first = hosts[0]
        raise DeployError(f"{first.source}: deploy.lb_port {lb_port}: group {first.group}'s prefix router would listen "
                          f"on {lb_port + ROUTER_OFFSET} and {lb_port + ROUTER_OFFSET + 1}, past 65535; give a lb_port "
                          f"of {65534 - ROUTER_OFFSET} or less, or --no-router")


def _check_folder(folder: Path) -> None:
    """The folder, or the nearest part of its path that exists, takes new files; nothing is made yet."""
    there = next(p for p in (folder, *folder.parents) if p.exists())
    if not there.is_dir() or not os.access(there, os.W_OK | os.X_OK):
        raise DeployError(f"--nginx-dir {folder}: {there} is not a folder this user can write; "
                          "pass one where the group balancers can be written")


def _tls_of(hosts: list[Host]) -> Front | None:
    """The front whose TLS the balancer uses; raises DeployError when the balancer cannot be safe."""
    fronts = [front_for(h) for h in hosts]
    keyed = [h.name for h in hosts if h.deploy.get("api_key") or h.deploy.get("api_key_file")]
    tls = [f for f in fronts if f and f.tls]
    first = hosts[0]
    if tls and len(tls) != len(hosts):
        raise DeployError(f"{first.source}: group {first.group} mixes hosts with and without TLS in deploy.nginx; "
                          "its balancer needs one scheme")
    if not tls:
        if keyed and not first.deploy.get("lb_plain_http"):
            raise DeployError(f"{first.source}: group {first.group}'s balancer would carry the API key of "
                              f"{', '.join(keyed)} in plain HTTP; give deploy.nginx tls_cert, tls_key and tls_ca, "
                              "or allow it with deploy.lb_plain_http: true")
        return None
    front = tls[0]
    if front.tls.ca is None or front.tls.name is None:
        raise DeployError(f"{first.source}: group {first.group}'s balancer verifies its hosts' certificates: "
                          "give deploy.nginx.tls_ca (the CA that signed them) and tls_name (a name they carry)")
    for path in (front.tls.cert, front.tls.key, front.tls.ca):
        if not _PATH.match(str(path.resolve())):
            raise DeployError(f"{first.source}: {path}: the balancer's nginx config takes paths of letters, digits "
                              "and ./_@+:- only")
    return front


def upstreams(inventory: Inventory, outcomes: list[HostDeploy], router: bool | None = None) -> list[Upstream]:
    """An nginx upstream per balanced group, over the hosts serving after this deploy (or over the group's
    router, where it routes by prefix; `router` is deploy's --router/--no-router, None: the inventory's)."""
    serving = {o.host.name: o for o in outcomes if o.serving}
    found = []
    for group, hosts in balanced_groups(inventory).items():
        live = [h for h in hosts if h.name in serving]
        if live:
            upstream = _upstream(group, hosts, [_backend(h, serving[h.name]) for h in live], serving[live[0].name])
            found.append(_through_router(upstream) if routes_by_prefix(hosts, router) else upstream)
    return found


def routes_by_prefix(hosts: list[Host], router: bool | None = None) -> bool:
    """The group's hosts run the router (the option, else every host's deploy.router) and serve plain HTTP."""
    wanted = router if router is not None else all(h.deploy.get("router") for h in hosts)
    return bool(wanted) and _tls_of(hosts) is None


def router_port(upstream: Upstream) -> int:
    return upstream.listen + ROUTER_OFFSET


def is_routed(upstream: Upstream) -> bool:
    return upstream.backends == (f"{LOOPBACK}:{router_port(upstream)}",)


def _through_router(upstream: Upstream) -> Upstream:
    """nginx in front of the group's router, its admin API answered 404, tokenizing sent to the hosts."""
    return replace(upstream, backends=(f"{LOOPBACK}:{router_port(upstream)}",), tries=1, private_paths=ADMIN_PATHS,
                   direct_paths=DIRECT_PATHS, direct_backends=upstream.backends)


def router_unit(upstream: Upstream) -> bytes:
    """The group router's systemd unit for the balancing machine, over the hosts `upstream` balances."""
    router = load_router()
    port = router_port(upstream)
    workers = (f"http://{b}" for b in upstream.direct_backends)
    argv = (f"{ROUTER_VENV}/bin/python", f"{ROUTER_VENV}/{router.script}", "--worker-urls", *workers,
            *router_flags(router, RouterPorts(port, port + 1), "/health"))
    return render("hosttune-group-router.service.j2", group=upstream.group, policy=router.policy, venv=ROUTER_VENV,
                  requirement=router.requirement, files=" ".join(router.files), exec_start=systemd_exec(argv))


def _backend(host: Host, outcome: HostDeploy) -> str:
    if not _ADDRESS.match(host.connection.address):
        raise DeployError(f"{host.source}: address {host.connection.address!r} cannot go into an nginx upstream")
    front = front_for(host)  # the engine listens on 127.0.0.1 behind it
    port = front.port if front else (outcome.shape.port if outcome.shape and outcome.shape.port else None)
    return f"{host.connection.address}:{port or declared(host).port or DEFAULT_PORT}"


def _upstream(group: str, hosts: list[Host], backends: list[str], outcome: HostDeploy) -> Upstream:
    front = _tls_of(hosts)
    engine = (outcome.shape.engine if outcome.shape else None) or declared(hosts[0]).engine or "engine"
    lb_port = hosts[0].deploy.get("lb_port")
    if front is None:
        return Upstream(group, engine, tuple(backends), lb_port or 80)
    tls = front.tls
    return Upstream(group, engine, tuple(backends), lb_port or 443, tls_cert=str(tls.cert.resolve()),
                    tls_key=str(tls.key.resolve()), backend_scheme="https", backend_ca=str(tls.ca.resolve()),
                    backend_name=tls.name)


def plan_lines(inventory: Inventory, plans: list[HostDeploy], router: bool | None, folder: Path) -> list[str]:
    """What write_upstreams would write after a run in which every planned host deploys, for the plan."""
    projected = [replace(o, serving=o.release) if o.state is Outcome.PLANNED else o for o in plans]
    serving = {o.host.name for o in projected if o.serving}
    groups = balanced_groups(inventory)
    lines = []
    for upstream in upstreams(inventory, projected, router):
        names = ", ".join(h.name for h in groups[upstream.group] if h.name in serving)
        backends = ", ".join(upstream.direct_backends if is_routed(upstream) else upstream.backends)
        line = (f"balancer: {folder / f'hosttune-{upstream.group}.conf'}: nginx least_conn over {names} ({backends}) "
                f"on port {upstream.listen}")
        if is_routed(upstream):
            line += (f", through the group's prefix router on {LOOPBACK}:{router_port(upstream)} "
                     f"(hosttune-router-{upstream.group}.service and its scripts beside it)")
        lines.append(line)
    return lines


class BalancerWriteError(DeployError):
    """The hosts are deployed, and a group balancer's file could not be written after them."""


def write_upstreams(found: list[Upstream], folder: Path, deployed: tuple[str, ...] = ()) -> list[Path]:
    """Each group's nginx config, and its router's unit and scripts where it routes by prefix; each file whole or
    not at all. deployed: the hosts this run changed, which an error names."""
    files = {}
    for upstream in found:
        files[f"hosttune-{upstream.group}.conf"] = render_nginx(upstream)
        if is_routed(upstream):
            files[f"hosttune-router-{upstream.group}.service"] = router_unit(upstream)
            files.update(router_files(load_router()))  # the same scripts for every group
    path = folder
    try:
        folder.mkdir(parents=True, exist_ok=True)
        for name, text in files.items():
            path = folder / name
            _write_whole(path, text)
    except OSError as exc:
        done = f"deployed to {', '.join(deployed)}, but the" if deployed else "the"
        raise BalancerWriteError(
            f"{done} group balancer was not written ({path}: {exc.strerror or exc}): it still sends where it did "
            f"before; once {folder} takes it, deploy again: with every host unchanged it writes the balancer "
            f"alone") from None
    return [folder / name for name in files]


def _write_whole(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        tmp.write_bytes(data)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
