"""The vLLM, SGLang and Ray units deploy renders pass `systemd-analyze verify`
on a real systemd host, through deploy's own verify step; a broken one does not. And systemd
reads back exactly the argv and environment hosttune quoted into a unit.
"""
from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from hosttune.build.wheelhouse import Entry, WheelFile, WheelKey
from hosttune.deploy.executor import OperationFailed, run_ops
from hosttune.deploy.placement import place
from hosttune.deploy.plan import Role, WriteFile, make_release, verify_ops
from hosttune.deploy.release import meta_dir
from hosttune.deploy.settings import parse_sets, resolve
from hosttune.deploy.units import UnitSpec, render_unit
from hosttune.inventory import Host, load_inventory
from hosttune.presets import load_preset
from hosttune.probes.gather import parse_probe_output
from hosttune.transport import open_transport

pytestmark = pytest.mark.live
A100 = Path(__file__).resolve().parents[1] / "fixtures" / "a100-4gpu-2numa" / "probe-output.txt"
ENTRY = Entry(Path("/nonexistent"), WheelKey("vllm", "v0", ("8.0",), "12.4", "cp311"),
              (WheelFile("vllm-0-cp311-cp311-linux_x86_64.whl", "0" * 64, 1),), "src", None, 0.0, 0.0)


def releases():
    facts = parse_probe_output(A100.read_text())
    host = Host("gpu", "g", None, deploy={"vllm": {"max-model-len": 16384}, "env": {"NCCL_DEBUG": "WARN"}})
    made = {}
    for engine in ("vllm", "sglang"):
        settings = resolve(host, load_preset(engine), "/models/m", 8000, parse_sets(["env.HF_HOME=/var/cache/hf"]))
        made[engine] = make_release(load_preset(engine), settings, place("2-3", facts, "gpu"), ENTRY)
    settings = resolve(host, load_preset("vllm"), "/models/m", 8000, parse_sets([]))
    for kind in ("head", "worker"):
        made[f"ray-{kind}"] = make_release(load_preset("vllm"), settings, place("0-3", facts, "gpu"), ENTRY,
                                           Role(kind, 2, "10.0.0.2" if kind == "worker" else "10.0.0.1", "10.0.0.1"))
    return made


def stub_binaries(host, release) -> None:
    """The release's venv executables as stubs: verify checks that ExecStart names an executable."""
    host.exec(f"mkdir -p {release.dir}/bin && for b in vllm python ray; do printf '#!/bin/sh\\n' > {release.dir}/bin/$b; "
              f"chmod +x {release.dir}/bin/$b; done")


def test_rendered_units_pass_systemd_analyze_verify(live_fleet, fresh_hosts, tmp_path):
    (host,) = fresh_hosts(["units"])
    known = live_fleet.write_known_hosts(tmp_path / "known_hosts", [host])
    inv = load_inventory(live_fleet.write_inventory(tmp_path / "inv.yaml", known, [host]))
    transport = open_transport(inv.hosts[0].connection)
    try:
        for name, release in releases().items():
            stub_binaries(host, release)
            writes = [WriteFile(f"{meta_dir(release.id)}/{unit}", body) for unit, body in release.units.items()]
            assert run_ops(transport, writes + verify_ops(release)) == len(writes) + 2, name
            unit = host.path(f"{meta_dir(release.id)}/hosttune-{'ray' if name.startswith('ray') else 'serve'}.service").read_text()
            assert "/usr/bin/numactl --cpunodebind=" in unit and "CUDA_VISIBLE_DEVICES=" in unit
        broken = releases()["sglang"]
        host.exec(f"rm {broken.dir}/bin/python")  # ExecStart names a program that is not there
        with pytest.raises(OperationFailed, match=f"{broken.dir}/bin/python is not executable"):
            run_ops(transport, verify_ops(broken))
        unit_file = f"{meta_dir(broken.id)}/hosttune-serve.service"
        host.path(unit_file).write_text(host.path(unit_file).read_text().replace("Restart=always", "Restart=sometimes"))
        host.exec(f"touch {broken.dir}/bin/python && chmod +x {broken.dir}/bin/python")
        with pytest.raises(OperationFailed, match="Failed to parse service restart specifier"):
            run_ops(transport, verify_ops(broken))
    finally:
        transport.close()


def test_systemd_reads_back_the_quoted_argv_and_environment(fresh_hosts):
    (host,) = fresh_hosts(["quoting"])
    argv = ["a b", 'q"uote', "50%", "$HOME", "${HOME}", "back\\slash", ";", "", "tab\there", "it's"]
    env = {"PLAIN": "x", "SPACED": "a b c", "PERCENT": "100%", "DOLLAR": "$HOME", "QUOTES": "say \"hi\" 'there'"}
    program = ("import json, os, sys, time; print(json.dumps([sys.argv[1:], {k: os.environ.get(k) for k in %s}]), flush=True); "
               "time.sleep(3600)") % sorted(env)
    spec = UnitSpec("hosttune-quoting.service", "quoting 100% test", ("/usr/bin/python3", "-c", program, *argv), env)
    host.path("/etc/systemd/system/hosttune-quoting.service").write_bytes(render_unit(spec, "test"))
    host.exec("systemctl daemon-reload && systemctl start hosttune-quoting.service")
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        out = host.exec("journalctl -u hosttune-quoting.service -o cat --no-pager | grep '^\\[' | head -1", check=False).stdout
        if out.strip():
            break
        time.sleep(0.3)
    assert json.loads(out) == [argv, env]
