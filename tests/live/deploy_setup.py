"""What the deploy live tests share: the tiny model (written once with torch on this machine), the
bundled engine's wheelhouse with every dependency wheel (built once; both once a run, whichever xdist
worker needs them first), free ports; a fresh host with the
tiny model and an inventory declaring its replicas, and what a test of keyed replicas does to them
(deploy, read the group's key, ask through nginx, wait)."""
from __future__ import annotations

import fcntl
import os
import random
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, TypeVar

import pytest
from typer.testing import CliRunner

from hosttune.cli import app

from .hosts import LiveHost
from .steady_bench import bench_run, stop_bench

T = TypeVar("T")
REPO = Path(__file__).resolve().parents[2]
MODEL = "/srv/models/tiny-qwen2"
# The bundled engine's flags that leave out what it does at each start and no live test looks at: its own warmup
# generations and the step-cost measurement of its step budget (together 4-8 s a start on 2 cores, and a replica
# starts at every roll). hosttune's gate still waits for /health, sends its warmup requests and a one-token generation.
QUICK_START = {"skip-warmup": True, "max-step-ms": "off"}
QUICK_START_SETS = ("--set", "skip-warmup=true", "--set", "max-step-ms='off'")  # quoted: YAML reads a bare off as false
runner = CliRunner()


def _torch_python() -> str | None:
    """An interpreter that can write the tiny model (torch, safetensors, tokenizers)."""
    for python in (os.environ.get("HOSTTUNE_TORCH_PYTHON"), sys.executable):
        if python and subprocess.run([python, "-c", "import torch, safetensors, tokenizers"],
                                     capture_output=True).returncode == 0:
            return python
    return None


