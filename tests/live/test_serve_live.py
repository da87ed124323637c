"""Service health against a real systemd host over SSH: the stand-in engine serving, then stopped."""
from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from hosttune.cli import app

from .serve_setup import UNIT, install_standin_release

pytestmark = pytest.mark.live
runner = CliRunner()
PORT = 18731


@pytest.fixture(scope="module")
def served(live_fleet, tmp_path_factory):
    (host,) = live_fleet.boot(["served"])
    install_standin_release(host, PORT)
    folder = tmp_path_factory.mktemp("served")
    inventory = live_fleet.write_inventory(folder / "inv.yaml", live_fleet.write_known_hosts(folder / "known", [host]), [host])
    yield host, inventory
    live_fleet.remove(host)


def serve_findings(inventory) -> dict[str, dict]:
    result = runner.invoke(app, ["check", "-i", str(inventory), "--format", "json"])
    return {f["check_id"]: f for f in json.loads(result.stdout)["hosts"][0]["findings"] if f["check_id"].startswith("serve.")}


def test_a_serving_engine_is_ok_and_a_stopped_unit_is_a_finding_with_its_state_and_journal(served):
    host, inventory = served
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
