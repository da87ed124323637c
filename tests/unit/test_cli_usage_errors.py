"""Bad command lines: one line on stderr naming the command and what to fix, exit 2, for every command."""

import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from hosttune.cli import app
from hosttune.fleet_runner import EXIT_ERROR

runner = CliRunner()
ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("args, line", [
    (["deploy", "--port", "0"], "hosttune deploy: --port 0: input should be greater than or equal to 1 "
                                   "(see hosttune deploy --help)"),
    (["deploy", "--bogus"], "hosttune deploy: no such option: --bogus (Possible options: --gpus) "
                           "(see hosttune deploy --help)"),
    (["bogus"], "hosttune: no such command 'bogus' (see hosttune --help)"),
    (["--bogus"], "hosttune: no such option: --bogus (see hosttune --help)"),
    (["build", "--engine", "nope"], "hosttune build: --engine: 'nope' is not one of 'custom', 'vllm', 'sglang' "
                                    "(see hosttune build --help)"),
    (["explain"], "hosttune explain: missing argument 'check_id' (see hosttune explain --help)"),
    (["apply", "--forks", "x"], "hosttune apply: --forks x: input should be a valid integer, unable to parse "
                                "string as an integer (see hosttune apply --help)"),
    (["apply", "--forks", ""], "hosttune apply: --forks '': input should be a valid integer, unable to parse "
                               "string as an integer (see hosttune apply --help)"),  # an unset variable, named as given
    (["rollback", "--run"], "hosttune rollback: option '--run' requires an argument (see hosttune rollback --help)"),
    (["check", "--format", "bogus"], "hosttune check: --format: 'bogus' is not one of 'table', 'json', 'junit', "
                                     "'prometheus' (see hosttune check --help)"),
    (["bench", "--rate", "-1"], None),
])
def test_a_usage_error_is_one_line_and_exit_2(args, line):
    result = runner.invoke(app, args, env={"COLUMNS": "250"})
    assert result.exit_code == EXIT_ERROR and result.stdout == ""
    assert result.stderr.count("\n") == 1 and "╭" not in result.stderr and "Usage:" not in result.stderr
    if line is not None:
        assert result.stderr == line + "\n"
    assert result.stderr.startswith(f"hosttune {args[0]}: " if not args[0].startswith("-") and args[0] != "bogus"
                                    else "hosttune: ")


def test_help_and_no_arguments_still_print_the_help():
    assert runner.invoke(app, ["deploy", "--help"]).stdout.lstrip().startswith("Usage: hosttune deploy [OPTIONS]")
    bare = runner.invoke(app, [])
    assert bare.exit_code == EXIT_ERROR and "Commands" in bare.output and "check" in bare.output


def test_the_installed_entry_point_prints_the_same_line():
    """Through main(), as the `hosttune` script runs it: no box, no traceback, exit 2."""
    result = subprocess.run([sys.executable, "-c", "import sys; sys.argv[0] = 'hosttune'; "
                             "from hosttune.cli import main; main()", "deploy", "--port", "70000"],
                            capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert result.returncode == EXIT_ERROR and result.stdout == ""
    assert result.stderr == ("hosttune deploy: --port 70000: input should be less than or equal to 65535 "
                             "(see hosttune deploy --help)\n")


@pytest.mark.parametrize("args", [
    ["build", "--engine", "custom", "--dry-run", "--wheelhouse", ""],
    ["deploy", "--dry-run", "--keys-dir", ""],
    ["deploy", "--dry-run", "--nginx-dir", " "],
    ["bench", "--url", "http://127.0.0.1:9", "--requests", "1", "--out", ""],
    ["check", "--inventory", ""],
    ["facts", "--output", ""],
    ["verify", "--junit-xml", ""],
])
def test_an_empty_path_is_refused_in_one_line_never_taken_for_the_current_folder(args, tmp_path, monkeypatch):
    """`--out "$DIR"` with DIR unset must not write (or clear result files) where the command happens to run."""
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(app, args)
    option = next(a for a in args if a.startswith("-") and args[args.index(a) + 1].strip() == "")
    given = args[args.index(option) + 1]
    assert result.exit_code == EXIT_ERROR and result.stdout == "" and list(tmp_path.iterdir()) == []
    assert result.stderr == (f"hosttune {args[0]}: {option}: {given!r} names no path: give one, or leave the option "
                             f"out (see hosttune {args[0]} --help)\n")


@pytest.mark.parametrize("args", [
    ["deploy", "--dry-run", "--canary", "1", "--canary-slo", ""],
    ["deploy", "--dry-run", "--ref", ""],
    ["deploy", "--dry-run", "--replicas", " "],
    ["build", "--engine", "custom", "--dry-run", "--python", ""],
    ["build", "--engine", "vllm", "--dry-run", "--arch", "9.0", "--source", ""],
    ["build", "--engine", "vllm", "--dry-run", "--arch", "9.0", "--ref", ""],
    ["build", "--engine", "custom", "--dry-run", "--cuobjdump", ""],
    ["bench", "--url", "http://127.0.0.1:9", "--requests", "1", "--shared-prefix", ""],
    ["bench", "--url", "http://127.0.0.1:9", "--requests", "1", "--warmup", ""],
    ["bench", "--url", "http://127.0.0.1:9", "--requests", "1", "--model", ""],
])
def test_an_empty_value_is_refused_in_one_line_never_taken_for_the_default(args):
    """`--canary-slo "$SLO"` with SLO unset must not roll out with no SLO checked, nor `--ref "$REF"` deploy the newest."""
    result = runner.invoke(app, args)
    option = next(a for a in args if a.startswith("-") and args[args.index(a) + 1].strip() == "")
    given = args[args.index(option) + 1]
    assert result.exit_code == EXIT_ERROR and result.stdout == ""
    assert result.stderr == (f"hosttune {args[0]}: {option}: {given!r} names nothing: give a value, or leave the option "
                             f"out (see hosttune {args[0]} --help)\n")
