"""The CLI through typer's CliRunner: formats, exit codes, explain, bad input."""

import json
import xml.etree.ElementTree as ET

import pytest
from typer.testing import CliRunner

from hosttune.checks import CATALOGUE
from hosttune.cli import app
from hosttune.cli import apply as apply_cli
from hosttune.cli import check as check_cli
from hosttune.fleet_runner import EXIT_DRIFT, EXIT_ERROR, EXIT_UNREACHABLE

runner = CliRunner()


def test_help_lists_commands():
    result = runner.invoke(app, ["--help"])
    assert result.exit_code == 0
    for command in ("check", "facts", "explain"):
        assert command in result.output


def test_check_local_json_matches_exit_code():
    result = runner.invoke(app, ["check", "--format", "json"])
    doc = json.loads(result.stdout)
    (host,) = doc["hosts"]
    assert host["host"] == "localhost" and host["reachable"] and len(host["findings"]) == len(CATALOGUE)
    assert result.exit_code == doc["exit_code"]
    failing = any(f["status"] in ("drift", "pending-reboot") for f in host["findings"])
    assert bool(result.exit_code & EXIT_DRIFT) == failing


def test_check_junit_and_prometheus(tmp_path):
    out = tmp_path / "r.xml"
    runner.invoke(app, ["check", "--format", "junit", "--output", str(out)])
    suite = ET.parse(out).getroot().find("testsuite")
    assert suite.get("name") == "localhost" and int(suite.get("tests")) == len(CATALOGUE)
    prom = runner.invoke(app, ["check", "--format", "prometheus"]).stdout
    assert 'hosttune_host_reachable{host="localhost"} 1' in prom
    assert prom.count('check="mm.thp"') == 5


def test_unreachable_host_sets_bit_4_and_others_still_checked(tmp_path):
    inv = tmp_path / "inv.yaml"
    inv.write_text("hosts:\n  localhost: {transport: local}\n  dead:\n    address: 127.0.0.1\n    ssh: {port: 9, timeout: 2}\n")
    result = runner.invoke(app, ["check", "-i", str(inv), "--format", "json"])
    doc = json.loads(result.stdout)
    by = {h["host"]: h for h in doc["hosts"]}
    assert by["dead"]["reachable"] is False and "127.0.0.1:9: connection refused" in by["dead"]["error"]
    assert by["localhost"]["reachable"] and by["localhost"]["findings"]
    assert result.exit_code & EXIT_UNREACHABLE


def test_bad_inventory_is_exit_2_with_location(tmp_path):
    inv = tmp_path / "inv.yaml"
    inv.write_text("hosts:\n  a:\n    prot: 22\n")
    result = runner.invoke(app, ["check", "-i", str(inv)])
    assert result.exit_code == EXIT_ERROR
    assert "inv.yaml:3: hosts.a.prot: unknown key" in result.output


def test_explain():
    result = runner.invoke(app, ["explain", "cpu.cstates"])
    assert result.exit_code == 0 and "why:" in result.output and "needs a reboot" in result.output
    (na,) = [line for line in result.output.splitlines() if line.startswith("not applicable on: ")]
    assert "haltpoll" in na and "hypervisor" in na and "no active cpuidle driver" in na
    assert "not applicable on:" not in runner.invoke(app, ["explain", "irq.irqbalance"]).output
    assert runner.invoke(app, ["explain", "nope"]).exit_code == EXIT_ERROR
    unknown = runner.invoke(app, ["explain", "reset"])  # a remediation step without its prefix
    assert unknown.exit_code == EXIT_ERROR and len(unknown.stderr.splitlines()) == 1
    assert "known checks: driver.version," in unknown.stderr and "remediate.reset, remediate.reboot" in unknown.stderr
    typo = runner.invoke(app, ["explain", "irq.irqbalanc"])
    assert typo.exit_code == EXIT_ERROR and "; did you mean irq.irqbalance? known checks:" in typo.stderr
    assert runner.invoke(app, ["explain", "cpu.cstates "]).exit_code == 0  # pasted with a trailing space



def test_explain_takes_an_id_in_any_case_as_its_hint_suggests():
    from hosttune.checks import BY_ID

    assert all(check_id == check_id.lower() for check_id in BY_ID)  # ids are lower case, so any case names one
    shouted = runner.invoke(app, ["explain", "GPU.XID"])
    assert shouted.exit_code == 0 and shouted.output.startswith("gpu.xid: "), shouted.output
    step = runner.invoke(app, ["explain", "Remediate.Reset"])
    assert step.exit_code == 0 and step.output.startswith("remediate.reset: "), step.output


