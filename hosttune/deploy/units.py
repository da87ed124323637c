"""Render what deploy puts on hosts from templates/: the engine's systemd unit(s) and the nginx upstream.

Every value lands in a unit through hosttune.quoting.systemd_word / systemd_exec.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hosttune.actions.templates import render
from hosttune.quoting import systemd_exec, systemd_word

SERVE_UNIT = "hosttune-serve.service"
RAY_UNIT = "hosttune-ray.service"
UNIT_NAMES = (RAY_UNIT, SERVE_UNIT)  # start order
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
    env_files: tuple[str, ...] = ()  # EnvironmentFile=: secrets stay out of the unit's text


def render_unit(spec: UnitSpec, release: str) -> bytes:
    return render(
        "hosttune-engine.service.j2",
        release=release,
        description=spec.description.replace("%", "%%"),
        after=spec.after,
        requires=spec.requires,
        working_dir=systemd_word(spec.working_dir),
        environment=[systemd_word(f"{k}={v}") for k, v in spec.env.items()],
        environment_files=[systemd_word(f) for f in spec.env_files],
        exec_start=systemd_exec(spec.argv),
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
    tls_cert: str | None = None  # paths on the host: nginx then listens with TLS only
    tls_key: str | None = None
    default_server: bool = False  # the host's own front answers whatever Host a client names
    backend_scheme: str = "http"  # "https" when the backends are hosts' nginx fronts with TLS


def render_nginx(upstream: Upstream) -> bytes:
    name = "hosttune_" + "".join(c if c.isalnum() else "_" for c in upstream.group)
    return render("nginx-upstream.conf.j2", upstream=name, group=upstream.group, engine=upstream.engine,
                  backends=upstream.backends, listen=upstream.listen, server_name=upstream.server_name,
                  max_fails=upstream.max_fails, fail_timeout_s=upstream.fail_timeout_s,
                  read_timeout_s=upstream.read_timeout_s, tls_cert=upstream.tls_cert, tls_key=upstream.tls_key,
                  default_server=upstream.default_server, backend_scheme=upstream.backend_scheme)
