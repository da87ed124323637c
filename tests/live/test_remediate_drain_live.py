"""Live: remediation's drain and restore of one replica of the bundled engine (two CPU replicas behind the
host's own nginx, on a real systemd host over SSH) while `hosttune bench` sends a steady rate through
nginx: not one request fails. The drain and restore steps are the ones `hosttune remediate` builds for a
fault on that replica, carried out by the executor with their journals.
"""
from __future__ import annotations

import json
import shutil
import time

import pytest

from hosttune.config.inventory import load_inventory
from hosttune.fleet import profiles
from hosttune.remediate.climb import execute_step
from hosttune.remediate.faults import SERVICE_LADDER, Fault, FaultKind
from hosttune.remediate.rungs import Rung
from hosttune.remediate.steps import LadderOptions, restore_step, step_for
from hosttune.remediate.survey import survey_host
from hosttune.remediate.xid import XidPolicy

from .deploy_setup import MODEL, free_port
from .test_deploy_replicas_live import SERVERS, deploy, group_key, shape, start_bench

pytestmark = [pytest.mark.live, pytest.mark.timeout(1200)]


def test_draining_and_restoring_a_replica_under_load_fails_no_request(live_fleet, fresh_hosts, tmp_path, wheelhouse,
                                                                      tiny_model):
    (host,) = fresh_hosts(["drain"])
    shutil.copytree(tiny_model, host.path(MODEL))
    known = live_fleet.write_known_hosts(tmp_path / "known_hosts", [host])
    port = free_port(3)
    inventory = live_fleet.write_inventory(tmp_path / "inv.yaml", known, [host], user="deploy", become=True,
                                           host_vars={host.name: {"deploy": shape(port)}})
    result = deploy(inventory, wheelhouse)
    assert result.exit_code == 0, result.output
    key = group_key(inventory)
    inv = load_inventory(inventory)
    survey = survey_host(inv.hosts[0], profiles(inv)[host.name], XidPolicy())
    assert [r.index for r in survey.snapshot.replicas] == [0, 1] and survey.snapshot.lb_script
    fault = Fault(FaultKind.UNIT_DOWN, "serve.units", SERVICE_LADDER, "drained for this test", unit="hosttune-engine@1.service")
    drain = step_for(Rung.DRAIN, fault, survey.snapshot, LadderOptions(drain_wait_s=30))
    restore = restore_step(fault, survey.snapshot)

    bench = start_bench(port, key, tmp_path / "bench", 60)
    time.sleep(8)
    ok, error = execute_step(survey, drain, "drain-test-1")
    assert ok, error
    assert f"127.0.0.1:{port + 2} " in host.path(SERVERS).read_text() and host.path(SERVERS).read_text().count(" down;") == 1
    assert host.exec("systemctl is-active hosttune-engine@1.service", check=False).stdout.strip() == "inactive"
    time.sleep(10)  # replica 0 alone serves the rate
    ok, error = execute_step(survey, restore, "drain-test-2")
    assert ok, error
    assert " down;" not in host.path(SERVERS).read_text()
    out, _ = bench.communicate(timeout=300)
    requests = json.loads((tmp_path / "bench" / "results.json").read_text())["runs"][0]["requests"]
    bad = [(r["outcome"], r["status"], r["error"]) for r in requests if r["outcome"] != "ok" or r["status"] != 200]
    assert len(requests) >= 100 and not bad, (bad[:10], out[-2000:])
    journal = json.loads(host.path("/var/lib/hosttune/runs/drain-test-1.json").read_text())
    assert [op["status"] for op in journal["steps"][0]["ops"]] == ["done", "done", "done"]
