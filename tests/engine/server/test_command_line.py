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


@pytest.mark.parametrize("command, stated", [
    ("serve", ["--host HOST address to listen on (0.0.0.0 for every interface) (default: 127.0.0.1)",
               "--port PORT port to listen on (default: 8000)", "--max-batch-size MAX_BATCH_SIZE most sequences "
               "running at once (default: 256)", "--block-size BLOCK_SIZE tokens per KV-cache block, a power of two "
               "(default: 16)", "sampling in requests that give no seed (default: 0)",
               "--gpu-memory-utilization GPU_MEMORY_UTILIZATION share", "at most 0.9) (default: 0.9)",
               "--max-step-ms MAX_STEP_MS", "(token budget only) (default: auto)",
               "--enable-prefix-caching, --no-enable-prefix-caching reuse", "computed (default: True)",
               "--dtype {auto,bfloat16,float16,float32} the activations' dtype", "else bfloat16) (default: auto)",
               "--log-level {debug,info,warning,error} the least severe log lines written to stderr (default: info)"]),
    ("tune", ["seconds of sweeping (the seeds of each sweep run past it) (default: 300.0)"]),
    ("plan", ["'fp8' plans the attention kernels that read an e4m3 KV cache (default: auto)"]),
])
def test_help_states_each_default(capsys, monkeypatch, command, stated):
    monkeypatch.setenv("COLUMNS", "2000")  # argparse wraps at the terminal's width
    with pytest.raises(SystemExit):
        main([command, "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert [s for s in stated if s not in text] == []
    # no default for what has none, and none stated twice
    assert "(default: None)" not in text and "(default: False)" not in text and "(default: [])" not in text
    assert "(default: the --model path) (default" not in text
