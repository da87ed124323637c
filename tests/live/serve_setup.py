"""A deployed engine on a live host without a model: the stand-in engine (tests/support/standin_engine.py)
run by a hosttune-serve.service unit, with the live release.json deploy would have written."""
from __future__ import annotations

import json
from pathlib import Path

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
