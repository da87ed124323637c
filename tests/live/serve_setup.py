"""A deployed engine on a live host without a model: the stand-in engine (tests/support/standin_engine.py)
run by a hosttune-serve.service unit, or by replica instances of hosttune-engine@.service with the replica
probe's timer, with the live release.json deploy would have written."""
from __future__ import annotations

import json
from pathlib import Path

from hosttune.deploy.front import NGINX_CONF
from hosttune.deploy.replicas import SERVERS_FILE
from hosttune.deploy.units import Upstream, render_nginx

SUPPORT = Path(__file__).resolve().parents[1] / "support" / "standin_engine.py"
RELEASE = "custom-standin0001"
UNIT = "hosttune-serve.service"
UNIT_TEXT = """\
[Unit]
Description=hosttune stand-in engine for the live tests
[Service]
ExecStart=/usr/bin/python3 /opt/hosttune/standin_engine.py {port}
Restart=no
[Install]
WantedBy=multi-user.target
"""


def install_standin_release(host, port: int) -> None:
    """The stand-in engine serving on `port`, started, as deploy leaves a release (one service, no key)."""
    meta = host.path(f"/opt/hosttune/releases/{RELEASE}/.hosttune")
    meta.mkdir(parents=True, exist_ok=True)
    doc = {"id": RELEASE, "engine": "custom", "units": [UNIT], "settings": {"model": "standin", "port": port}}
    (meta / "release.json").write_text(json.dumps(doc))
    host.path("/opt/hosttune/standin_engine.py").write_text(SUPPORT.read_text())
    host.path(f"/etc/systemd/system/{UNIT}").write_text(UNIT_TEXT.format(port=port))
    host.exec(f"ln -sfn /opt/hosttune/releases/{RELEASE} /opt/hosttune/current && systemctl daemon-reload "
              f"&& systemctl enable --now {UNIT}")


REPLICA_TEMPLATE = "hosttune-engine@.service"
REPLICA_UNIT_TEXT = """\
[Unit]
Description=hosttune stand-in engine replica %i for the live tests
[Service]
EnvironmentFile=/opt/hosttune/current/.hosttune/replica-%i.env
ExecStart=/usr/bin/python3 /opt/hosttune/standin_engine.py ${HOSTTUNE_PORT}
Restart=no
"""
PROBE_SERVICE = """\
[Unit]
Description=hosttune replica probe stand-in
[Service]
Type=oneshot
ExecStart=/bin/true
"""
PROBE_TIMER = """\
[Unit]
Description=hosttune replica probe stand-in, every 10s
[Timer]
OnActiveSec=10
OnUnitActiveSec=10
[Install]
WantedBy=timers.target
"""


def install_standin_replicas(host, ports: tuple[int, ...], front_port: int) -> list[str]:
    """One stand-in replica instance per port, the probe's timer and the host's nginx front over them on
    `front_port` (deploy's own template), as deploy leaves a host of replicas."""
    meta = host.path(f"/opt/hosttune/releases/{RELEASE}/.hosttune")
    meta.mkdir(parents=True, exist_ok=True)
    replicas = [{"index": i, "port": p, "gpus": [i]} for i, p in enumerate(ports)]
    doc = {"id": RELEASE, "engine": "custom", "units": [REPLICA_TEMPLATE, "hosttune-probe.service", "hosttune-probe.timer"],
           "settings": {"model": "standin", "port": ports[0] - 1, "replicas": replicas}}
    (meta / "release.json").write_text(json.dumps(doc))
    for r in replicas:
        (meta / f"replica-{r['index']}.env").write_text(f"HOSTTUNE_PORT={r['port']}\n")
    host.path("/opt/hosttune/standin_engine.py").write_text(SUPPORT.read_text())
    for name, text in ((REPLICA_TEMPLATE, REPLICA_UNIT_TEXT), ("hosttune-probe.service", PROBE_SERVICE),
                       ("hosttune-probe.timer", PROBE_TIMER)):
        host.path(f"/etc/systemd/system/{name}").write_text(text)
    upstream = Upstream("local", "custom", (), front_port, servers_file=SERVERS_FILE, default_server=True, tries=len(ports))
    host.path(NGINX_CONF).write_bytes(render_nginx(upstream))
    write_servers(host, ports)
    instances = [f"hosttune-engine@{r['index']}.service" for r in replicas]
    host.exec(f"ln -sfn /opt/hosttune/releases/{RELEASE} /opt/hosttune/current && systemctl daemon-reload "
              f"&& systemctl start {' '.join(instances)} nginx.service && systemctl enable --now hosttune-probe.timer")
    return instances


def write_servers(host, ports: tuple[int, ...], down: tuple[int, ...] = ()) -> None:
    """The front's servers file as the replica probe writes it: a drained or failing replica is down."""
    path = host.path(SERVERS_FILE)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(f"server 127.0.0.1:{p} max_fails=3 fail_timeout=10s{' down' if p in down else ''};\n"
                            for p in ports))
