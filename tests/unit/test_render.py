"""vLLM, SGLang and Ray units and the nginx upstream rendered from an inventory
carry the GPU, NUMA and flag settings it asked for; the nginx config passes `nginx -t`.
(tests/live/test_deploy_render_live.py runs `systemd-analyze verify` on them on a systemd host.)
"""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from hosttune.fleet_runner import Outcome
from hosttune.deploy.placement import place
from hosttune.deploy.plan import Role, make_release
from hosttune.deploy.balancer import upstreams
from hosttune.deploy.rollout import DeployRequest
from hosttune.deploy.host import HostDeploy
from hosttune.deploy.settings import parse_sets, resolve
from hosttune.deploy.units import RAY_UNIT, SERVE_UNIT, Upstream, render_nginx
from hosttune.presets import load_preset

from deploy_fixtures import a100_facts, fake_entry, inventory


def vllm_release(tmp_path, gpus="2-3", sets=(), role=Role(), host_name="gpu-a"):
    inv = inventory(tmp_path)
    host = next(h for h in inv.hosts if h.name == host_name)
    preset = load_preset("vllm")
    settings = resolve(host, preset, "/models/qwen2.5-7b", None, parse_sets(list(sets)))
    placement = place(gpus, a100_facts(), host.name)
    entry = fake_entry(tmp_path / "wh")
    return make_release(preset, settings, placement, entry, role), settings, placement


def test_vllm_unit_has_gpus_numa_and_flags_from_inventory_and_set(tmp_path):
    release, settings, placement = vllm_release(tmp_path, sets=["max-num-seqs=64", "env.VLLM_LOGGING_LEVEL=DEBUG"])
    unit = release.units[SERVE_UNIT].decode()
    assert list(release.units) == [SERVE_UNIT]
    assert placement.numa_nodes == (1,)  # GPUs 2 and 3 hang off node 1 in the recorded A100 host
    venv = f"/opt/hosttune/releases/{release.id}"
    assert (f"ExecStart=/usr/bin/numactl --cpunodebind=1 --membind=1 {venv}/bin/vllm serve /models/qwen2.5-7b "
            "--host 0.0.0.0 --port 8100 --gpu-memory-utilization 0.95 --max-num-seqs 64 "
            "--max-model-len 32768 --max-num-batched-tokens 8192 --enable-chunked-prefill --no-enable-prefix-caching "
            "--tensor-parallel-size 2\n") in unit
    for line in ("Environment=CUDA_DEVICE_ORDER=PCI_BUS_ID", "Environment=CUDA_VISIBLE_DEVICES=2,3",
                 "Environment=NCCL_DEBUG=WARN", "Environment=VLLM_LOGGING_LEVEL=DEBUG",
                 "Environment=VLLM_WORKER_MULTIPROC_METHOD=spawn", "Restart=always", "TimeoutStopSec=45",
                 "LimitNOFILE=1048576", f"WorkingDirectory={venv}", f"(release {release.id})"):
        assert line in unit
    assert "@RELEASE@" not in unit


def test_gpus_on_two_nodes_bind_both_and_one_node_binds_none(tmp_path):
    release, _, placement = vllm_release(tmp_path, gpus="1-2")
    assert placement.numa_nodes == (0, 1)
    assert "--cpunodebind=0,1 --membind=0,1" in release.units[SERVE_UNIT].decode()
    single = a100_facts()
    from dataclasses import replace
    single = replace(single, numa_nodes={0: tuple(range(64))})
    assert place("0-3", single, "h").numactl_prefix() == ()


def test_release_id_is_stable_and_follows_settings(tmp_path):
    a, _, _ = vllm_release(tmp_path / "a")
    b, _, _ = vllm_release(tmp_path / "b")
    c, _, _ = vllm_release(tmp_path / "c", sets=["max-num-seqs=64"])
    assert a.id == b.id != c.id and a.id.startswith("vllm-")


def test_sglang_unit(tmp_path):
    inv = inventory(tmp_path)
    host = inv.hosts[1]
    preset = load_preset("sglang")
    settings = resolve(host, preset, "/models/llama-3-8b", 30000, parse_sets(["chunked-prefill-size=4096", "enable-metrics=false"]))
    release = make_release(preset, settings, place("0-1", a100_facts(), host.name), fake_entry(tmp_path / "wh", "sglang"))
    unit = release.units[SERVE_UNIT].decode()
    assert (f"ExecStart=/usr/bin/numactl --cpunodebind=0 --membind=0 /opt/hosttune/releases/{release.id}/bin/python "
            "-m sglang.launch_server --model-path /models/llama-3-8b --host 0.0.0.0 --port 30000 "
            "--mem-fraction-static 0.85 --chunked-prefill-size 4096 --max-running-requests 256 --schedule-policy fcfs --tp-size 2\n") in unit
    assert "--enable-metrics" not in unit  # false, and SGLang has no --no- form: left out
    assert "Environment=CUDA_VISIBLE_DEVICES=0,1" in unit and "TimeoutStopSec=45" in unit


