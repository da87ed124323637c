"""Shared data for the deploy tests: recorded host facts, an inventory with deploy: vars, a fake wheelhouse."""

from __future__ import annotations

import time
from pathlib import Path

from hosttune.build.wheelhouse import Entry, WheelKey, describe_wheels, write_manifest
from hosttune.inventory import load_inventory
from hosttune.probes.gather import parse_probe_output

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"

INVENTORY = """\
defaults:
  pins: {python: "3.10"}
groups:
  a100:
    vars:
      gpus: "0-3"
      deploy:
        port: 8100
        lb_port: 8080
        env: {NCCL_DEBUG: WARN}
        vllm: {gpu-memory-utilization: 0.95, enable-prefix-caching: false, max-num-seqs: 128}
        sglang: {mem-fraction-static: 0.85, schedule-policy: fcfs}
    hosts:
      gpu-a:
        address: 10.0.0.11
        deploy:
          vllm: {max-model-len: 32768}
      gpu-b:
        address: 10.0.0.12
  ray:
    vars:
      deploy: {multinode: true}
    hosts:
      node-0: {address: 10.0.1.10}
      node-1: {address: 10.0.1.11}
      node-2: {address: 10.0.1.12}
"""


def a100_facts():
    """4 A100s, GPUs 0-1 on NUMA node 0 and 2-3 on node 1, numactl installed, systemd."""
    return parse_probe_output((FIXTURES / "a100-4gpu-2numa" / "probe-output.txt").read_text())


def h200_facts():
    """The lent H200 box: PID 1 is not systemd."""
    return parse_probe_output((FIXTURES / "h200" / "probe-output.txt").read_text())


def inventory(tmp_path: Path):
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / "inventory.yaml"
    path.write_text(INVENTORY)
    return load_inventory(path)


def fake_entry(wheelhouse: Path, engine: str = "vllm", archs=("8.0",), cuda: str | None = "12.4",
               abi: str = "cp310", ref: str = "v0.11.0-0123456789ab", built_at: float | None = None) -> Entry:
    """A complete wheelhouse entry with a (fake) wheel of the engine."""
    key = WheelKey(engine, ref, tuple(archs), cuda, abi)
    path = wheelhouse / key.name
    (path / "wheels").mkdir(parents=True)
    tag = "py3-none-any" if not archs else f"{abi}-{abi}-linux_x86_64"
    (path / "wheels" / f"{engine}-1.0-{tag}.whl").write_bytes(f"wheel of {key.name}".encode())
    entry = Entry(path, key, tuple(describe_wheels(path / "wheels", "engine")), "src", None,
                  built_at or time.time(), 1.0, {})
    write_manifest(entry)
    return entry
