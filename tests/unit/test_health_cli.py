"""`hosttune explain` of the health checks and `hosttune check --active`, through typer's runner."""

import json

from typer.testing import CliRunner

from hosttune.cli import app
from hosttune.probes.gather import probe_script

runner = CliRunner()


def test_explain_a_health_check():
    result = runner.invoke(app, ["explain", "gpu.fabric"])
    assert result.exit_code == 0
    assert "error 802" in result.stdout and "fix: install nvidia-fabricmanager" in result.stdout


def test_check_active_on_a_machine_without_gpu():
    result = runner.invoke(app, ["check", "--active", "--format", "json"])
    (host,) = json.loads(result.stdout)["hosts"]
    by_id = {f["check_id"]: f for f in host["findings"]}
    assert by_id["gpu.load"]["status"] == "not-applicable" and by_id["sys.shm"]["status"] in ("ok", "drift")


def test_only_an_active_probe_carries_a_load():
    assert b"HOSTTUNE_ACTIVE=\n" in probe_script() and b"HOSTTUNE_ACTIVE=6\n" in probe_script(6)
    assert b"HOSTTUNE_CUDA_PROBE='" in probe_script() and b"HOSTTUNE_ALLREDUCE_PROBE='" in probe_script()
