"""A corpus of hostile or broken inventories: each one is exit 2 with FILE:LINE, in bounded time and memory.

Every case runs the real CLI (`python -m hosttune check -i FILE`) in a process of its own under an
address-space limit, so a case that would allocate without bound fails here instead of taking
the machine down; its CPU time and peak RSS are measured from the child's own rusage.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MAX_SECONDS = 5.0  # of the child's CPU time
CPU_LIMIT_S = 30  # a child past it is killed: the test fails, the machine lives
MAX_RSS_MB = 200
HOST = "hosts:\n  gpu-01:\n    transport: local\n"

BOMB = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [*{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, "
    f"*{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}]\n" for i in range(8))

# name → (file bytes, the line the error must name, a word the message must contain)
CORPUS: dict[str, tuple[bytes, int, str]] = {
    "latin-1 bytes": (b"# caf\xe9 fleet\nhosts:\n  gpu-01: {}\n", 1, "UTF-8"),
    "latin-1 on line 3": (b"hosts:\n  gpu-01:\n    address: caf\xe9.example\n", 3, "UTF-8"),
    "utf-16 with BOM": ("hosts:\n  gpu-01: {}\n".encode("utf-16"), 1, "UTF-16"),
    "utf-16 without BOM": ("hosts:\n  gpu-01: {}\n".encode("utf-16-le"), 1, "UTF-16"),
    "nul byte": (b"hosts:\n  gpu-01: {}\n  gpu-02:\x00 {}\n", 3, "not allowed"),
    "raw escape character": (b"hosts:\n  gpu-01: {}\n  \x1b[2Kfake: {}\n", 3, "not allowed"),
    "list as a mapping key": (b"hosts:\n  ? [a, b]\n  : {}\n", 2, "mapping key"),
    "mapping as a mapping key": (b"hosts:\n  gpu-01: {}\n  {a: 1}: {}\n", 3, "mapping key"),
    "nested 10000 levels": (("hosts:\n  gpu-01:\n    tune: " + "[" * 10000 + "]" * 10000 + "\n").encode(), 3, "nested deeper"),
    "nested mappings": (("hosts:\n  gpu-01:\n    tune: " + "{a: " * 5000 + "1" + "}" * 5000 + "\n").encode(), 3, "nested deeper"),
    "alias bomb": ((BOMB + HOST + "    tune: {cpu: {governor: *i}}\n").encode(), 5, "alias"),
    "cpu list far past the host": ((HOST + '    irq_cores: "0-99999999999"\n').encode(), 4, "irq_cores"),
    "cpu list past linux": ((HOST + '    rcu_nocbs: "0-9000"\n').encode(), 4, "largest CPU"),
    "gpu list past linux": ((HOST + '    gpus: "0-123456"\n').encode(), 4, "gpus"),
    "address of 300 characters": ((HOST + f"    address: {'a' * 300}.example\n").encode(), 4, "address"),
    "address label of 64": ((HOST + f"    address: {'b' * 64}.example\n").encode(), 4, "address"),
    "non-ascii address": ((HOST + "    address: gpü-01.example\n").encode(), 4, "xn--"),
    "address with a shell word": ((HOST + "    address: 'gpu-01;reboot'\n").encode(), 4, "address"),
    "known_hosts is a directory": ((HOST + "    ssh: {known_hosts: /tmp}\n").encode(), 4, "directory"),
    "key is a directory": (b"defaults:\n  ssh:\n    key: /\nhosts:\n  gpu-01: {}\n", 3, "directory"),
    "escape sequence in a host name": (b'hosts:\n  gpu-01: {}\n  "gpu-02\\e[1A\\e[2K  gpu-02  ok": {}\n', 3, "not a valid name"),
    "newline in a host name": (b'hosts:\n  "gpu-01\\nfake-host ok": {}\n', 2, "not a valid name"),
    "newline in a group name": (b'groups:\n  "a\\nb":\n    hosts: {gpu-01: {}}\n', 2, "not a valid name"),
    "unknown profile": ((HOST + "    profile: no-such-profile\n").encode(), 4, "unknown profile"),
    "unknown profile in defaults": (b"defaults:\n  profile: nope\nhosts:\n  gpu-01: {}\n", 2, "unknown profile"),
    "bad value under tune": ((HOST + "    tune:\n      cpu:\n        max_cstate: -1\n").encode(), 6, "tune.cpu.max_cstate"),
    "bad choice under tune": (b"defaults:\n  tune:\n    gpu: {pstate: P99}\nhosts:\n  gpu-01: {}\n", 3, "tune.gpu.pstate"),
    "unknown section under tune": ((HOST + "    tune:\n      cpus: {governor: performance}\n").encode(), 5, "tune.cpus"),
    "tune section not a mapping": ((HOST + "    tune: {cpu: 5}\n").encode(), 4, "tune.cpu"),
    "unknown setting under tune": ((HOST + "    tune: {irq: {balance: false}}\n").encode(), 4, "tune.irq.balance"),
    "tune cpu list past linux": ((HOST + "    tune: {kernel: {rcu_nocbs: 0-99999}}\n").encode(), 4, "tune.kernel.rcu_nocbs"),
    "probe timeout not a number": ((HOST + "    probe_timeout: soon\n").encode(), 4, "probe_timeout"),
    "probe timeout NaN": ((HOST + "    probe_timeout: .nan\n").encode(), 4, "probe_timeout"),
    "ssh timeout infinite": ((HOST + "    ssh: {timeout: .inf}\n").encode(), 4, "ssh.timeout"),
    "defaults an empty list": (b"defaults: []\nhosts:\n  gpu-01: {}\n", 1, "defaults: must be a mapping"),
    "group vars an empty list": (b"groups:\n  g:\n    vars: []\n    hosts: {gpu-01: {}}\n", 3, "vars: must be a mapping"),
    "huge value in an error": ((HOST + f"    ssh: {{port: '{'9' * 100000}'}}\n").encode(), 4, "port"),
    "top level is a list": (b"- gpu-01\n- gpu-02\n", 1, "mapping"),
    "unclosed flow mapping": (b"hosts:\n  gpu-01: {address: x\n", 3, "invalid YAML"),
}


# One child loads the command line once; each case runs in a process forked from it, with its own address-space
# and CPU limits, so a case costs what reading its file costs and not a Python start and hosttune's imports (half
# a second of CPU, once per case). The forked process reports its own peak, VmHWM (the loaded command line's pages
# included, as a child that imported it itself would count them), and its CPU time comes from wait4's rusage.
# A pytest worker's own pages (torch) never count: the loader is a fresh interpreter.
LOADER = """
import json, os, resource, runpy, sys, traceback
import hosttune.cli  # noqa: F401
limit_s = int(sys.argv[1])


