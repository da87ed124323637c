"""`hosttune verify`: the testinfra suite over real SSH (ssh client, host keys checked, sudo for a non-root user)."""
from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest
from typer.testing import CliRunner

from hosttune.cli import app

pytestmark = pytest.mark.live
runner = CliRunner()
VARS = {"pins": {"python": "3.11"}, "tune": {"cuda": {"toolkit": None}}}


def cases(junit) -> dict[str, str]:
    """{test name: 'passed' | 'failed' | 'skipped' | 'error'} from a JUnit XML report."""
    out = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        kinds = [child.tag for child in case if child.tag in ("failure", "skipped", "error")]
        out[case.get("name")] = {"failure": "failed"}.get(kinds[0], kinds[0]) if kinds else "passed"
    return out


def test_verify_checks_host_keys_fails_before_apply_and_passes_after(fresh_hosts, live_fleet, tmp_path):
    (host,) = fresh_hosts(["vhost"])
    known = tmp_path / "known_hosts"
    known.write_text("")
    inv = live_fleet.write_inventory(tmp_path / "inv.yaml", known, [host], user="deploy", become=True,
                                     host_vars={"vhost": VARS})
    junit = tmp_path / "verify.xml"

    result = runner.invoke(app, ["verify", "-i", str(inv), "--junit-xml", str(junit)])
    assert result.exit_code == 2 and not junit.exists()  # unknown host key: nothing ran
    assert result.output.count("\n") == 1 and "unknown SSH host key" in result.output, result.output
    assert known.read_text() == ""

    result = runner.invoke(app, ["verify", "-i", str(inv), "--junit-xml", str(junit), "--accept-new-host-keys"])
    before = cases(junit)
    assert result.exit_code == 1 and before["test_irqbalance[ssh://vhost]"] == "failed"
    assert before["test_numactl[ssh://vhost]"] == "passed" and before["test_driver_at_pin[ssh://vhost]"] == "skipped"
    assert host.host_key.split()[1] in known.read_text()  # the key was recorded, for apply to use too

    result = runner.invoke(app, ["apply", "-i", str(inv), "--yes"])
    assert "vhost" in result.stdout and "changed" in result.stdout, result.stdout

    result = runner.invoke(app, ["verify", "-i", str(inv), "--junit-xml", str(junit)])
    after = cases(junit)
    assert result.exit_code == 0 and after["test_irqbalance[ssh://vhost]"] == "passed"
    assert "failed" not in after.values() and "error" not in after.values()