def built_once(tmp_path_factory, name: str, build: Callable[[Path], Path]) -> Path:
    """What `build(folder)` returns, made once a run: under pytest-xdist the workers share the run's temp folder (the
    parent of each one's own), where the first to ask builds while any other waits for it and then takes the same."""
    if os.environ.get("PYTEST_XDIST_WORKER") is None:
        return build(tmp_path_factory.mktemp(name))
    shared = tmp_path_factory.getbasetemp().parent / "shared"
    shared.mkdir(exist_ok=True)
    with open(shared / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        done = shared / f"{name}.done"  # written last: a worker that failed building leaves none
        if not done.exists():
            folder = shared / name
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir()
            done.write_text(str(build(folder)))
        return Path(done.read_text())


def make_tiny_model(out: Path) -> Path:
    python = _torch_python()
    if python is None:
        why = "no Python with torch to write the tiny model (scripts/test.sh installs it; or set HOSTTUNE_TORCH_PYTHON)"
        if os.environ.get("HOSTTUNE_REQUIRE_LIVE") == "1":
            pytest.fail(why)
        pytest.skip(why)
    subprocess.run([python, str(REPO / "engine/scripts/make_tiny_models.py"), str(out)], check=True,
                   capture_output=True, timeout=600)
    return out / "tiny-qwen2"


def build_wheelhouse(folder: Path) -> Path:
    """`hosttune build --engine custom --deps` into folder: the engine wheel plus every dependency wheel."""
    constraints = folder / "constraints.txt"
    constraints.write_text("torch==2.13.0\n")  # the CPU wheel on disk (scripts/test.sh pins the same)
    result = runner.invoke(app, ["build", "--engine", "custom", "--deps", "-c", str(constraints), "-w", str(folder)])
    assert result.exit_code == 0, result.output
    assert "hosttune_engine-0.1.0-py3-none-any.whl" in result.stdout and "dependency wheels" in result.stdout
    return folder


def _is_free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def free_port(count: int = 1) -> int:
    """A port with the count - 1 after it free too (a host's nginx and its replicas). Above the hosts' SSH
    ports (hosts.PORT_RANGE) and below Linux's ephemeral range (32768-60999 by default), where no outgoing
    connection on the machine can take one before its server binds it."""
    for _ in range(100):
        port = random.randrange(30000, 32700 - count)
        if all(_is_free(port + i) for i in range(count)):
            return port
    raise RuntimeError("no free port")


@dataclass(frozen=True)
class Deployed:
    """A deploy command's result, its stdout cut to the recap after the plan (the plan itself when
    nothing was deployed: a dry run, a refusal, an unchanged release)."""

    exit_code: int
    stdout: str
    output: str
    plan: str


def invoke_deploy(*argv: str) -> Deployed:
    result = runner.invoke(app, list(argv))
    plan, _, rest = result.stdout.partition("\nplan: ")
    after = rest.split("\n", 1)[1] if "\n" in rest else ""
    return Deployed(result.exit_code, after if after.strip() else plan, result.output, plan)


@dataclass(frozen=True)
class ReplicaHost:
    """A fresh host holding the tiny model at MODEL, and an inventory that declares its deployment
    (`deploy:` vars) on the service port `port` and the ports after it."""

    host: LiveHost
    port: int
    inventory: Path


def replica_host(live_fleet, fresh_hosts, tmp_path: Path, tiny_model: Path, name: str,
                 shape: Callable[[int], dict], num_ports: int) -> ReplicaHost:
    """Boots host `name`, copies the tiny model in, and writes its inventory (login deploy, sudo) with
    `shape(port)` as its deploy: vars, `port` the first of `num_ports` free ones."""
    (host,) = fresh_hosts([name])
    shutil.copytree(tiny_model, host.path(MODEL))
    known = live_fleet.write_known_hosts(tmp_path / "known_hosts", [host])
    port = free_port(num_ports)
    inventory = live_fleet.write_inventory(tmp_path / "inv.yaml", known, [host], user="deploy", become=True,
                                           host_vars={host.name: {"deploy": shape(port)}})
    return ReplicaHost(host, port, inventory)


def deploy(inventory: Path, wheelhouse: Path, *extra: str) -> Deployed:
    """`hosttune deploy --yes` with no option of the deployment's shape unless `extra` gives one."""
    return invoke_deploy("deploy", "--yes", "-i", str(inventory), "-w", str(wheelhouse),
                         "--keys-dir", str(inventory.parent / "keys"), *extra)


def group_key(inventory: Path) -> str:
    """The key deploy generated for the inventory's group (deploy.api_key: true)."""
    (path,) = (inventory.parent / "keys").glob("*.key")
    return path.read_text().strip()


def status(port: int, key: str | None) -> int:
    """The HTTP status of GET /v1/models on the port, with the key or none."""
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(f"http://127.0.0.1:{port}/v1/models", headers=headers),
                                    timeout=30) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def served(port: int) -> float:
    """Requests the live engine has finished, from its own /metrics."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        lines = resp.read().decode().splitlines()
    return sum(float(line.rsplit(" ", 1)[1]) for line in lines if line.startswith("vllm:request_success_total"))


def wait_for(what: str, check, timeout: float, every: float = 0.5):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(every)
    raise AssertionError(f"not within {timeout:.0f}s: {what}")


def complete(port: int, key: str) -> None:
    """One real completion through the port with the `openai` client."""
    import openai

    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=key, timeout=60)
    out = client.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=2, temperature=0)
    assert out.choices and out.usage.completion_tokens >= 1


def under_load(work: Callable[[], T], bench: subprocess.Popen, out: Path) -> tuple[T, float, list[dict]]:
    """`work()`'s result and seconds, and the requests of `bench` (`hosttune bench --out out` started before it
    for far longer than any change takes, steady_bench.LONGEST_S), stopped with Ctrl-C once the work is done:
    the load never ends before the change under it has."""
    began = time.monotonic()
    result = work()
    seconds = time.monotonic() - began
    stop_bench(bench)
    return result, seconds, bench_run(out)["requests"]
