"""deploy.router as data: the router's unit and scripts and the host's nginx in front of it, rendered
from the recorded 4-GPU A100 facts; the operations that start it (or leave it running) and take it
away; replica_lb.py keeping a real HTTP router's workers in step with the replicas."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from urllib.parse import parse_qs, urlparse

import pytest

from hosttune.actions.base import Command, Remove
from hosttune.deploy.errors import DeployError
from hosttune.deploy.placement import LayoutRequest, plan_layout
from hosttune.deploy.replicas import NGINX_CONF, REPLICAS_JSON, SCRAPE_FILE, make_layout_release
from hosttune.deploy.rolling import switch_ops
from hosttune.deploy.router import scripts_digest
from hosttune.deploy.settings import inventory_vars, parse_sets, resolve
from hosttune.deploy.state import parse_state
from hosttune.deploy.units import ROUTER_UNIT
from hosttune.presets import load_preset, load_router

from deploy_fixtures import a100_facts, fake_entry, inventory
from test_deploy_replicas import QWEN_7B, replica_lb

def entry_of(tmp_path, engine="custom"):
    return fake_entry(tmp_path / "wh", engine, archs=() if engine == "custom" else ("8.0",),
                      cuda=None if engine == "custom" else "12.4")


def router_release(tmp_path, engine="custom", gpus="0-3", sets=()):
    host = replace(inventory(tmp_path).hosts[0], deploy={})  # the presets' own flags
    preset = load_preset(engine)
    settings = replace(resolve(host, preset, QWEN_7B.path, None, parse_sets(list(sets))), router=True)
    layout = plan_layout(LayoutRequest(gpus), a100_facts(), QWEN_7B, host.name, settings.port)
    return make_layout_release(preset, settings, layout, entry_of(tmp_path, engine), host.name)


def test_the_router_unit_runs_the_live_releases_router_on_loopback_after_the_replicas(tmp_path):
    release = router_release(tmp_path)
    assert list(release.units) == ["hosttune-engine@.service", "hosttune-probe.service", "hosttune-probe.timer", ROUTER_UNIT]
    unit = release.units[ROUTER_UNIT].decode()
    assert ("ExecStart=/usr/bin/env /opt/hosttune/current/bin/python /opt/hosttune/current/.hosttune/prefix_router.py "
            "--host 127.0.0.1 --port 8005 --policy prefix_affinity --prometheus-host 127.0.0.1 --prometheus-port 8006 "
            "--health-check-endpoint /health --prefix-chars 256 --health-check-interval-secs 2 "
            "--health-failure-threshold 2 --request-timeout-secs 3600 --log-level warning\n") in unit
    assert "ExecStartPost=-/usr/bin/env python3 /opt/hosttune/current/.hosttune/replica_lb.py sync\n" in unit
    assert release.id not in unit  # the same text for every release: an engine redeploy leaves it running
    assert f"router scripts {scripts_digest(load_router())})" in unit  # new scripts: a new text, a restart
    assert release.settings["router"] == {"policy": "prefix_affinity", "port": 8005}
    for name in ("prefix_router.py", "prefix_table.py"):  # beside replica_lb.py, as hosttune ships them
        assert release.meta[name].decode() == resources.files("hosttune.deploy").joinpath(name).read_text()
    assert f"{release.dir}/bin/python" in release.programs
    lb = json.loads(release.meta[REPLICAS_JSON])
    assert lb["router"] == "http://127.0.0.1:8005" and lb["health"] == "/health"
    targets = json.loads(release.files[SCRAPE_FILE])
    assert targets[-1] == {"targets": ["127.0.0.1:8006"], "labels": {"job": "hosttune-router", "host": "gpu-a",
                                                                     "engine": "custom"}}


def test_nginx_sends_everything_to_the_router_and_keeps_its_admin_api_on_the_host(tmp_path):
    conf = router_release(tmp_path).files[NGINX_CONF].decode()
    for line in ("server 127.0.0.1:8005 max_fails=3 fail_timeout=10s;", "listen 8000 default_server;",
                 "location ~ ^/(add_worker|remove_worker|list_workers)(/|$) {", "return 404;", "proxy_buffering off;",
                 # tokenizing goes to the replicas themselves: it is no generation, its prompt no prefix to place
                 "location ~ ^/(tokenize|detokenize)$ {", "proxy_pass http://hosttune_local_direct;",
                 "server 127.0.0.1:8004 max_fails=1 fail_timeout=5s;", "proxy_next_upstream_tries 4;"):
        assert line in conf
    assert "include /etc/hosttune/nginx/local-servers.conf" not in conf
    assert conf.count("server 127.0.0.1:") == 5  # the router, and the 4 replicas for tokenizing


def test_custom_replicas_behind_the_router_cache_prefixes_in_the_cache_they_are_given(tmp_path):
    """The bundled engine's replicas get prefix caching from the preset and the cache shape from the inventory
    as written: nothing the router adds turns caching off or changes the blocks a prefix needs."""
    release = router_release(tmp_path, sets=("device=cpu", "num-kv-blocks=72", "block-size=16"))
    exec_start = next(line for line in release.units["hosttune-engine@.service"].decode().splitlines()
                      if line.startswith("ExecStart="))
    assert exec_start.endswith(" serve --model /models/qwen2.5-7b --host 127.0.0.1 --port ${HOSTTUNE_PORT} "
                               "--device cpu --shutdown-timeout 30 --enable-prefix-caching --num-kv-blocks 72 "
                               "--block-size 16"), exec_start


def test_vllm_and_sglang_replicas_behind_the_router_keep_their_health_path_and_prefix_caching(tmp_path):
    vllm = router_release(tmp_path / "v", "vllm")
    assert "--enable-prefix-caching" in vllm.units["hosttune-engine@.service"].decode()
    assert "--health-check-endpoint /health" in vllm.units[ROUTER_UNIT].decode()
    sglang = router_release(tmp_path / "s", "sglang")
    assert "--disable-radix-cache" not in sglang.units["hosttune-engine@.service"].decode()
    assert "--schedule-policy lpm" in sglang.units["hosttune-engine@.service"].decode()


def test_the_router_script_runs_from_the_release_as_its_unit_runs_it(tmp_path):
    """The shipped scripts beside each other, with no hosttune to import: the router answers its admin API."""
    release = router_release(tmp_path)
    meta = tmp_path / "meta"
    meta.mkdir()
    for name in ("prefix_router.py", "prefix_table.py"):
        (meta / name).write_bytes(release.meta[name])
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-E", str(meta / "prefix_router.py"), "--port", str(port),
                             "--worker-urls", "http://127.0.0.1:9"], stderr=subprocess.PIPE)
    try:
        urls = wait_for_json(f"http://127.0.0.1:{port}/list_workers")
    finally:
        proc.kill()
        proc.wait()
    assert urls == {"urls": ["http://127.0.0.1:9"]}
    bad = subprocess.run([sys.executable, "-E", str(meta / "prefix_router.py"), "--prefix-chars", "0"],
                         capture_output=True, text=True, timeout=30)
    assert bad.returncode == 2 and bad.stderr.splitlines()[-1].endswith(
        "error: --prefix-chars and --max-keys take a count of at least 1")


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_json(url: str, seconds: float = 10.0):
    import time
    import urllib.request

    deadline = time.monotonic() + seconds
    while True:
        try:
            return json.loads(urllib.request.urlopen(url, timeout=2).read())
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def test_one_replica_needs_no_router(tmp_path):
    release = router_release(tmp_path, gpus="0")
    assert ROUTER_UNIT not in release.units and "router" not in release.settings


def test_deploy_router_is_true_or_false_in_the_inventory(tmp_path):
    host = inventory(tmp_path).hosts[0]
    assert inventory_vars(replace(host, deploy={"router": True}))["router"] is True
    with pytest.raises(DeployError, match="deploy.router must be true or false"):
        inventory_vars(replace(host, deploy={"router": "yes"}))


def argvs(ops):
    return [op.argv if isinstance(op, Command) else ("rm", op.path) if isinstance(op, Remove) else None for op in ops]


def router_state(release, sha: bool, active: str) -> str:
    import hashlib

    digest = hashlib.sha256(release.units[ROUTER_UNIT]).hexdigest() if sha else "0" * 64
    running = "".join(f"instance:hosttune-engine@{i}.service active\n" for i in range(4))
    return f"current:/opt/hosttune/releases/custom-old\nunit:{ROUTER_UNIT} {digest} {active}\n{running}"


def test_the_router_starts_before_nginx_reloads_and_restarts_only_when_its_unit_changed(tmp_path):
    release = router_release(tmp_path)
    first = argvs(switch_ops(release, parse_state("")))
    start = first.index(("systemctl", "restart", ROUTER_UNIT))
    assert first[start - 1] == ("systemctl", "enable", "--quiet", ROUTER_UNIT)
    assert first.index(("systemctl", "daemon-reload")) < start < first.index(("nginx", "-t", "-q")) \
        < first.index(("systemctl", "reload-or-restart", "nginx.service"))
    same = argvs(switch_ops(release, parse_state(router_state(release, True, "active"))))
    assert ("systemctl", "start", ROUTER_UNIT) in same and ("systemctl", "restart", ROUTER_UNIT) not in same
    changed = argvs(switch_ops(release, parse_state(router_state(release, False, "active"))))
    assert ("systemctl", "restart", ROUTER_UNIT) in changed


def test_leaving_the_router_points_nginx_at_the_replicas_before_the_router_stops(tmp_path):
    with_router = router_release(tmp_path / "r")
    inv = inventory(tmp_path / "n")
    preset = load_preset("custom")
    settings = resolve(inv.hosts[0], preset, QWEN_7B.path, None, parse_sets([]))
    layout = plan_layout(LayoutRequest("0-3"), a100_facts(), QWEN_7B, "gpu-a", settings.port)
    plain = make_layout_release(preset, settings, layout, entry_of(tmp_path / "n"), "gpu-a")
    ops = argvs(switch_ops(plain, parse_state(router_state(with_router, True, "active"))))
    assert ops[-4:] == [("nginx", "-t", "-q"), ("systemctl", "reload-or-restart", "nginx.service"),
                        ("systemctl", "disable", "--now", ROUTER_UNIT), ("rm", f"/etc/systemd/system/{ROUTER_UNIT}")]
    assert not any(op and ROUTER_UNIT in op for op in argvs(switch_ops(plain, parse_state(""))))


class Router(BaseHTTPRequestHandler):
    """The router's admin API as replica_lb.py uses it: /list_workers, /add_worker, /remove_worker."""

    workers: set = set()
    calls: list = []

    def _send(self, status, body: bytes):
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        if self.path == "/list_workers":
            return self._send(200, json.dumps({"urls": sorted(self.workers)}).encode())
        self._send(200 if self.path == "/health" else 404, b"ok")  # the replicas' /health, on the same server

    def do_POST(self):
        url = urlparse(self.path)
        worker = parse_qs(url.query)["url"][0]
        self.calls.append((url.path, worker))
        (self.workers.add if url.path == "/add_worker" else self.workers.discard)(worker)
        self._send(200, b"done")

    def log_message(self, *args):
        pass


