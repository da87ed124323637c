"""serve.api_key: the engine-access probe run for real against servers on this machine (one answering
without a key on every interface, one asking for a key, one on loopback only), its output parsed, and the
check's verdicts on those facts."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources

from hosttune.checks import BY_ID
from hosttune.probes.facts import EngineEndpoint, Facts
from hosttune.checks.findings import Status
from hosttune.probes.engine_access import parse_engine_access
from hosttune.probes.gather import parse_probe_output, probe_script
from hosttune.config.profile import load_profile


def _handler(status: int):
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            body = json.dumps({"data": [{"id": "m"}]} if status == 200 else {"error": {"code": status}}).encode()
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    return Handler


@contextmanager
def _server(address: str, status: int):
    server = ThreadingHTTPServer((address, 0), _handler(status))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


def _probe(root) -> str:
    code = resources.files("hosttune.probes").joinpath("engine_access_probe.py").read_text()
    return subprocess.run([sys.executable, "-c", code, str(root)], capture_output=True, text=True, check=True,
                          timeout=60).stdout


def _deployed(root, engine_port: int, nginx_port: int | None = None, replicas: tuple[int, ...] = ()) -> None:
    meta = root / "opt/hosttune/current/.hosttune"
    meta.mkdir(parents=True)
    settings = {"port": engine_port, **({"replicas": [{"index": i, "port": p} for i, p in enumerate(replicas)]}
                                        if replicas else {})}
    (meta / "release.json").write_text(json.dumps({"settings": settings}))
    if nginx_port:
        (root / "etc/nginx/conf.d").mkdir(parents=True)
        (root / "etc/nginx/conf.d/hosttune-local.conf").write_text(
            f"upstream x {{\n    server 127.0.0.1:{engine_port};\n}}\nserver {{\n    listen {nginx_port} ssl default_server;\n}}\n")


def _verdict(endpoints):
    return BY_ID["serve.api_key"].run(Facts(engine_endpoints=endpoints), load_profile("inference-throughput"))


def test_an_engine_answering_anyone_on_every_interface_is_a_finding(tmp_path):
    with _server("0.0.0.0", 200) as port:
        _deployed(tmp_path, port)
        endpoints = parse_engine_access(_probe(tmp_path))
    assert endpoints == (EngineEndpoint("engine", port, "http", ("0.0.0.0",), "200"),)
    finding = _verdict(endpoints)
    assert finding.status is Status.DRIFT and f"engine port {port} answers /v1/models to anyone" in finding.detail
    assert finding.severity.value == "critical" and "deploy.api_key" in finding.remediation


def test_a_keyed_engine_or_one_on_loopback_only_is_ok(tmp_path):
    with _server("0.0.0.0", 401) as keyed, _server("127.0.0.1", 200) as loopback:
        _deployed(tmp_path, loopback, nginx_port=keyed)
        endpoints = parse_engine_access(_probe(tmp_path))
    # the nginx front says https: a plain-http server answers that with an error, which is no 200 either
    assert endpoints[0] == EngineEndpoint("engine", loopback, "http", ("127.0.0.1",), "200")
    assert endpoints[1].role == "nginx" and endpoints[1].port == keyed and endpoints[1].scheme == "https"
    assert _verdict(endpoints).status is Status.OK
    assert _verdict((EngineEndpoint("nginx", 80, "http", ("0.0.0.0",), "401"),)).status is Status.OK


def test_every_replica_port_is_asked_and_one_open_to_all_is_a_finding(tmp_path):
    with _server("127.0.0.1", 200) as first, _server("0.0.0.0", 200) as second, _server("0.0.0.0", 401) as front:
        _deployed(tmp_path, front, nginx_port=front, replicas=(first, second))
        endpoints = parse_engine_access(_probe(tmp_path))
    engines = [e for e in endpoints if e.role == "engine"]
    assert [(e.port, e.listen) for e in engines] == [(first, ("127.0.0.1",)), (second, ("0.0.0.0",))]
    finding = _verdict(endpoints)
    assert finding.status is Status.DRIFT and finding.detail.startswith(f"engine port {second} answers /v1/models")


def test_nothing_deployed_is_not_applicable(tmp_path):
    assert _probe(tmp_path) == ""
    assert _verdict(()).status is Status.NOT_APPLICABLE
    assert _verdict(None).status is Status.NOT_APPLICABLE


def test_ipv6_listeners_count_as_exposed_unless_loopback():
    assert EngineEndpoint("engine", 1, "http", ("0000:0000:0000:0000:0000:0000:0000:0000",), "200").is_exposed
    assert not EngineEndpoint("engine", 1, "http", ("0000:0000:0000:0000:0000:0000:0000:0001",), "200").is_exposed
    assert not EngineEndpoint("engine", 1, "http", ("127.0.0.1",), "200").is_exposed


def test_the_probe_script_runs_the_access_probe_where_an_engine_is_deployed(tmp_path):
    script = probe_script().decode()
    assert "HOSTTUNE_ACCESS_PROBE='" in script and "sec engine-access" in script
    text = "@@ht:meta\nhostname:h\n@@ht-end:meta:0\n@@ht:engine-access\n" + \
           '{"role": "engine", "port": 8000, "scheme": "http", "listen": ["0.0.0.0"], "status": "200"}\n' + \
           "@@ht-end:engine-access:0\n"
    facts = parse_probe_output(text)
    assert facts.engine_endpoints == (EngineEndpoint("engine", 8000, "http", ("0.0.0.0",), "200"),)
