"""The bundled engine's flags, checked against this checkout's engine/ `serve` options before any host."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from hosttune.cli import app
from hosttune.cli import deploy as deploy_cli
from hosttune.config.inventory import load_inventory
from hosttune.deploy import rollout
from hosttune.deploy.bundled_flags import EngineFlagError, check_bundled_flags, refusals
from hosttune.deploy.errors import DeployError
from hosttune.deploy.host import HostDeploy
from hosttune.deploy.settings import parse_sets
from hosttune.fleet_runner import Outcome

from deploy_fixtures import ScriptedTransport

runner = CliRunner()


def _inventory(tmp_path, custom: str = "", engine: str = "custom"):
    path = tmp_path / "inventory.yaml"
    path.write_text("hosts:\n  gpu-a:\n    address: 10.0.0.11\n    deploy:\n"
                    f"      engine: {engine}\n      model: /m\n{custom}")
    return load_inventory(path), path


def _check(inv, sets=(), engine=None, ref=None):
    return check_bundled_flags(inv, engine, parse_sets(list(sets)), ref)


def test_the_engine_options_take_good_flags_and_give_argparse_reasons_for_bad_ones():
    assert refusals([("--dtype", "float16"), ("--enable-prefix-caching",), ("--bogus", "1"), ("--device", "tpu"),
                     ("--max-batch-size", "0")]) == [
        None, None, "unrecognized arguments: --bogus 1",
        "argument --device: invalid choice: 'tpu' (choose from 'auto', 'cuda', 'cpu')",
        "argument --max-batch-size: '0': give a whole number > 0"]


def test_good_flags_from_set_and_the_inventory_pass_and_the_plan_says_where_each_check_runs(tmp_path):
    inv, _ = _inventory(tmp_path, "      custom: {dtype: bfloat16, max-batch-size: 64, enforce-eager: true}\n")
    line = _check(inv, ["device=cpu", "kv-cache-dtype=fp8", "step-log=/var/log/steps.jsonl"])
    assert line.startswith("bundled engine flags: checked against ") and "server/options.py before any host" in line
    assert line.endswith("on each host against the installed release's `serve --help` (before anything live changes)")


@pytest.mark.parametrize("sets, message", [
    (["bogus=1"], "--set bogus=1: the bundled engine's serve has no --bogus (engine/hosttune_engine/server/options.py); "
                  "fix its name or drop it"),
    (["device=tpu"], "--set device=tpu: the bundled engine refuses it: argument --device: invalid choice: 'tpu' "
                     "(choose from 'auto', 'cuda', 'cpu')"),
    (["max-batch-size=many"], "--set max-batch-size=many: the bundled engine refuses it: argument --max-batch-size: "
                              "'many': give a whole number > 0"),
    (["enforce-eager=3"], "--set enforce-eager=3: the bundled engine's --enforce-eager takes no value: give true or false"),
])
def test_a_set_flag_the_engine_refuses_is_one_line_naming_the_set_option(tmp_path, sets, message):
    inv, _ = _inventory(tmp_path)
    with pytest.raises(EngineFlagError) as err:
        _check(inv, sets)
    assert str(err.value) == message


@pytest.mark.parametrize("custom, message", [
    ("      custom:\n        max-num-seqs: 64\n", "deploy.custom.max-num-seqs=64: the bundled engine's serve "
     "has no --max-num-seqs (engine/hosttune_engine/server/options.py); fix its name or drop it"),
    ("      custom:\n        dtype: fp4\n", "deploy.custom.dtype=fp4: the bundled engine refuses it: argument "
     "--dtype: invalid choice: 'fp4' (choose from 'auto', 'bfloat16', 'float16', 'float32')"),
])
def test_an_inventory_flag_the_engine_refuses_names_the_inventory_file_and_line(tmp_path, custom, message):
    inv, path = _inventory(tmp_path, custom)
    with pytest.raises(EngineFlagError) as err:
        _check(inv)
    assert str(err.value) == f"{path}:2: {message}"  # the host's line, as the inventory's other deploy errors


def test_a_set_flag_overrides_the_inventory_one_and_null_leaves_it_out(tmp_path):
    inv, _ = _inventory(tmp_path, "      custom: {dtype: fp4, bogus: 1}\n")
    assert _check(inv, ["dtype=float16", "bogus=null"])


@pytest.mark.parametrize("engine, ref", [("vllm", None), ("sglang", None), ("custom", "v1.0")])
def test_vllm_sglang_and_a_release_of_another_ref_are_left_to_the_hosts(tmp_path, engine, ref):
    inv, _ = _inventory(tmp_path, engine=engine)
    assert _check(inv, ["bogus=1"], ref=ref) is None


def test_an_engine_folder_whose_options_do_not_load_is_one_line(monkeypatch, tmp_path):
    from hosttune.deploy import bundled_flags

    (tmp_path / "hosttune_engine").mkdir()  # a package without its server/options.py
    (tmp_path / "hosttune_engine" / "__init__.py").write_text("import no_such_module\n")
    monkeypatch.setattr(bundled_flags, "engine_folder", lambda: tmp_path)
    with pytest.raises(DeployError) as err:
        refusals([("--dtype", "float16")])
    assert str(err.value) == "checking the bundled engine's flags failed: ModuleNotFoundError: No module named 'no_such_module'"


def test_cli_a_bad_engine_flag_is_refused_before_any_host_is_contacted(monkeypatch, tmp_path):
    inv, path = _inventory(tmp_path)
    opened: list = []
    monkeypatch.setattr(rollout, "open_transport", lambda spec, **kw: opened.append(spec) or ScriptedTransport("x", []))
    result = runner.invoke(app, ["deploy", "-i", str(path), "--engine", "custom", "--set", "dtype=fp4", "--dry-run"])
    assert result.exit_code == 2 and not opened
    assert result.output == ("hosttune: --set dtype=fp4: the bundled engine refuses it: argument --dtype: invalid "
                             "choice: 'fp4' (choose from 'auto', 'bfloat16', 'float16', 'float32')\n")


def test_cli_a_dry_run_says_the_flags_were_checked_before_any_host(monkeypatch, tmp_path):
    inv, path = _inventory(tmp_path)
    monkeypatch.setattr(deploy_cli, "deploy_fleet", lambda inv, request, **kw: [
        HostDeploy(inv.hosts[0], Outcome.PLANNED, "custom-1", None, ops=("start hosttune-serve.service",))])
    result = runner.invoke(app, ["deploy", "-i", str(path), "--set", "dtype=float16", "--dry-run"])
    assert result.exit_code == 0, result.output
    assert "bundled engine flags: checked against " in result.output.splitlines()[-2]


def test_cli_a_plan_every_host_of_which_failed_is_its_failures_alone(monkeypatch, tmp_path):
    inv, path = _inventory(tmp_path)
    monkeypatch.setattr(deploy_cli, "deploy_fleet", lambda inv, request, **kw: [
        HostDeploy(inv.hosts[0], Outcome.FAILED, error="nothing changed: the model folder /m does not exist")])
    result = runner.invoke(app, ["deploy", "-i", str(path), "--set", "dtype=float16"])
    assert result.exit_code == 2, result.output
    table, _, count = result.output.partition("\nplan: ")
    assert len(table.strip().splitlines()) == 1 and "does not exist" in table and count == "deploy to 0 of 1 host\n"


def test_a_flag_set_false_turns_off_what_the_bundled_engine_turns_on(tmp_path):
    """enable-prefix-caching is on unless serve is told --no-enable-prefix-caching; leaving it out keeps it on."""
    from hosttune.deploy.settings import flag_argv
    from hosttune.presets import load_preset

    preset = load_preset("custom")
    argv = flag_argv({"enable-prefix-caching": False, "skip-warmup": False, "enforce-eager": True}, {},
                     preset.serve.false_flag)
    assert argv == ["--no-enable-prefix-caching", "--no-skip-warmup", "--enforce-eager"]
    assert refusals([tuple(argv)]) == [None]  # serve takes each false as its --no- form
    inv, _ = _inventory(tmp_path)
    assert _check(inv, ["enable-prefix-caching=false", "log-prompts=false", "protect-probes=false"]) is not None
