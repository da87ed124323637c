"""The vLLM, SGLang and Ray units deploy renders pass `systemd-analyze verify` on a real systemd
host, through deploy's own verify step, and so do the replica template, probe service and timer
of a host running several replicas (its nginx config passes the host's `nginx -t`); a broken one
does not. And systemd reads back exactly the argv and environment hosttune quoted into a unit,
per replica instance too (its own environment file and the group's key file).
"""
from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from hosttune.build.wheelhouse import Entry, WheelFile, WheelKey
from hosttune.deploy.access import Access
from hosttune.deploy.model import ModelShape
from hosttune.deploy.placement import LayoutRequest, place, plan_layout
from hosttune.actions.base import FileWrite
from hosttune.deploy.plan import Role, make_release, verify_ops
from hosttune.execute.perform import OperationFailed, run_ops
from hosttune.deploy.release import meta_dir
from hosttune.deploy.replicas import NGINX_CONF, SERVERS_FILE, make_layout_release
from hosttune.deploy.settings import parse_sets, resolve
from hosttune.deploy.replicas import NUMA_VAR, PORT_VAR
from hosttune.deploy.units import REPLICA_TEMPLATE, UnitSpec, render_unit, variable
from hosttune.config.inventory import Host, load_inventory
from hosttune.presets import load_preset
from hosttune.probes.gather import parse_probe_output
from hosttune.transport import open_transport

pytestmark = pytest.mark.live
SEVEN_B = ModelShape("/models/m", True, 28, 4, 15 * 10**9, architectures=("Qwen2ForCausalLM",))
TWO_GPU = ModelShape("/models/big", True, 40, 8, 100 * 10**9, architectures=("LlamaForCausalLM",))
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
    for engine in ("vllm", "sglang"):  # 4 replicas of a 7B model, and 2 × TP 2 of a larger one
        for name, model in (("7b", SEVEN_B), ("tp2", TWO_GPU)):
            settings = resolve(host, load_preset(engine), model.path, 8000, parse_sets([]))
            layout = plan_layout(LayoutRequest("0-3"), facts, model, "gpu", 8000)
            made[f"{engine}-replicas-{name}"] = make_layout_release(load_preset(engine), settings, layout, ENTRY)
    # keyed: each instance reads the group's key file too; SGLang's through the key launcher
    settings = resolve(host, load_preset("sglang"), SEVEN_B.path, 8000, parse_sets([]))
    layout = plan_layout(LayoutRequest("0-3"), facts, SEVEN_B, "gpu", 8000)
    made["sglang-replicas-keyed"] = make_layout_release(load_preset("sglang"), settings, layout, ENTRY,
                                                        access=Access("g", "ht-render-key-0123456789abcdef"))
    return made


def stub_binaries(host, release) -> None:
    """The release's venv executables as stubs: verify checks that ExecStart names an executable."""
    host.exec(f"mkdir -p {release.dir}/bin && for b in vllm python ray; do printf '#!/bin/sh\\n' > {release.dir}/bin/$b; "
              f"chmod +x {release.dir}/bin/$b; done")


