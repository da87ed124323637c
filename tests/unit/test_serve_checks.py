"""serve.units, serve.health, serve.front: the serve probe run for real against stand-in engines on this
machine (and its unit lines as recorded on a real systemd host), parsed, and the checks' verdicts."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from standin_engine import serve
from hosttune.checks import BY_ID
from hosttune.checks.findings import Status
from hosttune.config.profile import load_profile
from hosttune.probes.facts import Facts
from hosttune.probes.facts_serve import ServeFacts, UnitHealth
from hosttune.probes.gather import embedded, parse_probe_output, probe_script
from hosttune.probes.serve_health import parse_serve

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "serve"
PROFILE = load_profile("inference-latency")


def _probe(root: Path) -> str:
    return subprocess.run([sys.executable, "-c", embedded("serve_probe.py"), str(root)], capture_output=True,
                          text=True, check=True, timeout=60).stdout


def _release(root: Path, settings: dict, units=("hosttune-serve.service",)) -> None:
    meta = root / "opt/hosttune/current/.hosttune"
    meta.mkdir(parents=True)
    (meta / "release.json").write_text(json.dumps({"id": "custom-abc", "engine": "custom", "units": list(units),
                                                   "settings": settings}))


def _front(root: Path, listen: int, servers: str) -> None:
    (root / "etc/nginx/conf.d").mkdir(parents=True)
    (root / "etc/hosttune/nginx").mkdir(parents=True)
    (root / "etc/hosttune/nginx/local-servers.conf").write_text(servers)
    (root / "etc/nginx/conf.d/hosttune-local.conf").write_text(
        "upstream u {\n    least_conn;\n    include /etc/hosttune/nginx/local-servers.conf;\n}\n"
        f"server {{\n    listen {listen} default_server;\n}}\n")


def _run(check_id: str, serve_facts: ServeFacts | None, pid1: str = "systemd"):
    return BY_ID[check_id].run(Facts(pid1=pid1, serve=serve_facts), PROFILE)


@pytest.fixture
def engines():
    servers = [serve(0), serve(0, health_status=503)]
    yield [s.server_address[1] for s in servers]
    for s in servers:
        s.shutdown()
        s.server_close()


def test_a_serving_engine_generates_one_token_and_a_warming_one_is_a_finding(tmp_path, engines):
    good, warming = engines
    _release(tmp_path, {"port": 9, "replicas": [{"index": 0, "port": good}, {"index": 1, "port": warming}]},
             units=("hosttune-engine@.service", "hosttune-probe.service", "hosttune-probe.timer"))
    facts = parse_serve(_probe(tmp_path))
    assert facts.release == "custom-abc" and facts.engine == "custom"
    first, second = facts.endpoints
    assert (first.role, first.port, first.health, first.generation) == ("replica 0", good, "200", "ok")
    assert first.is_serving and first.seconds is not None and first.timeout_s == 20.0
    assert (second.health, second.generation, second.is_serving) == ("503", "not tried", False)
    finding = _run("serve.health", facts)
    assert finding.status is Status.DRIFT and finding.subjects == ("replica 1",)
    assert f"replica 1 port {warming}: /health 503" in finding.detail


def test_the_front_names_a_drained_server_and_one_refusing_connections(tmp_path, engines):
    good, _ = engines
    _release(tmp_path, {"port": good})
    _front(tmp_path, good, f"server 127.0.0.1:{good} max_fails=3 fail_timeout=10s;\n"
                           "server 127.0.0.1:1 max_fails=3 fail_timeout=10s;\n"
                           f"server 127.0.0.1:{good} max_fails=3 fail_timeout=10s down;\n")
    facts = parse_serve(_probe(tmp_path))
    assert [(u.server, u.down, u.reachable) for u in facts.upstreams] == [
        (f"127.0.0.1:{good}", False, True), ("127.0.0.1:1", False, False), (f"127.0.0.1:{good}", True, True)]
    assert [(f.port, f.health) for f in facts.fronts] == [(good, "200")]
    finding = _run("serve.front", facts)
    assert finding.status is Status.DRIFT and "upstream 127.0.0.1:1 refuses connections" in finding.detail
    assert "marked down" in finding.detail and finding.active == "1 port(s), 1/3 upstream servers in service"
    assert _run("serve.health", facts).status is Status.OK


def test_nothing_deployed_prints_nothing_and_every_serve_check_is_not_applicable(tmp_path):
    assert _probe(tmp_path) == ""
    for check_id in ("serve.units", "serve.health", "serve.front"):
        assert _run(check_id, None).status is Status.NOT_APPLICABLE
        assert _run(check_id, ServeFacts()).status is Status.NOT_APPLICABLE


def test_a_stopped_unit_recorded_on_a_systemd_host_is_a_finding_naming_it_with_its_journal():
    facts = parse_serve((FIXTURES / "stopped-unit.jsonl").read_text())
    finding = _run("serve.units", facts)
    assert finding.status is Status.DRIFT and finding.subjects == ("hosttune-serve.service",)
    assert "hosttune-serve.service is inactive/dead" in finding.detail and "journal: " in finding.detail
    assert "Stopped" in finding.detail
    running = replace(facts, units=tuple(replace(u, active="active", sub="running", journal=()) for u in facts.units))
    assert _run("serve.units", running).status is Status.OK
    assert _run("serve.units", facts, pid1="init").status is Status.NOT_APPLICABLE


def test_a_oneshot_probe_between_runs_is_running_and_a_failed_one_is_not():
    probe = UnitHealth("hosttune-probe.service", "loaded", "inactive", "dead", "success", "oneshot")
    assert probe.is_running and not replace(probe, active="failed", result="exit-code").is_running
    assert replace(probe, active="failed", result="exit-code").state == "failed/dead (exit-code)"
    assert not UnitHealth("x.service", "not-found", "inactive", "dead").is_running


def test_a_deployment_whose_units_cannot_be_read_is_an_error():
    assert _run("serve.units", ServeFacts(release="r")).status is Status.ERROR


def test_the_probe_script_runs_the_serve_probe_with_its_key_reader_in_front():
    script = probe_script().decode()
    assert "HOSTTUNE_SERVE_PROBE=" in script and "sec serve python3" in script and "def read_key" in embedded("serve_probe.py")
    text = "@@ht:meta\nhostname:h\n@@ht-end:meta:0\n@@ht:serve\n" + (FIXTURES / "stopped-unit.jsonl").read_text() + \
           "@@ht-end:serve:0\n"
    assert parse_probe_output(text).serve.units[0].name == "hosttune-serve.service"


def test_an_unreadable_serve_line_is_a_probe_error():
    facts = parse_probe_output("@@ht:meta\nhostname:h\n@@ht-end:meta:0\n@@ht:serve\n{\"kind\": \"unit\"}\n@@ht-end:serve:0\n")
    assert facts.serve is None and facts.probe_errors[0].startswith("serve: unreadable serve line")


def test_a_key_the_probe_cannot_read_is_an_error_not_a_dead_engine(tmp_path, engines):
    good, _ = engines
    key = tmp_path / "key.env"
    key.write_text("HOSTTUNE_API_KEY=s3cret\n")
    _release(tmp_path, {"port": good, "api_key": {"file": str(key)}})
    assert _run("serve.health", parse_serve(_probe(tmp_path))).status is Status.OK
    key.unlink()
    facts = parse_serve(_probe(tmp_path))
    assert facts.endpoints[0].health.startswith("error: key unreadable")
    finding = _run("serve.health", facts)
    assert finding.status is Status.ERROR and "check as root" in finding.detail
