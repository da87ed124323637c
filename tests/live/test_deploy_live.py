"""Build the bundled engine's wheel, deploy it on a real systemd host over SSH with
the tiny model on CPU, gate it, reach it with the `openai` client; redeploy (nothing changes);
deploy a broken release (it fails the gate, shows the journal, the previous release serves
again); --rollback.

The host has no torch: `hosttune build --deps` puts the engine's dependency wheels (the CPU
torch wheel on this machine's disk, pinned as scripts/test.sh pins it) into the wheelhouse,
deploy uploads them once (content-addressed, ~480 MB, a few seconds over loopback SSH) and
installs the first release with `pip install --no-index` (~20-30 s on 2 cores); later releases
with the same wheels are hard-link clones (seconds). The whole test: ~100 s on a 2-core VM.
"""
from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest


from .deploy_setup import MODEL, QUICK_START_SETS, free_port, invoke_deploy

pytestmark = [pytest.mark.live, pytest.mark.timeout(1500), pytest.mark.live_seconds(95)]


def deploy(inventory: Path, wheelhouse: Path, port: int, *extra: str, model: str = MODEL):
    argv = ["deploy", "--yes", "--engine", "custom", "--model", model, "-i", str(inventory),
            "-w", str(wheelhouse), "--port", str(port), "--set", "device=cpu", "--set", "max-batch-size=8",
            "--health-timeout", "240", *QUICK_START_SETS, *extra]
    start = time.monotonic()
    result = invoke_deploy(*argv)
    return result, time.monotonic() - start


def complete(port: int, model: str) -> str:
    import openai

    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", timeout=60)
    out = client.completions.create(model=model, prompt="The capital of France is", max_tokens=4, temperature=0)
    assert out.choices and out.usage.completion_tokens >= 1
    return out.choices[0].text


