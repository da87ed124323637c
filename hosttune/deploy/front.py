"""The operations that guard a host's engine: its key file, and the host's one nginx in front of it.

Operations as data, like plan.py: the key file (root, 0600, in a 0700 folder) before the units
restart, so the engine starts with its key. The host has one nginx front, NGINX_CONF: over the
one service (written here once the engine is up, checked with `nginx -t` before nginx reloads, so
a bad config never replaces a working one), or over the host's replicas (a file of their release,
which replica_lb.py checks and reloads; its TLS files come from here first).
"""

from __future__ import annotations

import re
from dataclasses import replace

from hosttune.deploy.access import HOST_KEY_DIR, HOST_TLS_DIR, Access
from hosttune.actions.base import Command, FileWrite, Op, Remove
from hosttune.actions.needs import NeedCommand
from hosttune.deploy.settings import ServeSettings
from hosttune.deploy.state import HostState
from hosttune.deploy.units import Upstream, render_nginx
from hosttune.presets import EnginePreset

NGINX_CONF = "/etc/nginx/conf.d/hosttune-local.conf"  # the host's front: conf.d includes *.conf only
LOOPBACK = "127.0.0.1"

# The new config goes live only if `nginx -t` accepts the whole configuration with it; else the one
# before is put back (or none), so the next reload of nginx, by anyone, still works.
_SWAP_CHECKED = r"""set -u
conf=$1
if [ -f "$conf" ]; then cp -p -- "$conf" "$conf.old" || exit 1; fi
mv -f -- "$conf.new" "$conf" || exit 1
if ! out=$(nginx -t 2>&1); then
    if [ -f "$conf.old" ]; then mv -f -- "$conf.old" "$conf"; else rm -f -- "$conf"; fi
    printf '%s\n' "$out" >&2
    exit 1
fi
rm -f -- "$conf.old"
"""


_LISTEN = re.compile(rb"^[ \t]*listen[ \t]+(?:[^;#\s]*:)?(\d+)[;\s]", re.M)


def listen_ports(conf: bytes) -> set[int]:
    """The ports an nginx config this deployment rendered listens on."""
    return {int(port) for port in _LISTEN.findall(conf)}


def on_loopback(settings: ServeSettings) -> ServeSettings:
    """An engine behind the host's nginx listens on 127.0.0.1 only: nginx alone listens on the network."""
    return replace(settings, flags={**settings.flags, "host": LOOPBACK})


def key_ops(access: Access, preset: EnginePreset) -> list[Op]:
    if not access.key:
        return []
    if not preset.serve.api_key_env:
        raise ValueError(f"preset {preset.name} names no api_key_env")
    line = f"{preset.serve.api_key_env}={access.key}\n".encode()
    path = access.env_file
    # write() keeps the owner and mode of a file that is already there: set them every time
    return [FileWrite(path, line, 0o600), Command(("chown", "root:root", "--", HOST_KEY_DIR, path)),
            Command(("chmod", "0700", "--", HOST_KEY_DIR)), Command(("chmod", "0600", "--", path))]


def front_upstream(access: Access, engine: str, ports: tuple[int, ...] = (), *, listen: int = 80,
                   servers_file: str | None = None, session_affinity: bool = False, tries: int = 3) -> Upstream:
    """The host's nginx over its replicas on the loopback address (their ports, or the servers file that lists
    them): on deploy.nginx's port with its TLS, else on `listen` (the service port)."""
    front = access.front
    tls = front.tls if front else None
    cert, key = (f"{HOST_TLS_DIR}/{access.group}.crt", f"{HOST_TLS_DIR}/{access.group}.key") if tls else (None, None)
    return Upstream("local", engine, tuple(f"{LOOPBACK}:{p}" for p in ports), front.port if front else listen,
                    tls_cert=cert, tls_key=key, default_server=True, session_affinity=session_affinity,
                    servers_file=servers_file, tries=tries)


def tls_ops(access: Access) -> list[Op]:
    """The front's certificate and private key (root, 0600) where its nginx config names them."""
    if access.front is None or access.front.tls is None:
        return []
    upstream = front_upstream(access, "")
    return [FileWrite(upstream.tls_cert, access.front.tls.cert.read_bytes(), 0o644),
            FileWrite(upstream.tls_key, access.front.tls.key.read_bytes(), 0o600),
            Command(("chown", "root:root", "--", upstream.tls_key)), Command(("chmod", "0600", "--", upstream.tls_key))]


def front_paths(access: Access) -> list[str]:
    """The host's files of its front, for the state read to hash: an unchanged release writes only what differs."""
    tls = [front_upstream(access, "").tls_cert, front_upstream(access, "").tls_key] if access.front and access.front.tls \
        else []
    return [NGINX_CONF, *tls]


def refresh_tls_ops(access: Access) -> list[Op]:
    """A live release whose nginx config stays: the TLS files again (a renewed certificate), and nginx reloaded."""
    ops = tls_ops(access)
    return ops + [Command(("systemctl", "reload-or-restart", "nginx"))] if ops else []


def unfront_ops() -> list[Op]:
    """The host's front taken away: its config removed and nginx reloaded (nginx stays enabled: it may serve other
    sites)."""
    return [Remove(NGINX_CONF), Command(("systemctl", "try-reload-or-restart", "nginx.service"))]


def stale_front_ops(state: HostState) -> list[Op]:
    """This deployment's front over one service (hosttune-local.conf there, no replica live) taken away, for a
    service going live without one; replicas live now take their nginx config with them (rolling.leave_ops)."""
    return unfront_ops() if state.nginx_ports and not state.instances else []


def front_ops(access: Access, engine: str, ports: tuple[int, ...]) -> list[Op]:
    """One service behind the front: TLS files, the nginx config, `nginx -t`, then nginx enabled and reloaded."""
    if access.front is None:
        return []
    conf = NGINX_CONF
    return tls_ops(access) + [FileWrite(conf + ".new", render_nginx(front_upstream(access, engine, ports))),
                              Command(("sh", "-c", _SWAP_CHECKED, "sh", conf), requires=(NeedCommand("nginx"),)),
                              Command(("systemctl", "enable", "--quiet", "nginx")),
                              Command(("systemctl", "reload-or-restart", "nginx"))]


def front_removals(front: list[Op], state: HostState) -> tuple[str, ...]:
    """The host's front that the run removes, in the plan's words: marked ! as a deploy that drops it is."""
    if not any(isinstance(op, Remove) for op in front):
        return ()
    ports = sorted(state.nginx_ports)
    return (f"removes the host's nginx front on port{'s' if len(ports) > 1 else ''} {', '.join(map(str, ports))}",)