def test_explain_says_what_apply_does_and_names_the_files_it_writes():
    from hosttune.actions.cuda import PROFILE_D
    from hosttune.actions.memory import SYSCTL_FILE

    cuda = runner.invoke(app, ["explain", "cuda.toolkit"]).stdout
    assert PROFILE_D in cuda and "--prune-cuda" in cuda and "apply: does this fix" in cuda
    assert SYSCTL_FILE in runner.invoke(app, ["explain", "numa.topology"]).stdout
    pstate = runner.invoke(app, ["explain", "gpu.pstate"]).stdout  # no action: apply only reports it
    assert "apply: no automatic fix" in pstate


def test_verbose_lists_each_not_applicable_check_where_the_default_groups_them_by_reason():
    (host,) = json.loads(runner.invoke(app, ["check", "--format", "json"]).stdout)["hosts"]
    na = [f for f in host["findings"] if f["status"] == "not-applicable"]
    grouped, each = runner.invoke(app, ["check"]).stdout, runner.invoke(app, ["check", "-v"]).stdout
    for f in na:  # this machine has some: no GPU, or no engine deployed, or no monitor
        assert any(line.startswith("  n/a ") and f"{f['detail']}: " in line and f["check_id"] in line
                   for line in grouped.splitlines())
        assert any(line.split()[:2] == ["n/a", f["check_id"]] and f"({f['detail']})" in line for line in each.splitlines())
    assert na and sum(line.startswith("  n/a ") for line in each.splitlines()) == len(na)
    help_text = " ".join(runner.invoke(app, ["check", "--help"]).stdout.replace("│", " ").split())
    assert "each not-applicable check on its own line, in order, with its reason (default: one line per reason)" in help_text


def test_an_output_checked_before_a_failing_command_leaves_no_folders_behind(tmp_path):
    (tmp_path / "inv.yaml").write_text("hosts:\n  a:\n    prot: 22\n")
    out = tmp_path / "new" / "deeper" / "check.txt"
    result = runner.invoke(app, ["check", "-i", str(tmp_path / "inv.yaml"), "-o", str(out)])
    assert result.exit_code == EXIT_ERROR and not (tmp_path / "new").exists()
    assert runner.invoke(app, ["check", "-o", str(out)]).exit_code != EXIT_ERROR and out.exists()


def test_facts_exits_2_for_a_probe_error_not_for_a_check_in_error(tmp_path):
    """rcu_nocbs naming CPUs this machine lacks puts kernel.rcu_nocbs in error: check's verdict, not a probe error."""
    inv = tmp_path / "inv.yaml"
    inv.write_text('hosts:\n  localhost: {transport: local, rcu_nocbs: "4000-4063"}\n')
    assert runner.invoke(app, ["check", "-i", str(inv)]).exit_code & EXIT_ERROR
    result = runner.invoke(app, ["facts", "-i", str(inv)])
    assert result.exit_code == 0 and json.loads(result.stdout)["localhost"]["kernel"]