def show(host, *props: str) -> dict[str, str]:
    out = host.exec(["systemctl", "show", "hosttune-serve.service", *(f"--property={p}" for p in props)]).stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def test_deploy_custom_engine_gate_redeploy_broken_rollback(live_fleet, fresh_hosts, tmp_path, wheelhouse, tiny_model, capsys):
    (host,) = fresh_hosts(["serve1"])
    shutil.copytree(tiny_model, host.path(MODEL))
    known = live_fleet.write_known_hosts(tmp_path / "known_hosts", [host])
    inventory = live_fleet.write_inventory(tmp_path / "inv.yaml", known, [host], user="deploy", become=True)
    port = free_port()
    timings = {}

    # 1. first deploy: upload, venv, unit, start, warmup, gate
    result, timings["first deploy"] = deploy(inventory, wheelhouse, port)
    assert result.exit_code == 0, result.output
    line = result.stdout.splitlines()[0]
    assert "deployed" in line and "warmup 3 requests" in line and "one-token generation" in line
    release = line.split()[2]
    assert release.startswith("custom-")
    assert host.exec("systemctl is-active hosttune-serve.service").stdout.strip() == "active"
    assert host.exec("readlink /opt/hosttune/current").stdout.strip() == f"/opt/hosttune/releases/{release}"
    unit = host.path("/etc/systemd/system/hosttune-serve.service").read_text()
    assert "CUDA_VISIBLE_DEVICES" not in unit  # a CPU replica has no GPU
    for expected in ("Restart=always", "TimeoutStopSec=45", "LimitNOFILE=1048576",
                     f"ExecStart=/opt/hosttune/releases/{release}/bin/hosttune-engine serve --model {MODEL}",
                     f"--port {port}", "--device cpu", "--max-batch-size 8", "--shutdown-timeout 30"):
        assert expected in unit
    assert "numactl" not in unit  # one NUMA node: nothing to bind
    text = complete(port, MODEL)
    assert isinstance(text, str)
    first = show(host, "MainPID", "ExecMainStartTimestampMonotonic")

    # 2. the same release again: nothing changes, the process keeps running
    result, timings["redeploy"] = deploy(inventory, wheelhouse, port)
    assert result.exit_code == 0, result.output
    assert result.stdout.split()[1:3] == ["unchanged", release]
    assert show(host, "MainPID", "ExecMainStartTimestampMonotonic") == first
    result, _ = deploy(inventory, wheelhouse, port, "--set", "max-queue=4", "--dry-run")  # the plan, nothing done
    assert result.exit_code == 0, result.output
    assert result.stdout.split()[1] == "planned" and "link /opt/hosttune/current -> /opt/hosttune/releases/custom-" in result.stdout
    assert "systemd-analyze verify" in result.stdout and "systemctl restart hosttune-serve.service" in result.stdout
    assert show(host, "MainPID", "ExecMainStartTimestampMonotonic") == first
    assert host.exec("ls /opt/hosttune/releases").stdout.split() == [release]

    # 3. a model folder the host lacks, or one without its weights, is refused before anything changes; a
    #    broken one (its weights file cut short) fails the gate, the journal shows why, the previous release
    #    is put back and serves
    result, _ = deploy(inventory, wheelhouse, port, model="/srv/models/missing")
    assert result.exit_code == 2 and "the model folder /srv/models/missing does not exist on the host" in result.stdout
    unweighted = "/srv/models/unweighted"
    shutil.copytree(tiny_model, host.path(unweighted), ignore=shutil.ignore_patterns("*.safetensors"))
    result, _ = deploy(inventory, wheelhouse, port, model=unweighted)
    assert result.exit_code == 2 and f"the model folder {unweighted} has no weights (*.safetensors)" in result.stdout
    assert host.exec("readlink /opt/hosttune/current").stdout.strip() == f"/opt/hosttune/releases/{release}"
    broken = "/srv/models/broken"
    shutil.copytree(tiny_model, host.path(broken))
    weights = host.path(f"{broken}/model.safetensors")
    weights.write_bytes(weights.read_bytes()[:64])  # a copy that stopped: its header is cut
    result, timings["broken deploy"] = deploy(inventory, wheelhouse, port, model=broken)
    assert result.exit_code == 2, result.output
    out = result.stdout
    assert out.split()[1] == "failed" and "gate failed at health" in out
    assert "journal of the service (last lines):" in out and broken in out
    assert f"previous release {release} put back and serving" in out
    assert host.exec("readlink /opt/hosttune/current").stdout.strip() == f"/opt/hosttune/releases/{release}"
    assert host.exec("test -e /opt/hosttune/previous", check=False).returncode != 0  # as before the failed deploy
    assert f"--model {MODEL}" in host.path("/etc/systemd/system/hosttune-serve.service").read_text()
    complete(port, MODEL)

    # 4. a second good release, then --rollback to the first; keeping two releases, the broken one's folder goes
    #    (never the first: --rollback goes back to it)
    assert len(host.exec("ls /opt/hosttune/releases").stdout.split()) == 2
    result, timings["second release"] = deploy(inventory, wheelhouse, port, "--set", "max-queue=16",
                                               "--keep-releases", "2")
    assert result.exit_code == 0, result.output
    second = result.stdout.split()[2]
    assert sorted(host.exec("ls /opt/hosttune/releases").stdout.split()) == sorted([release, second])
    assert second != release and "--max-queue 16" in host.path("/etc/systemd/system/hosttune-serve.service").read_text()
    # Same wheels, other flags: the virtualenv was cloned as hard links, its scripts re-pointed, the first left alone.
    torch_init = "lib/python3.11/site-packages/torch/__init__.py"
    inodes = host.exec(f"stat -c %i /opt/hosttune/releases/{release}/{torch_init} /opt/hosttune/releases/{second}/{torch_init}").stdout.split()
    assert inodes[0] == inodes[1]
    for rid in (release, second):
        assert host.path(f"/opt/hosttune/releases/{rid}/bin/hosttune-engine").read_text().startswith(f"#!/opt/hosttune/releases/{rid}/bin/python")
    start = time.monotonic()
    result = invoke_deploy("deploy", "--rollback", "--yes", "-i", str(inventory), "--health-timeout", "240")
    timings["rollback"] = time.monotonic() - start
    assert result.exit_code == 0, result.output
    assert result.stdout.split()[1:3] == ["rolled-back", release]
    assert host.exec("readlink /opt/hosttune/current").stdout.strip() == f"/opt/hosttune/releases/{release}"
    assert host.exec("readlink /opt/hosttune/previous").stdout.strip() == f"/opt/hosttune/releases/{second}"
    assert "--max-queue" not in host.path("/etc/systemd/system/hosttune-serve.service").read_text()
    complete(port, MODEL)
    with capsys.disabled():
        print("\n  deploy timings: " + ", ".join(f"{k} {v:.1f}s" for k, v in timings.items()))