@pytest.fixture
def router_server():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Router)
    Router.workers, Router.calls = set(), []
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


def test_replica_lb_takes_replicas_out_of_the_router_and_back_once_healthy(tmp_path, router_server):
    port = router_server
    healthy = f"http://127.0.0.1:{port}"  # answers /health 200
    replicas = [{"index": 0, "port": port}, {"index": 1, "port": 1}]  # nothing listens on port 1
    lb = replica_lb(tmp_path, replicas, router=healthy, health="/health")
    Router.workers.add("http://127.0.0.1:9")  # a port no replica has any more (a smaller layout)
    assert lb("sync") == {"ok": True, "command": "sync", "changed": True}
    assert Router.workers == {healthy}  # replica 1 does not answer /health: not added, the router would wait for it
    assert lb("out", "0")["changed"] and Router.workers == set()
    assert lb("sync")["changed"] is False  # drained stays out
    assert lb("in", "0")["changed"] and Router.workers == {healthy}
    assert Router.calls == [("/remove_worker", "http://127.0.0.1:9"), ("/add_worker", healthy),
                            ("/remove_worker", healthy), ("/add_worker", healthy)]
    assert not (tmp_path / "calls").exists() and not (tmp_path / "servers.conf").exists()  # nginx left alone


def test_replica_lb_says_so_when_the_router_does_not_answer(tmp_path):
    lb = replica_lb(tmp_path, [{"index": 0, "port": 1}], router="http://127.0.0.1:1")
    script = (tmp_path / "replica_lb.py").read_text().replace("ROUTER_WAIT_S = 60.0", "ROUTER_WAIT_S = 0.5")
    (tmp_path / "replica_lb.py").write_text(script)
    out = lb("sync")
    assert out["ok"] is False and "Connection refused" in out["error"]


