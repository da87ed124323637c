"""`hosttune monitor` (one pass on this machine, its files written) and `hosttune status` through typer's CliRunner."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from typer.testing import CliRunner

from hosttune import status as status_module
from hosttune.cli import app
from hosttune.cli import status as status_cli
from hosttune.config.inventory import local_inventory
from hosttune.status_file import StatusError, parse_status
from hosttune.transport.base import CommandResult, Transport, bundled_script

runner = CliRunner()
PLAYBOOK = Path(__file__).resolve().parents[2] / "playbooks" / "inference-latency.yaml"


def test_a_monitor_pass_writes_its_status_and_metrics(tmp_path):
    args = ["monitor", "--profile", str(PLAYBOOK), "--textfile-dir", str(tmp_path / "tf"), "--status-dir", str(tmp_path / "st")]
    result = runner.invoke(app, args)
    assert result.exit_code in (0, 1), result.output
    doc = parse_status((tmp_path / "st" / "status.json").read_text())
    assert doc.pass_name == "regular" and doc.interval_s == 60 and sum(doc.counts.values()) > 30
    families = {f.name for f in text_string_to_metric_families((tmp_path / "tf" / "hosttune.prom").read_text())}
    assert {"hosttune_check_status", "hosttune_monitor_last_run_timestamp_seconds"} <= families
    assert not list((tmp_path / "tf").glob(".*"))  # no temporary file left behind


def test_status_of_a_host_without_a_monitor_is_stale_and_says_why():
    result = runner.invoke(app, ["status", "--format", "json"])
    (host,) = json.loads(result.stdout)
    assert result.exit_code & 1 and host["state"] == "STALE"
    assert host["findings"][0]["detail"].startswith("no status file")


def test_a_missing_profile_is_one_line_and_exit_2(tmp_path):
    result = runner.invoke(app, ["monitor", "--profile", str(tmp_path / "none.yaml"), "--textfile-dir", str(tmp_path)])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert f"unknown profile '{tmp_path / 'none.yaml'}': no such file; give the path of a playbook file" in result.stderr


@pytest.mark.parametrize("name", ["", "profile", "profile.yaml.bak"])
def test_a_profile_path_that_names_no_playbook_file_says_so_not_that_no_such_profile_is_known(tmp_path, name):
    """A folder, or a file without .yaml, read as "unknown profile '/tmp/x'; known profiles: ...", as if a name."""
    (tmp_path / "profile").write_text("name: p\nsettings: {}\n")
    (tmp_path / "profile.yaml.bak").write_text("name: p\nsettings: {}\n")
    path = tmp_path / name
    result = runner.invoke(app, ["monitor", "--profile", str(path), "--textfile-dir", str(tmp_path)])
    assert result.exit_code == 2 and result.stderr.startswith(
        f"hosttune: unknown profile '{path}': a playbook file's name ends in .yaml or .yml; give one, or one of "
        "inference-latency, "), result.output


def test_an_output_or_status_dir_that_cannot_be_written_is_one_line_and_exit_2(tmp_path):
    (tmp_path / "f").write_text("a file, not a folder")
    cases = {("status", "-o", str(tmp_path)): f"cannot write {tmp_path}: Is a directory; choose another --output",
             ("status", "-o", str(tmp_path / "f" / "x")): "a folder in its path is a file; choose another --output",
             ("monitor", "--profile", str(PLAYBOOK), "--textfile-dir", str(tmp_path / "tf"),
              "--status-dir", str(tmp_path / "f" / "st")): f"cannot write {tmp_path / 'f' / 'st' / 'status.json'}: "
                                                           "a folder in its path is a file"}
    for argv, why in cases.items():
        result = runner.invoke(app, list(argv))
        assert result.exit_code == 2 and why in result.stderr, result.output
        assert result.stderr.startswith("hosttune: cannot write") and len(result.stderr.splitlines()) == 1


def test_a_bad_value_in_a_playbook_file_names_its_file_and_line(tmp_path):
    playbook = tmp_path / "mine.yaml"
    playbook.write_text("name: mine\nextends: inference-latency\nsettings:\n  monitor:\n    interval_s: 5\n")
    result = runner.invoke(app, ["monitor", "--profile", str(playbook), "--textfile-dir", str(tmp_path / "tf"),
                                 "--status-dir", str(tmp_path / "st")])
    assert result.exit_code == 2 and not (tmp_path / "tf").exists()
    assert result.stderr == f"hosttune: {playbook}:5: settings.monitor.interval_s: must be 10 to 604800 seconds (got 5)\n"


def test_an_active_pass_where_the_profile_has_none_is_refused_and_writes_nothing(tmp_path):
    playbook = tmp_path / "no-active.yaml"
    playbook.write_text("name: no-active\nextends: inference-latency\nsettings:\n  monitor:\n    active_interval_s: null\n")
    result = runner.invoke(app, ["monitor", "--active", "--profile", str(playbook), "--textfile-dir", str(tmp_path / "tf"),
                                 "--status-dir", str(tmp_path / "st")])
    assert result.exit_code == 2 and not (tmp_path / "tf").exists() and not (tmp_path / "st").exists()
    assert result.stderr.startswith(f"hosttune: {playbook}: monitor.active_interval_s is null") and result.stderr.count("\n") == 1


class StatusRead(Transport):
    """A host whose status read prints `output` (its clock, then each pass's status file)."""

    def __init__(self, output: str):
        self.host_name, self.output, self.read_only = "localhost", output, True

    def _command(self, argv, stdin, timeout):
        return CommandResult(tuple(argv), 0, self.output, "", 0.0)


@pytest.mark.parametrize("output, error", [
    ("@@ht:now\n%s\n@@ht-end:now:0\n", "the host's clock read '%s', not Unix seconds (`date +%s` on the host must print them)"),
    ("@@ht:now\n1000\n@@ht-end:now:0\n@@ht:regular\n{\"host\": \n@@ht-end:regular:0\n",
     "/var/lib/hosttune/monitor/status.json: unreadable status file: JSONDecodeError: "),
    # JSON's Infinity as a whole number of seconds or a count: it stopped the whole fleet's status with an internal error
    ("@@ht:now\n1000\n@@ht-end:now:0\n@@ht:regular\n{\"host\": \"h\", \"pass_name\": \"regular\", \"when\": 990, "
     "\"interval_s\": Infinity, \"duration_s\": 1, \"versions\": {}, \"counts\": {}, \"findings\": []}\n@@ht-end:regular:0\n",
     "/var/lib/hosttune/monitor/status.json: unreadable status file: OverflowError: cannot convert float infinity to integer"),
    # a NaN duration went into status --format json as NaN, which JSON has not (jq refuses the whole document)
    ("@@ht:now\n1000\n@@ht-end:now:0\n@@ht:regular\n{\"host\": \"h\", \"pass_name\": \"regular\", \"when\": 990, "
     "\"interval_s\": 60, \"duration_s\": NaN, \"versions\": {}, \"counts\": {}, \"findings\": []}\n@@ht-end:regular:0\n",
     "/var/lib/hosttune/monitor/status.json: unreadable status file: duration_s: must be a finite number of seconds "
     "(got nan)"),
])
def test_a_host_whose_status_read_makes_no_sense_is_that_hosts_error(monkeypatch, output, error):
    monkeypatch.setattr(status_module, "open_transport", lambda spec, read_only=False: StatusRead(output))
    result = runner.invoke(app, ["status", "--format", "json"])
    (host,) = json.loads(result.stdout, parse_constant=lambda c: pytest.fail(f"{c} is not JSON"))
    assert result.exit_code == 2 and host["state"] == "ERROR" and host["error"].startswith(error), result.output


def test_a_pass_whose_probe_failed_says_why_on_its_one_line_and_in_its_status_file(monkeypatch, tmp_path):
    from hosttune import monitor_pass
    from hosttune.fleet import HostReport

    failed = lambda host, profile, active: HostReport(host, profile.name, True, error="probe timed out after 60s")
    monkeypatch.setattr(monitor_pass, "check_host", failed)
    result = runner.invoke(app, ["monitor", "--profile", str(PLAYBOOK), "--textfile-dir", str(tmp_path / "tf"),
                                 "--status-dir", str(tmp_path / "st")])
    assert result.exit_code == 2
    assert parse_status((tmp_path / "st" / "status.json").read_text()).error == "probe timed out after 60s"
    assert result.stderr == "localhost: probe failed: probe timed out after 60s\n"


def _help(command: str) -> str:
    """--help as one line of words (rich wraps it into a box)."""
    return " ".join(runner.invoke(app, [command, "--help"]).stdout.replace("│", " ").split())


def test_the_help_of_status_monitor_remediate_and_uncordon_says_what_the_docs_say():
    assert ("A host is STALE when a pass has not written its status within two of its intervals plus the time a pass "
            "may take (on the host's clock), or never has.") in _help("status")
    assert "Exit code bits: 1 drift or stale, 2 error, 4 unreachable host." in _help("status")
    assert "Where the status files go; hosttune status reads them only from the default." in _help("monitor")
    assert "(refused where the profile's monitor.active_interval_s is null)" in _help("monitor")
    for command in ("remediate", "uncordon"):
        assert "--dry-run stops there, --yes or a terminal's answer acts on it." in _help(command)
    assert "Exit code bits: 2 an error, 4 an unreachable host." in _help("uncordon")
    assert "(0 to 100; 0: the first cordon stops it)" in _help("remediate")
    assert "Hosts read in parallel." in _help("uncordon") and "Hosts read in parallel." in _help("status")


def test_a_status_file_that_is_there_but_cannot_be_read_is_that_hosts_error_not_a_missing_monitor(tmp_path):
    """The real status read, pointed at a folder where status.json cannot be read (here: it is a folder)."""
    (tmp_path / "status.json").mkdir()
    script = bundled_script("hosttune", "status_read.sh").replace("d=/var/lib/hosttune/monitor", f"d={tmp_path}")
    output = subprocess.run(["sh", "-s"], input=script, capture_output=True, text=True, check=True).stdout
    with pytest.raises(StatusError, match=r"^/var/lib/hosttune/monitor/status.json: cannot read it: cat: .*Is a directory"):
        status_module.parse_read(local_inventory().hosts[0], output)
    (tmp_path / "status.json").rmdir()
    output = subprocess.run(["sh", "-s"], input=script, capture_output=True, text=True, check=True).stdout
    missing = status_module.parse_read(local_inventory().hosts[0], output)
    assert missing.stale[0].detail.startswith("no status file")


def test_the_command_list_shows_each_commands_summary_unbroken():
    """`hosttune --help` prints a summary's source line breaks as they are, so each summary is one source line."""
    import inspect

    broken = [c.callback.__name__ for c in app.registered_commands
              if "\n" in (inspect.getdoc(c.callback) or "").split("\n\n")[0]]
    assert broken == []
    listing = runner.invoke(app, ["--help"]).stdout
    assert "drain, diagnose, reset, reboot, cordon" in " ".join(listing.replace("│", " ").split())
    assert not any(line.rstrip(" │").endswith("drain,") for line in listing.splitlines())


def test_a_textfile_folder_that_cannot_be_written_still_leaves_a_fresh_status_file(tmp_path):
    """node_exporter's folder broken must not make the pass's findings look stale to hosttune status too."""
    (tmp_path / "f").write_text("a file, not a folder")
    result = runner.invoke(app, ["monitor", "--profile", str(PLAYBOOK), "--textfile-dir", str(tmp_path / "f" / "tf"),
                                 "--status-dir", str(tmp_path / "st")])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert result.stderr.startswith(f"hosttune: cannot write {tmp_path / 'f' / 'tf' / 'hosttune.prom'}: a folder in its path")
    assert parse_status((tmp_path / "st" / "status.json").read_text()).pass_name == "regular"


def test_an_output_that_cannot_be_written_is_refused_before_any_host_is_read(monkeypatch, tmp_path):
    read = []
    monkeypatch.setattr(status_cli, "read_fleet", lambda *a, **k: read.append(1) or [])
    result = runner.invoke(app, ["status", "-o", str(tmp_path)])
    assert result.exit_code == 2 and "choose another --output" in result.stderr and read == []


@pytest.mark.parametrize("option", ["--textfile-dir", "--status-dir"])
def test_a_monitor_folder_that_is_not_absolute_is_refused_before_the_pass(tmp_path, monkeypatch, option):
    """`--textfile-dir "$DIR"` with DIR unset would write into the working folder, where nothing reads them."""
    monkeypatch.chdir(tmp_path)
    args = {"--textfile-dir": str(tmp_path / "tf"), "--status-dir": str(tmp_path / "st"), option: ""}
    result = runner.invoke(app, ["monitor", "--profile", str(PLAYBOOK), *(v for kv in args.items() for v in kv)])
    assert result.exit_code == 2 and list(tmp_path.iterdir()) == []
    assert result.stderr.strip() == (f"hosttune monitor: {option}: '' names no path: give one, or leave the option out "
                                      "(see hosttune monitor --help)")
    args[option] = "relative"
    result = runner.invoke(app, ["monitor", "--profile", str(PLAYBOOK), *(v for kv in args.items() for v in kv)])
    assert result.exit_code == 2 and list(tmp_path.iterdir()) == []
    assert result.stderr.strip() == (f"hosttune: {option} 'relative' is not an absolute folder: give the full path "
                                      "(the timers apply installs do)")


def test_status_help_says_its_output_can_be_standard_output_as_it_can():
    result = runner.invoke(app, ["status", "-o", "-"])
    assert "wrote" not in result.stderr and "HOST" in result.stdout
    assert "(-: standard output)" in runner.invoke(app, ["status", "--help"], env={"COLUMNS": "300"}).stdout
