"""The monitor on real systemd hosts over SSH: apply installs hosttune in a virtualenv and its timers on three
hosts serving the stand-in engine; their passes write metrics Prometheus accepts and status files; `hosttune
status` sees a stopped engine on one host within one interval; rollback takes it all away."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families
from typer.testing import CliRunner

from hosttune.cli import app

from .serve_setup import UNIT, install_standin_release

pytestmark = [pytest.mark.live, pytest.mark.live_seconds(60)]
runner = CliRunner()
REPO = Path(__file__).resolve().parents[2]
INTERVAL_S = 10
TEXTFILE_DIR = "/var/lib/node_exporter/textfile_collector"
NAMES = ("mon-a", "mon-b", "mon-c")
PORTS = dict(zip(NAMES, (18741, 18742, 18743)))
# Nothing but the monitor is managed: apply's only step is the monitor's.
PLAYBOOK = """\
name: monitor-only
settings:
  driver: {version: null, held: false}
  cuda: {toolkit: null}
  gpu: {persistence: null, pstate: null, pcie_link: null, ecc: null, mig: null}
  cpu: {governor: null, max_cstate: null}
  kernel: {rcu_nocbs: null}
  irq: {irqbalance: null, gpu_affinity: numa-local}
  numa: {balancing: null}
  memory: {thp: null}
  nvme: {apst: null}
  tools: {numactl: null, python: null}
  monitor: {enabled: true, interval_s: %d, active_interval_s: 3600}
