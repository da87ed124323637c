"""Live: two keyed CPU replicas of the bundled engine behind the host's own nginx on
a real systemd host over SSH, their shape (engine, model, 2 replicas, port, flags) declared in
the inventory's deploy: vars.

- The group's key reaches both replicas through their EnvironmentFile (in no command line or unit);
  they listen on 127.0.0.1 only, and through nginx a request without the key gets 401, with it 200.

- A redeploy to a new release while `hosttune bench` sends a steady open-loop rate through nginx
  (a bench that runs until the redeploys are done) loses no request: every response is a
  200 as the bench counts them (one replica at a time is taken out of nginx, drained, restarted on
  the new release, gated and put back). A `--set` holds for that run only: the next deploy, with no
  options at all and an inventory that now declares only the flags, goes back to those flags and
  keeps the engine, model, port and 2 replicas the live release recorded, again without a failed
  request.
- A replica killed with SIGKILL is restarted by systemd; the probe timer takes it out of nginx
  and puts it back once it generates again (its generation sends the key); its lines in the
  journal say hosttune.
- Refusals (a TP that does not divide the heads, a model folder the host lacks, a flag the
  bundled engine does not have, refused before any host) are one line each, exit 2, and leave /etc and /opt as they were.
- `hosttune remediate` drains and restores a replica under load, and not one request fails. The GPU fault
  comes through the stand-ins of gpu_standin.py: the host shows two H200s, the release records replica N on
  GPU N (the replicas really run on the CPU), and the kernel log has Xid 79 on GPU 1, which a reset clears.
  While `hosttune bench` sends a steady rate through nginx, remediate drains replica 1 (out of nginx,
  in-flight requests finished, stopped), resets GPU 1, sees the fault gone, starts the replica, waits for its
  /health and puts it back into nginx. Every request is answered 200.

The tests share the host and its first deploy, in this order.
"""
from __future__ import annotations

import json
import time

import pytest
from typer.testing import CliRunner

from hosttune.cli import app

from .deploy_setup import (MODEL, QUICK_START, complete, deploy, group_key, invoke_deploy, replica_host, served,
                           status, under_load, wait_for)
from .gpu_standin import XID_79, gpu_files, resets, set_faults, write_files
from .steady_bench import bench_run, stop_bench
from .steady_bench import start_bench as steady_bench

pytestmark = [pytest.mark.live, pytest.mark.timeout(1500), pytest.mark.live_seconds(170)]
SERVERS = "/etc/hosttune/nginx/local-servers.conf"
runner = CliRunner()
# seconds the load goes on once remediate has restored the replica: it serves under load too
RESTORED_LOAD_S = 6


def shape(port: int) -> dict:
    """The deployment's shape as the inventory declares it."""
    return {"engine": "custom", "model": MODEL, "replicas": 2, "port": port,
            "custom": {"device": "cpu", "max-batch-size": 8, **QUICK_START},
            "health_timeout": 240, "warmup": 1, "probe_interval": 2, "api_key": True}


def tree_hash(host) -> str:
    """Every path under /etc and /opt with its type, size, mtime and link target: any change shows."""
    return host.exec("find /etc /opt -printf '%p %y %s %T@ %l\\n' | sort | sha256sum").stdout.split()[0]


@pytest.fixture(scope="module")
def keyed_replicas(live_fleet, tmp_path_factory, wheelhouse, tiny_model):
    """Host `replicas` with the two keyed replicas its inventory declares, deployed: (its ReplicaHost, the first
    deploy's result, its seconds)."""
    booted = []

    def boot(names):
        hosts = live_fleet.boot(names)
        booted.extend(hosts)
        return hosts

    setup = replica_host(live_fleet, boot, tmp_path_factory.mktemp("replicas"), tiny_model, "replicas", shape,
                         num_ports=3)
    start = time.monotonic()
    result = deploy(setup.inventory, wheelhouse)
    yield setup, result, time.monotonic() - start
    for host in booted:
        live_fleet.remove(host)


