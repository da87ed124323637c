"""Live: two keyed CPU replicas of the bundled engine behind the prefix router (deploy.router)
behind the host's nginx, on a real systemd host over SSH, the router's scripts shipped in the
release and run by its python.

- A shared-prefix workload (7 system prompts of 200 tokens, 4 requests a second) through nginx: the
  replicas' own prefix-cache counters show at least 80% of the prefix tokens they were sent found in
  the cache, counted once each prompt's first request has been looked up (each replica keeps 60
  blocks of 16 tokens: the 12 full blocks of five of the seven prompts; the router splits them 4 and 3).
- Killing one replica under that load fails at most the requests it held; the probe takes it out
  of the router (the load goes on a few seconds more, all of it on the other replica) and puts it back
  once systemd has restarted it.
- A rolling redeploy to a new release under 6 closed-loop users on 3 of the prompts (a bench that runs
  until the roll is done) fails no request, and leaves the router running (its unit is
  the same text).
- Back to nginx's least_conn (--no-router): the same workload finds far fewer prefixes cached, as
  every replica sees every system prompt and keeps only some of them.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from .deploy_setup import (MODEL, QUICK_START, REPO, complete, deploy, group_key, replica_host, status, under_load,
                           wait_for)
from .steady_bench import LONGEST_S, bench_run, stop_bench

pytestmark = [pytest.mark.live, pytest.mark.timeout(900), pytest.mark.live_seconds(140)]
NUM_REPLICAS = 2
PREFIX_TOKENS = 200


def shape(port: int) -> dict:
    return {"engine": "custom", "model": MODEL, "replicas": NUM_REPLICAS, "port": port, "router": True,
            "custom": {"device": "cpu", "max-batch-size": 8, "num-kv-blocks": 60, "block-size": 16, **QUICK_START},
            "health_timeout": 240, "warmup": 1, "probe_interval": 2, "api_key": True}


# Closed loop: 6 users on 3 system prompts, each user sending again as its answer comes.
USERS = ("--shared-prefix", "3x2")
# Open loop: 4 requests a second on 7 system prompts in turn, as independent callers would send them. (A
# closed-loop user's next request tends to land where its last one ended under least_conn too.)
ARRIVALS = ("--shared-prefix", "7x2", "--rate", "4")


def start_bench(port: int, key: str, out: Path, seconds: int, load: tuple[str, ...]) -> subprocess.Popen:
    """`hosttune bench --shared-prefix` in its own process, through the host's nginx."""
    argv = [sys.executable, "-m", "hosttune", "bench", "--url", f"http://127.0.0.1:{port}", "--api-key", key,
            *load, "--prefix-tokens", str(PREFIX_TOKENS), "--prompts", "uniform:8-16",
            "--max-tokens", "4", "--duration", f"{seconds}s", "--warmup", "0s", "--timeout", "120s",
            "--max-client-lag", "1s", "--out", str(out)]
    path = os.pathsep.join([str(REPO), str(REPO / "engine"), os.environ.get("PYTHONPATH", "")])
    return subprocess.Popen(argv, env={**os.environ, "PYTHONPATH": path}, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def counters(ports) -> dict[str, float]:
    """Summed over the replicas' own /metrics: prompt tokens found in the prefix cache, and looked up."""
    names = {"hits": "vllm:prefix_cache_hits_total", "queries": "vllm:prefix_cache_queries_total"}
    totals = dict.fromkeys(names, 0.0)
    for port in ports:
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
        for key, name in names.items():
            totals[key] += sum(float(m) for m in re.findall(rf"^{re.escape(name)}(?:{{[^}}]*}})? (\S+)$", text, re.M))
    return totals


def cold_start_done(ports, since: dict[str, float]) -> dict[str, float] | None:
    """The replicas' counters once they have looked up, since `since`, at least as many prompt tokens as the first
    request of each of the 7 system prompts holds at most (the bench sends them in turn), else None."""
    totals = counters(ports)
    return totals if totals["queries"] - since["queries"] >= 7 * (PREFIX_TOKENS + 16) else None


def routed(router_port: int) -> dict[str, float]:
    """Requests the router sent to each replica, from its own /metrics."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{router_port + 1}/metrics", timeout=10).read().decode()
    pattern = r'^hosttune_router_requests_total[{]worker="([^"]+)"[}] (\S+)$'
    return {url: float(n) for url, n in re.findall(pattern, text, re.M)}


def prefix_share(before: dict, after: dict, requests: list[dict]) -> float:
    """Prefix tokens found in the cache over the prefix tokens the replicas looked up: of each prompt's
    tokens (the replicas count them as they look them up), the system prompt's share."""
    lengths = [r["reported_prompt_tokens"] for r in requests if r["outcome"] == "ok"]
    prefix_tokens = (after["queries"] - before["queries"]) * PREFIX_TOKENS / (sum(lengths) / len(lengths))
    return (after["hits"] - before["hits"]) / prefix_tokens


def router_workers(port: int) -> set[str]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/list_workers", timeout=10) as r:
        return set(json.loads(r.read())["urls"])


# Inside the host, so nothing reaches the replica between the reading and the kill.
KILL = """import os, re, sys, urllib.request
text = urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/metrics", timeout=10).read().decode()
held = sum(float(v) for v in re.findall(r"^vllm:num_requests_(?:running|waiting)(?:[{][^}]*[}])? (\\S+)$", text, re.M))
os.kill(int(sys.argv[2]), 9)
print(int(held))
"""


def main_pid(host, unit: str) -> str:
    return host.exec(f"systemctl show -p MainPID --value {unit}").stdout.strip()


def test_the_router_keeps_prefixes_on_their_replica_and_rolls_without_losing_a_request(
        live_fleet, fresh_hosts, tmp_path, wheelhouse, tiny_model, capsys):
    # ports for nginx, the replicas, the router and its metrics
    setup = replica_host(live_fleet, fresh_hosts, tmp_path, tiny_model, "router", shape, num_ports=NUM_REPLICAS + 3)
    host, port, inventory = setup.host, setup.port, setup.inventory
    replica_ports = [port + 1 + i for i in range(NUM_REPLICAS)]
    router_port = port + NUM_REPLICAS + 1
    timings = {}

    # 1. three replicas, the router on the port after them, nginx in front; the router's scripts came with the release
    start = time.monotonic()
    result = deploy(inventory, wheelhouse)
    timings["first deploy"] = time.monotonic() - start
    assert result.exit_code == 0, result.output
    assert host.exec("systemctl is-active hosttune-router.service nginx.service").stdout.split() == ["active", "active"]
    assert host.exec("ls /opt/hosttune/current/.hosttune/prefix_router.py /opt/hosttune/current/.hosttune/prefix_table.py"
                     ).returncode == 0
    assert router_workers(router_port) == {f"http://127.0.0.1:{p}" for p in replica_ports}
    key = group_key(inventory)
    assert (status(port, None), status(port, key)) == (401, 200)  # the replicas check the key behind the router
    with pytest.raises(urllib.error.HTTPError, match="404"):  # the router's admin API stays on the host
        urllib.request.urlopen(urllib.request.Request(f"http://127.0.0.1:{port}/remove_worker?url=x", method="POST"))
    complete(port, key)
    scrape = json.loads(host.path("/etc/hosttune/prometheus/hosttune-replicas.json").read_text())
    assert scrape[-1]["targets"] == [f"127.0.0.1:{router_port + 1}"]

    # 2. the shared-prefix workload: prefixes hit on their replica; then one replica killed under it
    base = counters(replica_ports)
    bench = start_bench(port, key, tmp_path / "shared", LONGEST_S, ARRIVALS)
    # counted from once every system prompt has been looked up (its first, cold, request admitted), however
    # long a loaded host takes to start
    before = wait_for("the first request of every system prompt admitted",
                      lambda: cold_start_done(replica_ports, base), 30, every=0.2)
    time.sleep(12)
    after = counters(replica_ports)
    # should the share fall short: what each replica looked up and found, and what the router sent where
    spread = {**{p: counters([p]) for p in replica_ports}, "routed": routed(router_port)}
    held = int(host.exec(["python3", "-c", KILL, str(replica_ports[1]),
                          main_pid(host, "hosttune-engine@1.service")]).stdout)
    start = time.monotonic()
    wait_for("the probe takes the killed replica out of the router",
             lambda: f"http://127.0.0.1:{replica_ports[1]}" not in router_workers(router_port), 30, every=0.2)
    timings["out of the router"] = time.monotonic() - start
    time.sleep(3)  # the load goes on with the killed replica out: all of it on the other one
    stop_bench(bench)
    requests = bench_run(tmp_path / "shared")["requests"]
    router_share = prefix_share(before, after, requests)
    timings["router: prefix tokens hit"] = f"{router_share:.0%}"
    assert router_share >= 0.8, f"{router_share:.0%} of prefix tokens hit; {spread}"
    failed = [(r["status"], r["error"]) for r in requests if r["outcome"] != "ok"]
    timings["killed replica held / failed"] = f"{held} / {len(failed)}"
    assert len(failed) <= held, failed
    wait_for("the probe puts the restarted replica back into the router",
             lambda: f"http://127.0.0.1:{replica_ports[1]}" in router_workers(router_port)
             and int(host.exec("systemctl show -p NRestarts --value hosttune-engine@1.service").stdout) >= 1, 120)
    timings["back in the router"] = time.monotonic() - start

    # 3. a rolling redeploy to a new release under the same load: every request answered, the router left running
    router_pid = main_pid(host, "hosttune-router.service")
    sent = sum(routed(router_port).values())
    bench = start_bench(port, key, tmp_path / "roll", LONGEST_S, USERS)
    wait_for("every user's first request routed", lambda: sum(routed(router_port).values()) >= sent + 6, 30, every=0.2)
    result, timings["rolling redeploy"], requests = under_load(
        lambda: deploy(inventory, wheelhouse, "--set", "max-queue=32"), bench, tmp_path / "roll")
    assert result.exit_code == 0, result.output
    bad = [(r["outcome"], r["status"], r["error"]) for r in requests if r["outcome"] != "ok" or r["status"] != 200]
    assert len(requests) >= 100 and not bad, bad[:10]
    timings["requests during the roll, all 200"] = len(requests)
    assert main_pid(host, "hosttune-router.service") == router_pid

    # 4. back to nginx's least_conn: every replica sees every system prompt, and few are still cached
    result = deploy(inventory, wheelhouse, "--no-router")
    assert result.exit_code == 0, result.output
    assert host.exec("systemctl is-active hosttune-router.service", check=False).stdout.strip() != "active"
    assert not host.path("/etc/systemd/system/hosttune-router.service").exists()
    base = counters(replica_ports)
    bench = start_bench(port, key, tmp_path / "least_conn", LONGEST_S, ARRIVALS)
    before = wait_for("the first request of every system prompt admitted",
                      lambda: cold_start_done(replica_ports, base), 30, every=0.2)
    time.sleep(10)
    after = counters(replica_ports)
    stop_bench(bench)
    least_conn_share = prefix_share(before, after, bench_run(tmp_path / "least_conn")["requests"])
    timings["least_conn: prefix tokens hit"] = f"{least_conn_share:.0%}"
    with capsys.disabled():
        print("\n  router timings: " + ", ".join(f"{k} {v:.1f}s" if isinstance(v, float) else f"{k} {v}"
                                             for k, v in timings.items()))
    # each replica's cache holds 5 of the 7 prompts, and under least_conn each sees all 7 in turn
    assert least_conn_share < router_share, timings
