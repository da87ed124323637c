"""`hosttune verify` plumbing and the apply/rollback/verify CLI surface (read-only here)."""

import json

import pytest
from typer.testing import CliRunner

from hosttune.cli import app
from hosttune.errors import HosttuneError
from hosttune.config.inventory import Host
from hosttune.config.profile import build, load_profile
from hosttune.transport.base import ConnectionSpec
from hosttune.verify import expectations, host_spec, ssh_config, suite_dir

runner = CliRunner()


def ssh_host(name="gpu-01", **kw) -> Host:
    spec = dict(host_name=name, transport="ssh", address="10.0.0.1", port=2222, user="deploy", key="/k/id",
                known_hosts="/k/known", become=True)
    spec.update(kw)
    return Host(name, "g", ConnectionSpec(**spec))


def test_ssh_config_checks_host_keys_and_uses_the_inventory():
    text = ssh_config([ssh_host()], "/tmp/ctl", accept_new_host_keys=False)
    assert 'Host gpu-01\n  HostName "10.0.0.1"\n  Port 2222\n  User "deploy"\n  IdentityFile "/k/id"' in text
    assert 'UserKnownHostsFile "/k/known"' in text and "StrictHostKeyChecking yes" in text and "BatchMode yes" in text
    assert "StrictHostKeyChecking accept-new" in ssh_config([ssh_host()], "/tmp/ctl", accept_new_host_keys=True)


@pytest.mark.parametrize("field", ["address", "user", "key", "known_hosts"])
def test_hostile_values_never_become_ssh_config_directives(field):
    with pytest.raises(HosttuneError, match="cannot be written to an ssh config"):
        ssh_config([ssh_host(**{field: 'x\n  ProxyCommand touch /tmp/pwned'})], "/tmp/ctl", False)
    with pytest.raises(HosttuneError):
        ssh_config([ssh_host(**{field: 'x" ProxyCommand "touch'})], "/tmp/ctl", False)


def test_host_specs():
    assert host_spec(ssh_host(), "/c") == "ssh://gpu-01?ssh_config=/c&sudo=true"
    assert host_spec(Host("localhost", "l", ConnectionSpec("localhost")), "/c") == "local://"


def test_expectations_come_from_the_profile_alone():
    want = expectations(build("p", {"driver": {"version": "2.10", "packages": ["hello"]}, "cuda": {"toolkit": "12.4"}}))
    assert want["driver"] == {"version": "2.10", "held": True, "packages": {"apt": ["hello"], "dnf": ["hello"]}}
    latency = expectations(load_profile("inference-latency"))
    assert latency["driver"]["packages"]["apt"] == ["nvidia-driver-535"] and latency["irqbalance"] is False
    json.dumps(latency)


def test_suite_ships_with_hosttune():
    assert (suite_dir() / "test_tuned.py").exists()


def test_cli_lists_apply_rollback_verify():
    out = runner.invoke(app, ["--help"]).output
    for command in ("apply", "rollback", "verify"):
        assert command in out


def test_apply_dry_run_on_this_machine_is_read_only_json():
    result = runner.invoke(app, ["apply", "--dry-run", "--format", "json"])
    doc = json.loads(result.stdout)
    assert doc["dry_run"] is True and doc["run"] is None
    (host,) = doc["hosts"]
    assert host["host"] == "localhost" and host["state"] in ("changed", "ok") and host["changed"] == 0
    assert result.exit_code == doc["exit_code"]
