"""hosttune-engine's bad command lines: one line on stderr naming the command and the option, exit 2."""

import subprocess
import sys

import pytest

from hosttune_engine.server.cli import main


@pytest.mark.parametrize("argv, line", [
    (["serve", "--model", "/m", "--port", "x"],
     "hosttune-engine serve: error: --port: invalid int value: 'x' (see hosttune-engine serve --help)"),
    (["serve", "--model", "/m", "--log-level", "loud"],
     "hosttune-engine serve: error: --log-level: invalid choice: 'loud' (choose from 'debug', 'info', 'warning', "
     "'error') (see hosttune-engine serve --help)"),
    (["serve"], "hosttune-engine serve: error: the following arguments are required: --model "
                "(see hosttune-engine serve --help)"),
    (["serve", "--model", "/m", "--bogus", "1"],
     "hosttune-engine serve: error: unrecognized arguments: --bogus 1 (see hosttune-engine serve --help)"),
    (["bogus"], "hosttune-engine: error: command: invalid choice: 'bogus' (choose from 'serve', 'plan', 'tune') "
                "(see hosttune-engine --help)"),
    ([], "hosttune-engine: error: the following arguments are required: command (see hosttune-engine --help)"),
])
def test_a_bad_command_line_is_one_line_and_exit_2(capsys, argv, line):
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    out, err = capsys.readouterr()
    assert exit_.value.code == 2 and out == "" and err.count("\n") == 1 and "usage:" not in err
    assert err == f"{line}\n"


def test_help_is_still_argparse_help():
    proc = subprocess.run([sys.executable, "-m", "hosttune_engine", "serve", "--help"], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0 and proc.stdout.startswith("usage: hosttune-engine serve [-h] --model MODEL")


def test_plan_into_a_closed_pipe_ends_quietly(tiny_qwen2):
    # `hosttune-engine plan ... | head -3`: the reader leaves before the plan is printed
    proc = subprocess.Popen([sys.executable, "-m", "hosttune_engine", "plan", "--model", str(tiny_qwen2)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    proc.stdout.close()
    err = proc.stderr.read()
    assert proc.wait(60) == 1 and err == "", err