def test_output_dash_is_standard_output_not_a_file_named_dash(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(app, ["check", "--format", "json", "-o", "-"])
    assert json.loads(result.stdout)["hosts"][0]["host"] == "localhost" and not (tmp_path / "-").exists()


def test_facts_dumps_json():
    result = runner.invoke(app, ["facts"])
    doc = json.loads(result.stdout)
    assert doc["localhost"]["kernel"] and "gpu" in doc["localhost"]


def test_output_whose_reader_went_away_ends_quietly_not_as_an_internal_error(tmp_path):
    """`hosttune rollback ... | head -2`: the rollback was done, then its recap met the closed pipe and the command
    said "internal error: BrokenPipeError ... please report it", leaving a crash file."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path), "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.Popen([sys.executable, "-m", "hosttune", "explain", "gpu.xid"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env)
    proc.stdout.close()  # before the interpreter has started: its first write meets a pipe nobody reads
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 141 and err == b"" and not list(tmp_path.iterdir()), err.decode()


def test_unexpected_exception_is_one_line_naming_the_traceback_file(tmp_path, monkeypatch):
    def broken(*args, **kwargs):
        raise KeyError("a bug, not bad input")

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr("hosttune.cli.check.check_fleet", broken)
    result = runner.invoke(app, ["check"])
    assert result.exit_code == 2 and result.stdout == ""
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("hosttune: internal error: KeyError: 'a bug, not bad input' (traceback in ")
    (written,) = (tmp_path / "hosttune").glob("crash-*.txt")
    assert str(written) in line
    assert "Traceback (most recent call last)" in written.read_text() and "def broken" not in line


@pytest.mark.parametrize("argv, option", [
    (["check", "-o"], "--output"), (["facts", "-o"], "--output"), (["apply", "--yes", "-o"], "--output"),
    (["apply", "--dry-run", "-o"], "--output"), (["verify", "--junit-xml"], "--junit-xml"),
])
def test_a_report_path_that_cannot_be_written_fails_before_any_host_is_read(tmp_path, monkeypatch, argv, option):
    """Not after the probes ran or, for apply, after the hosts changed and the recap would be lost."""
    def never(*args, **kwargs):
        raise AssertionError("a host was read")

    monkeypatch.setattr(check_cli, "load", never)
    monkeypatch.setattr(apply_cli, "load", never)
    (tmp_path / "f").write_text("a file, not a folder")
    result = runner.invoke(app, [*argv, str(tmp_path / "f" / "report")])
    assert result.exit_code == 2, result.output
    assert result.stderr == (f"hosttune: cannot write {tmp_path / 'f' / 'report'}: a folder in its path is a file; "
                             f"choose another {option}\n")
    assert (tmp_path / "f").read_text() == "a file, not a folder"


def test_a_report_path_that_can_be_written_is_not_left_behind_when_the_command_fails(tmp_path):
    out = tmp_path / "sub" / "check.json"
    result = runner.invoke(app, ["check", "--limit", "nomatch", "-o", str(out)])
    assert result.exit_code == 2 and "matches no host" in result.stderr and not out.exists()


def test_a_probe_error_is_in_every_report_format_as_in_the_exit_code(monkeypatch):
    """A section the probe could not parse makes check exit 2: the JUnit report a CI reads must say why too."""
    from hosttune.config.inventory import local_inventory
    from hosttune.fleet import HostReport
    from hosttune.probes.facts import Facts

    problem = "gpu: NVIDIA devices on the PCI bus but no driver answered: nvidia-smi: exit 9"
    report = HostReport(local_inventory().hosts[0], "inference-latency", True, Facts(probe_errors=(problem,)))
    monkeypatch.setattr(check_cli, "check_fleet", lambda inv, **kw: [report])
    table = runner.invoke(app, ["check"])
    assert table.exit_code == EXIT_ERROR and f"probe: {problem}" in table.stdout
    assert "fleet: 1 host, 0 clean, 1 with findings or errors, 0 unreachable" in table.stdout
    junit = runner.invoke(app, ["check", "--format", "junit"])
    suite = ET.fromstring(junit.stdout).find("testsuite")
    assert junit.exit_code == EXIT_ERROR and suite.get("errors") == "1", junit.stdout
    (case,) = suite.findall("testcase[@name='probe']")
    assert case.find("error").get("message") == problem
    prom = runner.invoke(app, ["check", "--format", "prometheus"]).stdout
    assert 'hosttune_host_reachable{host="localhost"} 0' in prom  # "could reach and probe the host": not all of it


@pytest.mark.parametrize("limit", ["localhost,", "localhost,,localhost", ",localhost", "localhost, "])
def test_a_limit_with_an_empty_entry_is_refused_rather_than_the_entry_dropped(limit):
    """`-l "$A,$B"` with B unset must not quietly run on A alone."""
    result = runner.invoke(app, ["check", "-l", limit])
    assert result.exit_code == 2 and result.stdout == ""
    assert result.stderr == (f"hosttune: --limit {limit!r} has an empty entry; list hosts or groups such as "
                             "gpu-01,h100 (no empty name between commas)\n")


def test_apply_refuses_a_failure_budget_without_batches_as_deploy_does(monkeypatch):
    """Without --serial every host is in one batch: --max-fail-percent would stop nothing."""
    monkeypatch.setattr(apply_cli, "plan_fleet", lambda *a, **k: pytest.fail("a host was read"))
    result = runner.invoke(app, ["apply", "--dry-run", "--max-fail-percent", "10"])
    assert result.exit_code == 2 and result.stdout == ""
    assert result.stderr == ("hosttune: --max-fail-percent stops starting batches once too many hosts failed, and "
                             "without --serial every host is in one batch: give --serial N too\n")
    assert runner.invoke(app, ["apply", "--help"], env={"COLUMNS": "300"}).stdout.count("needs --serial") == 1