def case(path):
    resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))
    resource.setrlimit(resource.RLIMIT_CPU, (limit_s, limit_s))
    os.chdir(os.path.dirname(path))
    os.dup2(os.open(path + ".err", os.O_WRONLY | os.O_CREAT | os.O_TRUNC), 2)
    os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
    sys.argv = ["hosttune", "check", "-i", path]
    code = 1
    try:
        runpy.run_module("hosttune", run_name="__main__")
        code = 0
    except SystemExit as e:
        code = 0 if e.code is None else e.code if isinstance(e.code, int) else 1
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        peak = next(l for l in open("/proc/self/status") if l.startswith("VmHWM:")).split()[1]
        open(path + ".peak", "w").write(peak)
        os._exit(code)


for line in sys.stdin:
    path = json.loads(line)
    pid = os.fork()
    if pid == 0:
        case(path)
    _, status, usage = os.wait4(pid, 0)
    print(json.dumps([os.waitstatus_to_exitcode(status), usage.ru_utime + usage.ru_stime]), flush=True)
"""


@pytest.fixture(scope="module")
def loader():
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-c", LOADER, str(CPU_LIMIT_S)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, env=env, text=True)
    yield proc
    proc.stdin.close()
    proc.wait(30)


def _bounded(loader: subprocess.Popen, path: Path) -> tuple[int, str, float, float]:
    """(exit code, stderr, CPU seconds, peak RSS MB) of the CLI on `path`. CPU time, not wall time: it is
    what a hostile file can cost the controller, and it holds on a machine busy with other work."""
    loader.stdin.write(json.dumps(str(path)) + "\n")
    loader.stdin.flush()
    reply = loader.stdout.readline()
    assert reply, f"the loader exited {loader.poll()}"
    code, seconds = json.loads(reply)
    peak = Path(f"{path}.peak")
    rss_mb = int(peak.read_text()) / 1024 if peak.exists() else float("inf")
    return code, Path(f"{path}.err").read_text(encoding="utf-8", errors="replace"), seconds, rss_mb


@pytest.mark.parametrize("name", list(CORPUS))
def test_hostile_inventory_is_exit_2_with_file_line_in_bounded_time_and_memory(loader, tmp_path, name):
    """Each corpus entry through the CLI once, in its own process."""
    data, line, word = CORPUS[name]
    path = tmp_path / (re.sub(r"\W+", "-", name) + ".yaml")
    path.write_bytes(data)
    code, err, seconds, rss_mb = _bounded(loader, path)
    assert code == 2, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert f"{path}:{line}: " in err and word in err, err
    assert seconds < MAX_SECONDS, f"{seconds:.1f} CPU-s"
    assert rss_mb < MAX_RSS_MB, f"{rss_mb:.0f} MB"
