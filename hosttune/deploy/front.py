"""The operations that guard a host's engine: its key file, and the host's nginx in front of it.

Operations as data, like plan.py: the key file (root, 0600, in a 0700 folder) before the units
restart, so the engine starts with its key; nginx's config (and TLS files) once the engine is
up, checked with `nginx -t` before nginx reloads, so a bad config never replaces a working one.
"""

from __future__ import annotations

from hosttune.deploy.access import HOST_KEY_DIR, HOST_TLS_DIR, Access
from hosttune.deploy.plan import Op, Run, WriteFile
from hosttune.deploy.units import Upstream, render_nginx
from hosttune.presets import EnginePreset

NGINX_CONF_DIR = "/etc/nginx/conf.d"
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


def key_ops(access: Access, preset: EnginePreset) -> list[Op]:
    if not access.key:
        return []
    if not preset.serve.api_key_env:
        raise ValueError(f"preset {preset.name} names no api_key_env")
    line = f"{preset.serve.api_key_env}={access.key}\n".encode()
    path = access.env_file
    # write() keeps the owner and mode of a file that is already there: set them every time
    return [WriteFile(path, line, 0o600), Run(("chown", "root:root", "--", HOST_KEY_DIR, path)),
            Run(("chmod", "0700", "--", HOST_KEY_DIR)), Run(("chmod", "0600", "--", path))]


def nginx_conf_path(access: Access) -> str:
    return f"{NGINX_CONF_DIR}/hosttune-{access.group}.conf"


def front_upstream(access: Access, engine: str, ports: tuple[int, ...]) -> Upstream:
    """The host's nginx over its replicas on the loopback address."""
    tls = access.front.tls
    cert, key = (f"{HOST_TLS_DIR}/{access.group}.crt", f"{HOST_TLS_DIR}/{access.group}.key") if tls else (None, None)
    return Upstream(access.group, engine, tuple(f"{LOOPBACK}:{p}" for p in ports), access.front.port,
                    tls_cert=cert, tls_key=key, default_server=True)


def front_ops(access: Access, engine: str, ports: tuple[int, ...]) -> list[Op]:
    """TLS files, the nginx config, `nginx -t`, then nginx enabled and reloaded."""
    if access.front is None:
        return []
    upstream = front_upstream(access, engine, ports)
    ops: list[Op] = []
    if access.front.tls:
        ops += [WriteFile(upstream.tls_cert, access.front.tls.cert.read_bytes(), 0o644),
                WriteFile(upstream.tls_key, access.front.tls.key.read_bytes(), 0o600),
                Run(("chown", "root:root", "--", upstream.tls_key)), Run(("chmod", "0600", "--", upstream.tls_key))]
    conf = nginx_conf_path(access)
    return ops + [WriteFile(conf + ".new", render_nginx(upstream)),  # conf.d includes *.conf only
                  Run(("sh", "-c", _SWAP_CHECKED, "sh", conf)),
                  Run(("systemctl", "enable", "--quiet", "nginx")),
                  Run(("systemctl", "reload-or-restart", "nginx"))]
