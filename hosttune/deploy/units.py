"""Render what deploy puts on hosts from templates/: the engine's systemd unit(s), the replica
probe's service and timer, and the nginx upstreams (over a group's hosts, or a host's replicas).

Every value lands in a unit through hosttune.quoting.systemd_word / systemd_exec.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hosttune.rendering import render
from hosttune.quoting import systemd_exec, systemd_word

SERVE_UNIT = "hosttune-serve.service"
RAY_UNIT = "hosttune-ray.service"
REPLICA_TEMPLATE = "hosttune-engine@.service"  # one instance per replica: hosttune-engine@0.service, ...
PROBE_UNIT = "hosttune-probe.service"
PROBE_TIMER = "hosttune-probe.timer"
ROUTER_UNIT = "hosttune-router.service"  # deploy.router: between the host's nginx and its replicas
UNIT_NAMES = (RAY_UNIT, SERVE_UNIT)  # start order
REPLICA_UNITS = (REPLICA_TEMPLATE, PROBE_UNIT, PROBE_TIMER, ROUTER_UNIT)
STOP_MARGIN_S = 15  # beyond the drain: the process exits, the port closes, logs flush
RESTART_SEC = 5


@dataclass(frozen=True)
class UnitSpec:
    name: str
    description: str
    argv: tuple[str, ...]  # numactl prefix included
    env: dict[str, str] = field(hash=False)
    working_dir: str = "/"
    drain_s: float = 30.0
    after: tuple[str, ...] = ()
    requires: tuple[str, ...] = ()
    environment_files: tuple[str, ...] = ()  # EnvironmentFile=: secrets and per-instance values stay out of the unit's text
    variables: tuple[str, ...] = ()  # @NAME@ in argv becomes ${NAME}: set per instance by its environment file


def replica_unit(index: int) -> str:
    return REPLICA_TEMPLATE.replace("@.", f"@{index}.")


def variable(name: str) -> str:
    """How argv names a per-instance value (quoting leaves it alone; render_unit turns it into ${NAME})."""
    return f"@{name}@"


def _exec_start(spec: UnitSpec) -> str:
    line = systemd_exec(spec.argv)
    for name in spec.variables:
        line = line.replace(variable(name), "${" + name + "}")
    return line


def render_unit(spec: UnitSpec, release: str) -> bytes:
    return render(
        "hosttune-engine.service.j2",
        release=release,
        description=spec.description.replace("%", "%%"),
        after=spec.after,
        requires=spec.requires,
        working_dir=systemd_word(spec.working_dir),
        environment=[systemd_word(f"{k}={v}") for k, v in spec.env.items()],
        # %i (the instance name) is the one specifier hosttune writes on purpose
        environment_files=[systemd_word(path).replace("%%i", "%i") for path in spec.environment_files],
        exec_start=_exec_start(spec),
        restart_sec=RESTART_SEC,
        drain_s=int(spec.drain_s),
        stop_timeout_s=int(spec.drain_s) + STOP_MARGIN_S,
    )


@dataclass(frozen=True)
class Upstream:
    group: str
    engine: str
    backends: tuple[str, ...]  # "address:port"
    listen: int = 80
    server_name: str = "_"
    max_fails: int = 3
    fail_timeout_s: int = 10
    read_timeout_s: int = 3600
    session_affinity: bool = False  # hash on X-Session-Id instead of least_conn
    servers_file: str | None = None  # the servers come from this file (a host's replicas), not backends
    tries: int = 3  # upstreams one request may try
    tls_cert: str | None = None  # paths on the host: nginx then listens with TLS only
    tls_key: str | None = None
    default_server: bool = False  # the host's own front answers whatever Host a client names
    backend_scheme: str = "http"  # "https" when the backends are hosts' nginx fronts with TLS
    backend_ca: str | None = None  # https backends: their certificates are verified against this CA file
    backend_name: str | None = None  # ... for this name
    private_paths: tuple[str, ...] = ()  # answered 404 by nginx, never passed on (the router's admin API)
    direct_paths: tuple[str, ...] = ()  # sent past the backends, straight to direct_backends (a router's replicas)
    direct_backends: tuple[str, ...] = ()


def render_nginx(upstream: Upstream) -> bytes:
    name = "hosttune_" + "".join(c if c.isalnum() else "_" for c in upstream.group)
    return render("nginx-upstream.conf.j2", upstream=name, group=upstream.group, engine=upstream.engine,
                  backends=upstream.backends, listen=upstream.listen, server_name=upstream.server_name,
                  max_fails=upstream.max_fails, fail_timeout_s=upstream.fail_timeout_s,
                  read_timeout_s=upstream.read_timeout_s, session_affinity=upstream.session_affinity,
                  servers_file=upstream.servers_file, tries=upstream.tries, tls_cert=upstream.tls_cert,
                  tls_key=upstream.tls_key, default_server=upstream.default_server,
                  backend_scheme=upstream.backend_scheme, backend_ca=upstream.backend_ca,
                  backend_name=upstream.backend_name, private_paths=upstream.private_paths,
                  direct_paths=upstream.direct_paths, direct_backends=upstream.direct_backends)


def render_probe_units(release: str, argv: tuple[str, ...], interval_s: int, timeout_s: int) -> dict[str, bytes]:
    """The probe's oneshot service and the timer that runs it."""
    return {PROBE_UNIT: render("hosttune-probe.service.j2", release=release, exec_start=systemd_exec(argv),
                               timeout_s=timeout_s),
            PROBE_TIMER: render("hosttune-probe.timer.j2", release=release, interval_s=interval_s)}
