"""Service health against real systemd hosts over SSH: the stand-in engine serving, then stopped; a host of
stand-in replicas with one replica and the probe timer stopped."""
from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from hosttune.cli import app

from .serve_setup import UNIT, install_standin_release, install_standin_replicas, write_servers

pytestmark = pytest.mark.live
runner = CliRunner()
PORT = 18731
REPLICA_PORTS = (18734, 18735)
FRONT_PORT = 18733


@pytest.fixture(scope="module")
def served(live_fleet, tmp_path_factory):
    host, replicated = live_fleet.boot(["served", "replicated"])
    install_standin_release(host, PORT)
    install_standin_replicas(replicated, REPLICA_PORTS, FRONT_PORT)
    folder = tmp_path_factory.mktemp("served")
    known = live_fleet.write_known_hosts(folder / "known", [host, replicated])
    inventory = live_fleet.write_inventory(folder / "inv.yaml", known, [host, replicated])
    yield host, replicated, inventory
    live_fleet.remove(host)
    live_fleet.remove(replicated)


def serve_findings(inventory, name: str = "served") -> dict[str, dict]:
    result = runner.invoke(app, ["check", "-i", str(inventory), "--limit", name, "--format", "json"])
    return {f["check_id"]: f for f in json.loads(result.stdout)["hosts"][0]["findings"] if f["check_id"].startswith("serve.")}


def test_a_serving_engine_is_ok_and_a_stopped_unit_is_a_finding_with_its_state_and_journal(served):
    host, _, inventory = served
    found = serve_findings(inventory)
    assert found["serve.units"]["status"] == "ok" and found["serve.units"]["active"] == f"{UNIT} active/running"
    assert found["serve.health"]["status"] == "ok" and "one token in" in found["serve.health"]["active"]
    host.exec(f"systemctl stop {UNIT}")
    try:
        found = serve_findings(inventory)
    finally:
        host.exec(f"systemctl start {UNIT}")
    units = found["serve.units"]
    assert units["status"] == "drift" and units["subjects"] == [UNIT]
    assert f"{UNIT} is inactive/dead; journal: " in units["detail"] and f"Stopped {UNIT}" in units["detail"]
    assert found["serve.health"]["status"] == "drift" and found["serve.health"]["subjects"] == ["engine"]
    assert found["serve.api_key"]["active"] == f"engine port {PORT} (http): not listening (serve.units says why)"


def test_a_stopped_replica_and_probe_timer_are_named_and_the_other_replica_still_serves(served):
    _, host, inventory = served
    found = serve_findings(inventory, "replicated")
    assert found["serve.units"]["status"] == "ok", found["serve.units"]
    assert found["serve.units"]["active"].startswith("hosttune-engine@0.service active/running, hosttune-engine@1.service")
    assert "hosttune-probe.timer active/waiting" in found["serve.units"]["active"]
    assert "nginx.service active/running" in found["serve.units"]["active"]
    assert found["serve.health"]["status"] == "ok" and found["serve.front"]["status"] == "ok", found["serve.front"]
    assert found["serve.front"]["active"] == "1 port(s), 2/2 upstream servers in service"
    host.exec("systemctl stop hosttune-engine@1.service hosttune-probe.timer")
    try:
        found = serve_findings(inventory, "replicated")
    finally:
        host.exec("systemctl start hosttune-engine@1.service hosttune-probe.timer")
    units = found["serve.units"]
    assert units["status"] == "drift" and units["subjects"] == ["hosttune-engine@1.service", "hosttune-probe.timer"]
    assert "hosttune-probe.timer is inactive/dead" in units["detail"]
    health = found["serve.health"]
    assert health["subjects"] == ["replica 1"] and f"replica 0 port {REPLICA_PORTS[0]}: one token in" in health["active"]


def test_a_drained_replica_and_a_stopped_front_are_front_findings(served):
    _, host, inventory = served
    write_servers(host, REPLICA_PORTS, down=(REPLICA_PORTS[1],))
    host.exec("systemctl reload nginx.service")
    try:
        front = serve_findings(inventory, "replicated")["serve.front"]
        assert front["status"] == "drift" and front["subjects"] == [f"127.0.0.1:{REPLICA_PORTS[1]}"]
        assert f"upstream 127.0.0.1:{REPLICA_PORTS[1]} marked down" in front["detail"]
        host.exec("systemctl stop nginx.service")
        found = serve_findings(inventory, "replicated")
    finally:
        write_servers(host, REPLICA_PORTS)
        host.exec("systemctl start nginx.service")
    assert found["serve.units"]["subjects"] == ["nginx.service"]
    assert f"port {FRONT_PORT} (http): /health error" in found["serve.front"]["detail"]