def test_replicas_behind_nginx_roll_without_losing_a_request(live_fleet, keyed_replicas, tmp_path, wheelhouse, capsys):
    setup, result, seconds = keyed_replicas
    host, port, inventory = setup.host, setup.port, setup.inventory
    timings = {"first deploy": seconds}

    # 1. two keyed replicas on the ports after the service port, on loopback only; nginx on the service port
    assert result.exit_code == 0, result.output
    first = result.stdout.split()[2]
    for i in range(2):
        assert host.exec(f"systemctl is-active hosttune-engine@{i}.service").stdout.strip() == "active"
        env = host.path(f"/opt/hosttune/releases/{first}/.hosttune/replica-{i}.env").read_text()
        assert f"HOSTTUNE_PORT={port + 1 + i}" in env
    assert host.exec("systemctl is-active nginx.service hosttune-probe.timer").stdout.split() == ["active", "active"]
    servers = host.path(SERVERS).read_text()
    assert f"127.0.0.1:{port + 1} " in servers and f"127.0.0.1:{port + 2} " in servers and " down;" not in servers
    key = group_key(inventory)
    template = host.path("/etc/systemd/system/hosttune-engine@.service").read_text()
    assert "EnvironmentFile=/etc/hosttune/keys/live.env" in template and key not in template
    assert key not in host.exec("ps -eo args").stdout and key not in result.output
    for replica_port in (port + 1, port + 2):
        out = host.exec(["ss", "-ltnH", f"sport = :{replica_port}"]).stdout
        assert {line.split()[3].rsplit(":", 1)[0] for line in out.splitlines() if line.strip()} == {"127.0.0.1"}
    assert (status(port, None), status(port, "ht-wrong-key-0000000000000000"), status(port, key)) == (401, 401, 200)
    complete(port, key)

    # 2. under a steady rate through nginx, every request answered 200: a redeploy to a new release with
    #    a flag for this run only, then a redeploy with no options from an inventory that declares only the
    #    flags: the engine, model, port and replicas are what the live release recorded
    flags_only = {k: v for k, v in shape(port).items() if k not in ("engine", "model", "port", "replicas")}
    # beside the inventory: the same keys folder, so the same key
    undeclared = live_fleet.write_inventory(inventory.parent / "flags-only.yaml", inventory.parent / "known_hosts", [host],
                                            user="deploy", become=True, host_vars={host.name: {"deploy": flags_only}})

    def rolls():
        flagged = deploy(inventory, wheelhouse, "--set", "max-queue=16")
        live = host.exec("readlink /opt/hosttune/current").stdout.strip()
        return flagged, live, deploy(undeclared, wheelhouse)

    replica_ports = (port + 1, port + 2)
    answered = sum(map(served, replica_ports))
    bench = steady_bench(port, tmp_path / "bench", key)
    wait_for("the bench's first requests answered", lambda: sum(map(served, replica_ports)) >= answered + 6, 30, every=0.2)
    (flagged, live, back), timings["two rolling redeploys"], requests = under_load(rolls, bench, tmp_path / "bench")
    assert flagged.exit_code == 0, flagged.output
    second = flagged.stdout.split()[2]
    assert second != first and live.endswith(second)
    assert back.exit_code == 0, back.output
    assert back.stdout.split()[1:3] == ["deployed", first] and "!" not in back.plan  # the plan takes nothing away
    assert host.exec("readlink /opt/hosttune/current").stdout.strip().endswith(first)
    bad = [(r["outcome"], r["status"], r["error"]) for r in requests if r["outcome"] != "ok" or r["status"] != 200]
    # 2 a second from 3 s before the rolls until they ended: the load covered them, however fast they went
    assert len(requests) >= 2 * timings["two rolling redeploys"] and not bad, (len(requests), bad[:10])
    timings["requests during the rolls, all 200"] = len(requests)
    assert host.path(SERVERS).read_text().count("server 127.0.0.1:") == 2  # still the 2 replicas the host served
    for i in range(2):  # both replicas run the inventory's flags' release again
        pid = host.exec(f"systemctl show -p MainPID --value hosttune-engine@{i}.service").stdout.strip()
        assert first in host.exec(f"cat /proc/{pid}/cmdline | tr '\\0' ' '").stdout
    recorded = json.loads(host.path(f"/opt/hosttune/releases/{first}/.hosttune/release.json").read_text())
    assert recorded["settings"]["shape"] == {"engine": "custom", "model": MODEL, "port": port, "replicas": 2,
                                             "tensor_parallel": 1, "replicas_per_gpu": 1, "api_key": True,
                                             "front_port": None}

    # 3. SIGKILL one replica: systemd restarts it; the probe takes it out of nginx and puts it back
    unit = "hosttune-engine@1.service"
    pid = host.exec(f"systemctl show -p MainPID --value {unit}").stdout.strip()
    host.exec(f"kill -KILL {pid}")
    start = time.monotonic()
    wait_for("the probe takes replica 1 out", lambda: f"127.0.0.1:{port + 2} max_fails=3 fail_timeout=10s down;"
             in host.path(SERVERS).read_text(), 60)
    timings["probe took it out"] = time.monotonic() - start
    complete(port, key)  # the other replica serves meanwhile
    wait_for("systemd restarts it", lambda: int(host.exec(f"systemctl show -p NRestarts --value {unit}").stdout) >= 1, 60)
    wait_for("the probe puts it back", lambda: " down;" not in host.path(SERVERS).read_text(), 180)
    timings["back in nginx"] = time.monotonic() - start
    assert host.exec(f"systemctl show -p MainPID --value {unit}").stdout.strip() != pid
    assert '"command": "probe"' in host.exec("journalctl --no-pager -o cat -t hosttune").stdout  # not "env"
    assert '"command": "probe"' not in host.exec("journalctl --no-pager -o cat -t env").stdout

    # 4. refusals: one line, exit 2, /etc and /opt as they were
    before = tree_hash(host)
    for extra, message in (
            (("--tensor-parallel", "3"), "--tensor-parallel 3 does not divide /srv/models/tiny-qwen2's 8 attention heads"),
            (("--model", "/srv/models/missing"), "the model folder /srv/models/missing does not exist on the host")):
        result = deploy(inventory, wheelhouse, *extra)
        assert result.exit_code == 2, result.output
        assert len(result.stdout.strip().splitlines()) == 1 and message in result.stdout, result.stdout
        assert tree_hash(host) == before, message
    result = deploy(inventory, wheelhouse, "--set", "bogus-flag=1")  # refused before any host is contacted
    assert result.exit_code == 2 and result.output == (
        "hosttune: --set bogus-flag=1: the bundled engine's serve has no --bogus-flag "
        "(engine/hosttune_engine/server/options.py); fix its name or drop it\n"), result.output
    assert tree_hash(host) == before

    # 5. --rollback rolls the replicas back to the release before, one at a time
    start = time.monotonic()
    result = invoke_deploy("deploy", "--rollback", "--yes", "-i", str(inventory), "--health-timeout", "240")
    timings["rollback"] = time.monotonic() - start
    assert result.exit_code == 0, result.output
    assert result.stdout.split()[1:3] == ["rolled-back", second]
    assert host.exec("readlink /opt/hosttune/current").stdout.strip().endswith(second)
    assert f"/opt/hosttune/releases/{second}/" in host.path("/etc/systemd/system/hosttune-engine@.service").read_text()
    for i in range(2):
        pid = host.exec(f"systemctl show -p MainPID --value hosttune-engine@{i}.service").stdout.strip()
        assert second in host.exec(f"cat /proc/{pid}/cmdline | tr '\\0' ' '").stdout
    assert " down;" not in host.path(SERVERS).read_text()
    complete(port, key)
    with capsys.disabled():
        print("\n  replica timings: " + ", ".join(f"{k} {v:.1f}s" if isinstance(v, float) else f"{k} {v}"
                                              for k, v in timings.items()))