def test_multinode_vllm_units_ray_head_worker_and_server(tmp_path):
    head, _, _ = vllm_release(tmp_path / "h", gpus="0-3", host_name="node-0",
                              role=Role("head", 3, "10.0.1.10", "10.0.1.10"))
    worker, _, _ = vllm_release(tmp_path / "w", gpus="0-3", host_name="node-1",
                                role=Role("worker", 3, "10.0.1.11", "10.0.1.10"))
    assert list(head.units) == [RAY_UNIT, SERVE_UNIT] and list(worker.units) == [RAY_UNIT]
    ray_head = head.units[RAY_UNIT].decode()
    assert f"/opt/hosttune/releases/{head.id}/bin/ray start --head --block --port=6379 --node-ip-address=10.0.1.10 --num-gpus=4" in ray_head
    assert "--cpunodebind=0,1" in ray_head and "Environment=CUDA_VISIBLE_DEVICES=0,1,2,3" in ray_head
    serve = head.units[SERVE_UNIT].decode()
    assert "Requires=hosttune-ray.service" in serve and "After=network-online.target hosttune-ray.service" in serve
    assert "--tensor-parallel-size 4" in serve and "--distributed-executor-backend ray --pipeline-parallel-size 3" in serve
    assert "--address=10.0.1.10:6379 --node-ip-address=10.0.1.11" in worker.units[RAY_UNIT].decode()


def test_hostile_values_are_quoted_for_systemd(tmp_path):
    release, _, _ = vllm_release(tmp_path, sets=['served-model-name=my "model" 100%', "env.PROMPT=a b$c"])
    unit = release.units[SERVE_UNIT].decode()
    assert '--served-model-name "my \\"model\\" 100%%"' in unit
    assert 'Environment="PROMPT=a b$c"' in unit


def nginx_upstream(tmp_path) -> Upstream:
    inv = inventory(tmp_path)
    outcomes = [HostDeploy(h, Outcome.DEPLOYED, "r", "r") for h in inv.hosts]
    (found,) = upstreams(inv, outcomes)  # the ray group serves one model: no upstream
    return found


def test_nginx_upstream_for_a_group_of_replicas(tmp_path):
    upstream = nginx_upstream(tmp_path)
    assert upstream.backends == ("10.0.0.11:8100", "10.0.0.12:8100") and upstream.listen == 8080
    conf = render_nginx(upstream).decode()
    for line in ("upstream hosttune_a100 {", "least_conn;", "server 10.0.0.11:8100 max_fails=3 fail_timeout=10s;",
                 "listen 8080;", "proxy_buffering off;", "proxy_http_version 1.1;",
                 "proxy_next_upstream error timeout http_502 http_503 non_idempotent;", "proxy_pass http://hosttune_a100;"):
        assert line in conf


@pytest.mark.skipif(shutil.which("nginx") is None and os.environ.get("HOSTTUNE_REQUIRE_LIVE") != "1",
                    reason="nginx not installed (scripts/test.sh installs nginx-light as root)")
def test_nginx_config_passes_nginx_t(tmp_path):
    conf = tmp_path / "conf.d" / "hosttune-a100.conf"
    conf.parent.mkdir()
    conf.write_bytes(render_nginx(nginx_upstream(tmp_path)))
    (tmp_path / "logs").mkdir()
    main = tmp_path / "nginx.conf"
    main.write_text(f"pid {tmp_path}/nginx.pid;\nerror_log {tmp_path}/logs/error.log;\nevents {{}}\n"
                    f"http {{\n    access_log {tmp_path}/logs/access.log;\n    include {conf};\n}}\n")
    result = subprocess.run(["nginx", "-t", "-p", str(tmp_path), "-c", str(main)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert "syntax is ok" in result.stderr and "test is successful" in result.stderr
    conf.write_text(conf.read_text().replace("least_conn;", "least_conn"))  # and a broken one fails
    assert subprocess.run(["nginx", "-t", "-p", str(tmp_path), "-c", str(main)], capture_output=True).returncode != 0