@pytest.mark.skipif(shutil.which("nginx") is None and os.environ.get("HOSTTUNE_REQUIRE_LIVE") != "1",
                    reason="nginx not installed (scripts/test.sh installs nginx-light as root)")
def test_the_front_over_the_router_passes_nginx_t(tmp_path):
    conf = tmp_path / "hosttune-local.conf"
    conf.write_bytes(router_release(tmp_path / "inv").files[NGINX_CONF])
    (tmp_path / "logs").mkdir()
    main = tmp_path / "nginx.conf"
    main.write_text(f"pid {tmp_path}/nginx.pid;\nerror_log {tmp_path}/logs/error.log;\nevents {{}}\n"
                    f"http {{\n    access_log {tmp_path}/logs/access.log;\n    include {conf};\n}}\n")
    result = subprocess.run(["nginx", "-t", "-p", str(tmp_path), "-c", str(main)], capture_output=True, text=True)
    assert result.returncode == 0 and "test is successful" in result.stderr, result.stderr


def test_the_router_and_its_metrics_ports_are_checked_free_or_the_routers_own(tmp_path):
    from types import SimpleNamespace

    from hosttune.actions.needs import NeedPort
    from hosttune.deploy.access import Access
    from hosttune.deploy.preconditions import serve_needs

    release = router_release(tmp_path)
    layout = plan_layout(LayoutRequest("0-3"), a100_facts(), QWEN_7B, "gpu-a", 8000)
    job = SimpleNamespace(settings=SimpleNamespace(port=8000), layout=layout, access=Access(), model=None,
                          release=release)
    ports = {n.port: n for n in serve_needs(job, parse_state('')) if isinstance(n, NeedPort)}
    assert sorted(ports) == [8000, 8001, 8002, 8003, 8004, 8005, 8006]
    assert ROUTER_UNIT in ports[8005].owners


def test_a_tls_front_stays_nginx_with_the_router_behind_it(tmp_path):
    from pathlib import Path

    from hosttune.deploy.access import Access, Front, Tls

    host = replace(inventory(tmp_path).hosts[0], deploy={})
    preset = load_preset("custom")
    settings = replace(resolve(host, preset, QWEN_7B.path, None, parse_sets([])), router=True)
    layout = plan_layout(LayoutRequest("0-3"), a100_facts(), QWEN_7B, host.name, settings.port)
    access = Access("prod", "ht-0123456789abcdef0123", Front(443, Tls(Path("c.pem"), Path("k.pem"))))
    release = make_layout_release(preset, settings, layout, entry_of(tmp_path), host.name, access)
    conf = release.files[NGINX_CONF].decode()
    assert "listen 443 ssl default_server;" in conf and "ssl_certificate /etc/hosttune/tls/prod.crt;" in conf
    assert "server 127.0.0.1:8005 max_fails=3 fail_timeout=10s;" in conf
    assert "EnvironmentFile=/etc/hosttune/keys/prod.env" in release.units["hosttune-engine@.service"].decode()
    assert "prod" not in release.units[ROUTER_UNIT].decode()  # the router never holds the key