def place_on_gpus(host) -> None:
    """The live release records replica N on stand-in GPU N, as a deploy on a host with two GPUs does."""
    meta = host.path(host.exec("readlink /opt/hosttune/current").stdout.strip()) / ".hosttune" / "replicas.json"
    layout = json.loads(meta.read_text())
    for replica in layout["replicas"]:
        replica["gpus"] = [replica["index"]]
    meta.write_text(json.dumps(layout))


def test_remediate_drains_and_restores_a_replica_under_load_without_a_failed_request(keyed_replicas, tmp_path):
    setup, result, _ = keyed_replicas
    host, port, inventory = setup.host, setup.port, setup.inventory
    assert result.exit_code == 0, result.output
    write_files(host, gpu_files())
    set_faults(host, dmesg=XID_79)
    place_on_gpus(host)

    answered = served(port + 1) + served(port + 2)
    bench = steady_bench(port, tmp_path / "bench", group_key(inventory))
    wait_for("the bench's first requests answered", lambda: served(port + 1) + served(port + 2) >= answered + 4, 30,
             every=0.2)
    started = time.monotonic()
    fixed = runner.invoke(app, ["remediate", "-i", str(inventory), "--yes", "--drain-wait", "30"])
    remediated_s = time.monotonic() - started
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

    time.sleep(RESTORED_LOAD_S)
    out = stop_bench(bench)
    requests = bench_run(tmp_path / "bench")["requests"]
    bad = [(r["outcome"], r["status"], r["error"]) for r in requests if r["outcome"] != "ok" or r["status"] != 200]
    # 2 a second from the bench's first 4 answers until RESTORED_LOAD_S after the restore: the load covered the
    # drain, the reset and the restore, however fast remediate went
    assert len(requests) >= 2 * (remediated_s + RESTORED_LOAD_S) and not bad, (len(requests), bad[:10], out[-2000:])
