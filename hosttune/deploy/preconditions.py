"""A host's deploy, checked before anything is sent: what its operations need on the host.

The operations declare their needs (a Python that makes virtualenvs, free space for the wheels
and the virtualenv, the model the units serve, the ports they listen on); this reads the host
over the read-only transport and judges them with `hosttune.plan.preconditions`. A need the
plan can meet (python3-venv from the host's package lists) becomes operations at its start;
one it cannot is the host's error, and nothing is uploaded.
"""

from __future__ import annotations

from dataclasses import replace

from hosttune.actions.base import Op
from hosttune.actions.needs import Need, NeedModel, NeedPort
from hosttune.deploy.errors import DeployError
from hosttune.deploy.flagcheck import check_installed_flags
from hosttune.deploy.front import NGINX_CONF
from hosttune.deploy.model import model_problem
from hosttune.deploy.ports import held_back, replica_index, roll_order
from hosttune.deploy.state import HostState
from hosttune.deploy.router import router_ports
from hosttune.deploy.units import RAY_UNIT, ROUTER_UNIT, SERVE_UNIT
from hosttune.plan import preconditions
from hosttune.plan.preconditions import Checked
from hosttune.probes.needs import read_needs
from hosttune.transport.base import Transport

# Listeners on a deployment's ports that are the deployment itself (a redeploy finds them there).
OWNERS = (SERVE_UNIT, RAY_UNIT, "hosttune-engine@", "nginx.service", ROUTER_UNIT)
NOT_NGINX = tuple(o for o in OWNERS if o != "nginx.service")  # a port where this deployment runs no nginx


def serve_needs(job, state: HostState) -> tuple[Need, ...]:
    """What the units of `job` (a HostJob) need to serve: the model folder read on the host, and their ports
    free or already ours. nginx is ours on the ports this release's nginx listens on, on the service port
    of a host that runs replicas now (behind its local nginx, which going back to one service stops), and, for
    replicas, on the ports the host's hosttune-local.conf names now: nginx lets go of them at the switch, before
    the roll restarts any replica."""
    ports = {job.settings.port, *(r.port for r in (job.layout.replicas if job.layout else ()) if r.port)}
    if job.access.front is not None:
        ports.add(job.access.front.port)
    if ROUTER_UNIT in job.release.units:
        router = router_ports(job.layout)
        ports.update((router.listen, router.metrics))
    ours = _nginx_ports(job) | ({job.settings.port} if state.instances else set()) | _freed_by_nginx(job, state)
    model = (NeedModel(job.model.path, job.preset.name),) if job.model is not None else ()
    return model + tuple(NeedPort(p, OWNERS if p in ours else NOT_NGINX) for p in sorted(ports))


def _freed_by_nginx(job, state: HostState) -> set[int]:
    """The replicas' ports where this deployment's nginx listens now and its new config does not: the switch
    reloads nginx, which lets go of them, before the roll restarts the replicas that take them."""
    if not job.release.replicas or job.layout is None:
        return set()
    return {r.port for r in job.layout.replicas if r.port in state.nginx_ports} - _nginx_ports(job)


def model_needs_weights(job) -> bool:
    """An engine started with --load-format dummy makes random weights; any other loads the folder's."""
    flags = job.settings.flags
    return str(flags.get("load-format", flags.get("load_format", "auto"))) != "dummy"


def _nginx_ports(job) -> set[int]:
    """Where this release's nginx listens: its front's port, else the service port of several replicas."""
    if job.access.front is not None:
        return {job.access.front.port}
    return {job.settings.port} if job.release.replicas else set()


def refuse(transport: Transport, job, state: HostState) -> None:
    """What only the host can tell, before anything changes: nginx for several replicas, no other default server
    where the front listens, the flags."""
    if job.release.replicas and not state.nginx:
        raise DeployError(f"{job.host.name}: {len(job.release.replicas)} replicas need nginx on the host for their "
                          f"upstream on port {job.settings.port}; install nginx (apt-get install nginx-light) "
                          f"or deploy --replicas 1")
    if state.nginx and _nginx_ports(job):
        _refuse_other_default_server(transport, job)
    check_installed_flags(transport, job, state)


# Where nginx's configuration has a `listen ... PORT ... default_server` (the files nginx.conf, conf.d and
# sites-enabled give it on Debian and RHEL alike): one "default-server:PORT FILE" line each. Read-only.
_DEFAULT_SERVERS = r"""# hosttune deploy: nginx's default servers
set -u
for port do
    grep -RlE "^[[:space:]]*listen[[:space:]]+([^;#[:space:]]*:)?$port[[:space:]][^;#]*default_server" \
        /etc/nginx/nginx.conf /etc/nginx/conf.d /etc/nginx/sites-enabled 2>/dev/null | sed "s|^|default-server:$port |"
done
exit 0
"""


def _refuse_other_default_server(transport: Transport, job) -> None:
    """The front is its port's default_server (it answers whatever Host a client names), and nginx -t refuses a
    second one: Debian's stock site is one on port 80, which would fail the front only once it goes live."""
    ports = sorted(_nginx_ports(job))
    text = transport.read_script(_DEFAULT_SERVERS, *map(str, ports), what="reading nginx's default servers")
    for line in text.splitlines():
        port, _, path = line.removeprefix("default-server:").partition(" ")
        if line.startswith("default-server:") and _read_by_nginx(path) and path != NGINX_CONF:
            raise DeployError(f"{job.host.name}: port {port}, where the host's nginx front would listen as its default "
                              f"server, has one already in {path}, and nginx refuses two; disable that site or give "
                              f"deploy.nginx a port of its own")


def _read_by_nginx(path: str) -> bool:
    """conf.d is included as *.conf: a file there by another name is not nginx's."""
    return not path.startswith("/etc/nginx/conf.d/") or path.endswith(".conf")


def check_job(transport: Transport, job, groups: list[list[Op]], state: HostState | None = None) -> Checked:
    """Read what the operations need (one read-only round trip) and judge it; nothing is changed. With the host's
    `state`, a roll of its replicas onto ports they hold themselves is judged too (`_roll_ports`)."""
    asks = preconditions.requests_for(groups, job.packages, offline=False)
    needs = read_needs(transport, asks, root=None, manager=job.packages.name if job.packages else None)
    if job.model is not None:
        problem = model_problem(job.model, job.preset.serve.architectures, quant_methods=job.preset.serve.quant_methods,
                                any_format=not job.preset.is_bundled,
                                needs_weights=model_needs_weights(job))
        needs = replace(needs, models={job.model.path: problem})
    checked = preconditions.check(groups, needs, job.packages)
    held = _roll_ports(job, state, needs.ports) if state is not None else None
    if held:  # the port check found this deployment's replicas there; the roll's order finds them there too long
        return replace(checked, lines=checked.lines + (f"fails: {held}",), errors=(held,) + checked.errors)
    return checked


def _roll_ports(job, state: HostState, ports: dict[int, tuple[str, ...] | None]) -> str | None:
    """The ports the replicas hold are this deployment's, but a roll frees each only when it restarts its replica:
    nginx (or a replica) moved onto one held later fails mid-roll."""
    if not job.release.replicas or job.layout is None:
        return None
    router = router_ports(job.layout) if ROUTER_UNIT in job.release.units else None
    front = job.access.front.port if job.access.front is not None else None
    live = sorted(i for i in map(replica_index, state.instances) if i is not None)
    return held_back(roll_order(job.layout, job.settings.port, front, router), ports, live)
