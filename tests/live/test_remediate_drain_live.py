"""Live: `hosttune remediate` drains and restores a replica of the bundled engine under load, and not one
request fails.

Two CPU replicas of the tiny model are deployed behind the host's own nginx (a real deploy on a real systemd
host over SSH). The GPU fault comes through the stand-ins of gpu_standin.py: the host shows two H200s, the
release records replica N on GPU N (the replicas really run on the CPU), and the kernel log has Xid 79 on
GPU 1, which a reset clears. While `hosttune bench` sends a steady rate through nginx, `hosttune remediate`
drains replica 1 (out of nginx, in-flight requests finished, stopped), resets GPU 1, sees the fault gone,
starts the replica, waits for its /health and puts it back into nginx. Every request is answered 200.
"""
from __future__ import annotations

import json
import shutil
import time

import pytest
from typer.testing import CliRunner

from hosttune.cli import app

from .deploy_setup import MODEL, free_port, served, wait_for
from .gpu_standin import XID_79, gpu_files, resets, set_faults, write_files
from .steady_bench import bench_run, start_bench, stop_bench
from .test_deploy_replicas_live import SERVERS, deploy, group_key, shape

pytestmark = [pytest.mark.live, pytest.mark.timeout(900)]
runner = CliRunner()
RATE = 4  # requests a second
MIN_LOAD_S = 25  # at RATE after its first 4 answers: the 100 requests asserted below, however fast remediate was


def place_on_gpus(host) -> None:
    """The live release records replica N on stand-in GPU N, as a deploy on a host with two GPUs does."""
    meta = host.path(host.exec("readlink /opt/hosttune/current").stdout.strip()) / ".hosttune" / "replicas.json"
    layout = json.loads(meta.read_text())
    for replica in layout["replicas"]:
        replica["gpus"] = [replica["index"]]
    meta.write_text(json.dumps(layout))


def test_remediate_drains_and_restores_a_replica_under_load_without_a_failed_request(live_fleet, fresh_hosts, tmp_path,
                                                                                    wheelhouse, tiny_model):
    (host,) = fresh_hosts(["drain"])
    shutil.copytree(tiny_model, host.path(MODEL))
    known = live_fleet.write_known_hosts(tmp_path / "known_hosts", [host])
    port = free_port(3)
    inventory = live_fleet.write_inventory(tmp_path / "inv.yaml", known, [host], user="deploy", become=True,
                                           host_vars={host.name: {"deploy": shape(port)}})
    result = deploy(inventory, wheelhouse)
    assert result.exit_code == 0, result.output
    write_files(host, gpu_files())
    set_faults(host, dmesg=XID_79)
    place_on_gpus(host)

    answered = served(port + 1) + served(port + 2)
    bench = start_bench(port, tmp_path / "bench", group_key(inventory), rate=RATE)
    wait_for("the bench's first requests answered", lambda: served(port + 1) + served(port + 2) >= answered + 4, 30,
             every=0.2)
    started = time.monotonic()
    fixed = runner.invoke(app, ["remediate", "-i", str(inventory), "--yes", "--drain-wait", "30"])
    assert fixed.exit_code == 0, fixed.output
    assert "first: drain hosttune-engine@1.service off GPU1" in fixed.stdout
    recap = fixed.stdout[fixed.stdout.index("remediation run"):].splitlines()
    assert [l.split(":")[0].strip() for l in recap if l.startswith("    ")] == ["drain", "reset", "drain"], fixed.stdout
    assert "    drain: restored" in fixed.stdout and "  gpu.xid  GPU1: cleared" in fixed.stdout
    assert resets(host) == ["1"]
    servers = host.path(SERVERS).read_text()
    assert f"127.0.0.1:{port + 2} " in servers and " down;" not in servers
    assert host.exec("systemctl is-active hosttune-engine@0 hosttune-engine@1").stdout.split() == ["active", "active"]
    runs = sorted(host.path("/var/lib/hosttune/runs").glob("*.json"))
    ops = [json.loads(r.read_text())["steps"][0]["ops"] for r in runs]
    statuses = [[op["status"] for op in step] for step in ops]
    assert statuses == [["done"] * 3, ["done"], ["done"] * 3], ops  # drain (out, idle, stop); reset; restore (start, healthy, in)
    assert ops[0][1]["stderr"] == ""  # its requests in flight had finished before it stopped (no "still had connections")

    time.sleep(max(4.0, MIN_LOAD_S - (time.monotonic() - started)))  # the restored replica serves under load too
    out = stop_bench(bench)
    requests = bench_run(tmp_path / "bench")["requests"]
    bad = [(r["outcome"], r["status"], r["error"]) for r in requests if r["outcome"] != "ok" or r["status"] != 200]
    assert len(requests) >= 100 and not bad, (bad[:10], out[-2000:])