"""


def invoke(*args: str) -> tuple[int, str]:
    result = runner.invoke(app, list(args))
    return result.exit_code, result.stdout


@pytest.fixture(scope="module")
def monitored(live_fleet, tmp_path_factory):
    folder = tmp_path_factory.mktemp("monitor")
    wheels = folder / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", str(REPO), "-w", str(wheels)], check=True, timeout=300)
    (folder / "monitor-only.yaml").write_text(PLAYBOOK % INTERVAL_S)
    hosts = live_fleet.boot(list(NAMES))
    for host in hosts:
        install_standin_release(host, PORTS[host.name])
    known = live_fleet.write_known_hosts(folder / "known_hosts", hosts)
    host_vars = {h.name: {"profile": str(folder / "monitor-only.yaml"), "tune": {"monitor": {"wheels": str(wheels)}}}
                 for h in hosts}
    inventory = live_fleet.write_inventory(folder / "inv.yaml", known, hosts, host_vars=host_vars)
    code, out = invoke("apply", "-i", str(inventory), "--yes", "--format", "json")
    assert code == 0, out
    yield hosts, inventory, json.loads(out)
    for host in hosts:
        live_fleet.remove(host)


def fleet_status(inventory) -> dict[str, dict]:
    _, out = invoke("status", "-i", str(inventory), "--format", "json")
    return {h["host"]: h for h in json.loads(out)}


def wait_for(inventory, ready, timeout_s: float) -> dict[str, dict]:
    deadline = time.monotonic() + timeout_s
    while True:
        found = fleet_status(inventory)
        if ready(found) or time.monotonic() > deadline:
            return found
        time.sleep(1)


def test_apply_installs_the_timers_whose_passes_write_metrics_prometheus_accepts(monitored):
    hosts, inventory, applied = monitored
    steps = [s for h in applied["hosts"] for s in h["plan"]["steps"]]
    assert {tuple(s["fixes"]) for s in steps} == {("monitor.installed",)}
    first = wait_for(inventory, lambda f: all(h["passes"] for h in f.values()), 3 * INTERVAL_S)
    assert {h: s["state"] for h, s in first.items()} == dict.fromkeys(NAMES, "ok"), first
    a = hosts[0]
    assert a.exec("systemctl is-active hosttune-monitor.timer hosttune-monitor-active.timer").stdout.split() == ["active"] * 2
    text = a.path(f"{TEXTFILE_DIR}/hosttune.prom").read_text()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    units = [s for s in families["hosttune_check_status"].samples if s.labels["check"] == "serve.units"]
    assert {s.labels["status"]: s.value for s in units}["ok"] == 1.0 and units[0].labels["host"] == "mon-a"
    assert families["hosttune_monitor_last_run_timestamp_seconds"].samples[0].value > time.time() - 3 * INTERVAL_S
    if shutil.which("promtool"):
        assert subprocess.run(["promtool", "check", "metrics"], input=text.encode(), capture_output=True).returncode == 0
        rules = a.path("/etc/hosttune/monitor/hosttune-alerts.yml")
        checked = subprocess.run(["promtool", "check", "rules", str(rules)], capture_output=True, text=True)
        assert checked.returncode == 0 and "SUCCESS: 6 rules found" in checked.stdout, checked.stdout + checked.stderr
    code, out = invoke("check", "-i", str(inventory), "--format", "json")
    for host in json.loads(out)["hosts"]:
        found = {f["check_id"]: f["status"] for f in host["findings"]}
        assert found["monitor.installed"] == found["monitor.stale"] == "ok", host["findings"]


def test_the_active_pass_writes_its_own_metrics_and_status(monitored):
    hosts, inventory, _ = monitored
    b = hosts[1]
    b.exec("systemctl start hosttune-monitor-active.service", timeout=300)
    text = b.path(f"{TEXTFILE_DIR}/hosttune-active.prom").read_text()
    checks = {s.labels["check"] for f in text_string_to_metric_families(text) if f.name == "hosttune_check_status"
              for s in f.samples}
    assert checks == {"gpu.load", "gpu.diag", "gpu.allreduce"}
    passes = fleet_status(inventory)["mon-b"]["passes"]
    assert [p["pass_name"] for p in passes] == ["regular", "active"] and passes[1]["interval_s"] == 3600


def test_status_shows_a_stopped_engine_on_one_host_within_one_interval(monitored):
    hosts, inventory, _ = monitored
    c = hosts[2]
    c.exec(f"systemctl stop {UNIT}")
    stopped = time.monotonic()
    try:
        found = wait_for(inventory, lambda f: f["mon-c"]["state"] != "ok", INTERVAL_S + 10)
        took = time.monotonic() - stopped
    finally:
        c.exec(f"systemctl start {UNIT}")
    assert found["mon-c"]["state"] == "DRIFT" and took <= INTERVAL_S + 10, (took, found["mon-c"])
    units = next(f for f in found["mon-c"]["findings"] if f["check_id"] == "serve.units")
    assert units["subjects"] == [UNIT] and "inactive/dead" in units["detail"] and "journal:" in units["detail"]
    assert found["mon-a"]["state"] == found["mon-b"]["state"] == "ok"


def test_a_host_that_is_down_is_unreachable_and_its_monitor_resumes_at_boot(monitored, live_fleet):
    hosts, inventory, _ = monitored
    b = hosts[1]
    with live_fleet.stopped(b):
        code, out = invoke("status", "-i", str(inventory))
        assert code & 4 and "1 unreachable" in out.splitlines()[-1], out
        assert next(line for line in out.splitlines() if line.startswith("mon-b")).split()[1] == "UNREACHABLE"
    before = fleet_status(inventory)["mon-b"]["passes"][0]["when"]
    after = wait_for(inventory, lambda f: f["mon-b"]["passes"][0]["when"] > before, 3 * INTERVAL_S)
    assert after["mon-b"]["state"] == "ok"


def test_turning_the_active_pass_off_stops_its_timer_and_takes_its_last_files_away(monitored, tmp_path):
    hosts, inventory, _ = monitored
    b = hosts[1]  # its active pass has written its files (the test above)
    doc = yaml.safe_load(Path(inventory).read_text())
    doc["groups"]["live"]["hosts"]["mon-b"]["tune"]["monitor"]["active_interval_s"] = None
    (tmp_path / "inv.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    off = str(tmp_path / "inv.yaml")
    _, out = invoke("check", "-i", off, "--limit", "mon-b", "--format", "json")
    installed = next(f for f in json.loads(out)["hosts"][0]["findings"] if f["check_id"] == "monitor.installed")
    assert installed["status"] == "drift" and "but monitor.active_interval_s is null" in installed["detail"]
    code, out = invoke("apply", "-i", off, "--limit", "mon-b", "--dry-run")
    assert "$ systemctl disable --now hosttune-monitor-active.timer" in out and "status-active.json" in out, out
    code, out = invoke("apply", "-i", off, "--limit", "mon-b", "--yes")
    assert code == 0, out
    assert b.exec("systemctl is-active hosttune-monitor-active.timer", check=False).stdout.strip() != "active"
    for path in ("/etc/systemd/system/hosttune-monitor-active.timer", "/var/lib/hosttune/monitor/status-active.json",
                 f"{TEXTFILE_DIR}/hosttune-active.prom"):
        assert not b.path(path).exists(), path
    assert [p["pass_name"] for p in fleet_status(inventory)["mon-b"]["passes"]] == ["regular"]
    _, out = invoke("check", "-i", off, "--limit", "mon-b", "--format", "json")
    found = {f["check_id"]: f["status"] for f in json.loads(out)["hosts"][0]["findings"]}
    assert found["monitor.installed"] == found["monitor.stale"] == "ok"


def test_a_stopped_timer_is_stale_and_rollback_takes_the_monitor_away(monitored, live_fleet):
    hosts, inventory, _ = monitored
    a = hosts[0]
    # a regular pass has written its status (whichever tests ran before), and none runs after the timer stops to
    # write over the one back-dated here
    wait_for(inventory, lambda f: f["mon-a"]["passes"], 3 * INTERVAL_S)
    a.exec("systemctl stop hosttune-monitor.timer hosttune-monitor.service")
    status = a.path("/var/lib/hosttune/monitor/status.json")
    doc = json.loads(status.read_text())
    status.write_text(json.dumps({**doc, "when": doc["when"] - 4 * INTERVAL_S - 300}))  # as if the pass stopped then
    a.exec(f"touch -d '-{4 * INTERVAL_S + 300} seconds' /var/lib/hosttune/monitor/status.json")
    found = fleet_status(inventory)
    assert found["mon-a"]["state"] == "STALE" and found["mon-b"]["state"] == "ok"
    assert found["mon-a"]["findings"][0]["check_id"] == "monitor.stale"
    assert "regular pass last wrote its status" in found["mon-a"]["findings"][0]["detail"]
    _, out = invoke("check", "-i", str(inventory), "--limit", "mon-a", "--format", "json")
    checked = {f["check_id"]: f for f in json.loads(out)["hosts"][0]["findings"]}
    assert checked["monitor.stale"]["status"] == "drift" and checked["monitor.installed"]["status"] == "drift"
    assert "hosttune-monitor.timer inactive" in checked["monitor.installed"]["detail"]
    code, out = invoke("rollback", "-i", str(inventory), "--limit", "mon-a", "--yes")
    assert code == 0, out
    assert not a.path("/opt/hosttune-monitor/venv").exists()
    assert not a.path("/etc/systemd/system/hosttune-monitor.timer").exists()
    assert a.exec("systemctl is-enabled hosttune-monitor-active.timer", check=False).stdout.strip() != "enabled"