def test_rendered_units_pass_systemd_analyze_verify(live_fleet, fresh_hosts, tmp_path):
    (host,) = fresh_hosts(["units"])
    known = live_fleet.write_known_hosts(tmp_path / "known_hosts", [host])
    inv = load_inventory(live_fleet.write_inventory(tmp_path / "inv.yaml", known, [host]))
    with open_transport(inv.hosts[0].connection) as transport:
        for name, release in releases().items():
            stub_binaries(host, release)
            writes = [FileWrite(f"{meta_dir(release.id)}/{unit}", body) for unit, body in {**release.units, **release.meta}.items()]
            assert run_ops(transport, writes + verify_ops(release)) == len(writes) + 2, name
            unit = host.path(f"{meta_dir(release.id)}/{next(iter(release.units))}").read_text()
            assert "/usr/bin/numactl --cpunodebind=" in unit
            assert "CUDA_VISIBLE_DEVICES=" in unit or "EnvironmentFile=" in unit
            if release.replicas:  # the host-local nginx config passes the host's own nginx -t
                host.path(NGINX_CONF).write_bytes(release.files[NGINX_CONF])
                host.path(SERVERS_FILE).parent.mkdir(parents=True, exist_ok=True)
                host.path(SERVERS_FILE).write_text("".join(f"server 127.0.0.1:{r['port']};\n" for r in release.replicas))
                assert "test is successful" in host.exec("nginx -t 2>&1").stdout, name
        broken = releases()["sglang"]
        host.exec(f"rm {broken.dir}/bin/python")  # ExecStart names a program that is not there
        with pytest.raises(OperationFailed, match=f"{broken.dir}/bin/python is not executable"):
            run_ops(transport, verify_ops(broken))
        unit_file = f"{meta_dir(broken.id)}/hosttune-serve.service"
        host.path(unit_file).write_text(host.path(unit_file).read_text().replace("Restart=always", "Restart=sometimes"))
        host.exec(f"touch {broken.dir}/bin/python && chmod +x {broken.dir}/bin/python")
        with pytest.raises(OperationFailed, match="Failed to parse service restart specifier"):
            run_ops(transport, verify_ops(broken))
        replicas = releases()["vllm-replicas-7b"]  # the template is checked too, not skipped
        template = host.path(f"{meta_dir(replicas.id)}/hosttune-engine@.service")
        template.write_text(template.read_text().replace("KillMode=mixed", "KillMode=sometimes"))
        with pytest.raises(OperationFailed, match="hosttune-engine@.service"):
            run_ops(transport, verify_ops(replicas))


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


def test_each_replica_instance_reads_its_own_environment_file(fresh_hosts):
    (host,) = fresh_hosts(["instances"])
    program = ("import json, os, sys, time; print(json.dumps([sys.argv[1:], os.environ.get('CUDA_VISIBLE_DEVICES'), "
               "os.environ.get('HOSTTUNE_ENGINE_API_KEY') == 'ht-shared-key-0123456789abcdef']), flush=True); "
               "time.sleep(3600)")
    spec = UnitSpec(REPLICA_TEMPLATE, "replica test", ("/usr/bin/python3", "-c", program, "--port", variable(PORT_VAR),
                                                       f"--node={variable(NUMA_VAR)}"), {"A": "b"},
                    environment_files=("/etc/hosttune-test/replica-%i.env", "/etc/hosttune-test/keys.env"),
                    variables=(PORT_VAR, NUMA_VAR))
    host.path("/etc/systemd/system/" + REPLICA_TEMPLATE).write_bytes(render_unit(spec, "test"))
    host.path("/etc/hosttune-test").mkdir()
    host.path("/etc/hosttune-test/keys.env").write_text("HOSTTUNE_ENGINE_API_KEY=ht-shared-key-0123456789abcdef\n")
    for i in range(2):
        host.path(f"/etc/hosttune-test/replica-{i}.env").write_text(
            f"HOSTTUNE_PORT={8001 + i}\nCUDA_VISIBLE_DEVICES={2 * i},{2 * i + 1}\nHOSTTUNE_NUMA={i}\n")
    host.exec("systemctl daemon-reload && systemctl start hosttune-engine@0.service hosttune-engine@1.service")
    seen = {}
    deadline = time.monotonic() + 30
    while len(seen) < 2 and time.monotonic() < deadline:
        for i in range(2):
            out = host.exec(f"journalctl -u hosttune-engine@{i}.service -o cat --no-pager | grep '^\\[' | head -1",
                            check=False).stdout
            if out.strip():
                seen[i] = json.loads(out)
        time.sleep(0.3)
    # each its own port, GPUs and node; both the group's key from the one key file
    assert seen == {0: [["--port", "8001", "--node=0"], "0,1", True], 1: [["--port", "8002", "--node=1"], "2,3", True]}

