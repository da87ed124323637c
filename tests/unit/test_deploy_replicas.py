"""Replicas × tensor parallel from recorded facts (4-GPU 2-NUMA A100, 8-GPU 2-NUMA H100): the layout,
each replica's unit environment (GPUs, NUMA node, port), the host-local nginx, the refusals, the
vLLM release pinned per CUDA, and the rolling restart over a scripted transport."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from hosttune.deploy import host as dhost
from hosttune.deploy import rollout
from hosttune.deploy.errors import DeployError
from hosttune.deploy.recap import render
from hosttune.fleet_runner import Outcome, exit_code
from hosttune.deploy.model import ModelShape, model_problem, parse_model
from hosttune.deploy.placement import LayoutRequest, plan_layout
from hosttune.deploy.replicas import NGINX_CONF, SCRAPE_FILE, local_upstream, make_layout_release
from hosttune.deploy.settings import parse_sets, resolve
from hosttune.deploy.units import REPLICA_TEMPLATE, render_nginx
from hosttune.presets import PresetError, load_preset
from hosttune.transport.base import CommandResult
from scripted_server.launch import running

from deploy_fixtures import FIXTURES, ScriptedTransport, a100_facts, fake_entry, fleet_of, h100_facts, inventory

GB = 10**9
QWEN = ("Qwen2ForCausalLM",)
QWEN_7B = ModelShape("/models/qwen2.5-7b", True, 28, 4, int(15.23 * GB), architectures=QWEN)  # fits one 80 GB GPU
QWEN_72B = ModelShape("/models/qwen2.5-72b", True, 64, 8, int(145.4 * GB), architectures=QWEN)  # needs four
TWO_GPU = ModelShape("/models/two-gpu", True, 40, 8, int(100 * GB), architectures=("LlamaForCausalLM",))  # 50 GB a shard at TP 2 fits in 60 GiB


def layout(facts, model, gpus="all", tp=None, replicas="per-gpu", port=8000, device=None, per_gpu=1):
    return plan_layout(LayoutRequest(gpus, tp, replicas, device, per_gpu), facts, model, "gpu-01", port)


def shape(result):
    return [(r.gpus, r.numa_nodes, r.port) for r in result.replicas]


# -- placement ---------------------------------------------------------------------------------


def test_a_7b_model_on_the_4_gpu_host_is_4_replicas_each_on_its_gpus_node():
    result = layout(a100_facts(), QWEN_7B, "0-3")
    assert result.tensor_parallel == 1 and result.is_balanced
    assert shape(result) == [((0,), (0,), 8001), ((1,), (0,), 8002), ((2,), (1,), 8003), ((3,), (1,), 8004)]
    assert "TP 1: the smallest that divides 28 heads" in result.reason


def test_a_model_needing_two_gpus_is_2_replicas_of_tp_2_within_a_node():
    result = layout(a100_facts(), TWO_GPU, "0-3")
    assert result.tensor_parallel == 2
    assert shape(result) == [((0, 1), (0,), 8001), ((2, 3), (1,), 8002)]
    assert shape(layout(a100_facts(), QWEN_72B, "0-3")) == [((0, 1, 2, 3), (0, 1), 8000)]  # one replica: the port itself


def test_the_8_gpu_host_gives_8_replicas_and_tp_layouts_stay_on_a_node():
    facts = h100_facts()
    assert shape(layout(facts, QWEN_7B)) == [((i,), (i // 4,), 8001 + i) for i in range(8)]
    assert shape(layout(facts, QWEN_7B, tp=4)) == [((0, 1, 2, 3), (0,), 8001), ((4, 5, 6, 7), (1,), 8002)]
    assert shape(layout(facts, QWEN_72B)) == [((0, 1, 2, 3), (0,), 8001), ((4, 5, 6, 7), (1,), 8002)]
    assert shape(layout(facts, QWEN_72B, tp=8)) == [(tuple(range(8)), (0, 1), 8000)]
    assert shape(layout(facts, QWEN_7B, replicas="3")) == [((0,), (0,), 8001), ((1,), (0,), 8002), ((2,), (0,), 8003)]
    # GPUs 1-3 on node 0, 4-6 on node 1: what a node cannot fill is pooled, and bound to both nodes
    assert shape(layout(facts, QWEN_7B, "1-6", tp=2)) == [((1, 2), (0,), 8001), ((4, 5), (1,), 8002), ((3, 6), (0, 1), 8003)]


def test_replicas_sharing_a_gpu_each_get_their_own_port_on_the_same_gpu():
    result = layout(a100_facts(), QWEN_7B, "0-1", per_gpu=4)
    assert shape(result) == [((g,), (0,), 8001 + 4 * g + i) for g in (0, 1) for i in range(4)]
    assert result.replicas_per_gpu == 4 and [r.index for r in result.replicas] == list(range(8))
    assert result.reason.endswith("; 4 replicas a GPU, each with 1/4 of its memory")
    assert shape(layout(a100_facts(), QWEN_7B, "0", replicas="3", per_gpu=4)) == [((0,), (0,), 8001 + i) for i in range(3)]


def test_cpu_replicas_have_no_gpus_and_their_own_ports():
    result = layout(a100_facts(), ModelShape("/m", True, 4, 2, 10**6), replicas="2", device="cpu", port=9000)
    assert shape(result) == [((), (), 9001), ((), (), 9002)]


@pytest.mark.parametrize("kwargs, message", [
    (dict(model=QWEN_7B, tp=3), "--tensor-parallel 3 does not divide /models/qwen2.5-7b's 28 attention heads "
                                "(4 KV heads); use one of 1, 2, 4"),
    (dict(model=QWEN_7B, gpus="0-5"), "--gpus 0-5 asks for GPU 4,5, but the host has GPUs 0-3"),
    (dict(model=QWEN_7B, tp=8), "--tensor-parallel 8 needs 8 GPUs, but --gpus gives 4"),
    (dict(model=QWEN_72B, tp=2), "a 1/2 shard of /models/qwen2.5-72b (72.7 GB) is more than 75% of a GPU's 80 GiB"),
    (dict(model=QWEN_72B, gpus="0-1"), "/models/qwen2.5-72b (145.4 GB of weights) does not fit 2 GPUs of 80 GiB"),
    (dict(model=QWEN_7B, tp=2, replicas="3"), "--replicas 3 at TP 2 needs 6 GPUs, but --gpus all gives 4"),
    (dict(model=QWEN_7B, gpus="0", replicas="5", per_gpu=4),
     "--replicas 5 at TP 1 and 4 replicas a GPU needs 2 GPUs, but --gpus 0 gives 1"),
    (dict(model=TWO_GPU, tp=2, per_gpu=2), "a 1/2 shard of /models/two-gpu (50.0 GB) is more than 75% of a GPU's "
                                           "40 GiB (1/2 of a GPU); use a larger --tensor-parallel or fewer than 2 "
                                           "replicas a GPU"),
    (dict(model=ModelShape("/m", True, 4, 2, 10**6), replicas="2", device="cpu", per_gpu=2),
     "--replicas-per-gpu 2: CPU replicas have no GPU to share; give --replicas instead"),
])
def test_refusals_are_one_line_naming_what_to_change(kwargs, message):
    with pytest.raises(DeployError) as info:
        layout(a100_facts(), **kwargs)
    assert message in str(info.value) and "\n" not in str(info.value)


def _quantized(quant: dict, intermediate: int, heads: int = 64, weights_gb: float = 41.0) -> ModelShape:
    """A config.json with a quantization_config (Qwen2.5-72B's shape, 128-dim heads) and its weights."""
    config = {"architectures": list(QWEN), "num_attention_heads": heads, "num_key_value_heads": 8,
              "hidden_size": heads * 128, "intermediate_size": intermediate, "quantization_config": quant}
    return parse_model("/models/q", "dir:\nconfig-begin:\n" + json.dumps(config) + "\nconfig-end:\n"
                       f"weights:{int(weights_gb * GB)} model.safetensors\n")


AWQ_72B = _quantized({"quant_method": "awq", "bits": 4, "group_size": 128, "version": "gemm"}, 29568)


def test_a_quantized_model_parses_to_the_columns_a_shard_must_be_whole_groups_of():
    assert (AWQ_72B.quant_unit, AWQ_72B.quant, AWQ_72B.row_inputs) == (128, "awq groups", (8192, 29568))
    fp8 = _quantized({"quant_method": "fp8", "weight_block_size": [128, 128]}, 29568)
    assert (fp8.quant_unit, fp8.quant) == (128, "fp8 blocks")
    per_row = _quantized({"quant_method": "gptq", "bits": 4, "group_size": -1}, 29568)  # one group a row: any split
    assert per_row.quant_unit is None and QWEN_7B.quant_unit is None


@pytest.mark.parametrize("model, tp, message", [
    (AWQ_72B, 2, "gpu-01: --tensor-parallel 2 does not split /models/q's quantized weights: a 1/2 shard of its "
                 "29568 input columns (14784) is not whole 128-column awq groups; use one of 1"),
    (_quantized({"quant_method": "fp8", "weight_block_size": [128, 128]}, 29568, weights_gb=73), 4,
     "gpu-01: --tensor-parallel 4 does not split /models/q's quantized weights: a 1/4 shard of its 29568 input "
     "columns (7392) is not whole 128-column fp8 blocks; use one of 1"),
])
def test_a_tensor_parallel_that_cuts_quantized_groups_is_refused(model, tp, message):
    """vLLM, SGLang and the bundled engine all refuse a row-parallel shard that is not whole groups (blocks)."""
    with pytest.raises(DeployError) as info:
        layout(a100_facts(), model, tp=tp)
    assert str(info.value) == message


def test_the_tensor_parallel_chosen_for_a_quantized_model_keeps_its_groups_whole():
    padded = _quantized({"quant_method": "awq", "bits": 4, "group_size": 128}, 29696, weights_gb=120)  # 1 GPU: no
    assert layout(a100_facts(), padded).tensor_parallel == 2  # 14848 = 116 groups
    unpadded = replace(padded, row_inputs=(8192, 29568))
    with pytest.raises(DeployError, match="does not fit 4 GPUs of 80 GiB at any TP that divides its 64 heads and keeps its 128-column awq groups whole"):
        layout(a100_facts(), unpadded)


def test_model_folder_parses_to_heads_and_weight_bytes():
    config = {"architectures": ["Qwen2ForCausalLM"], "num_attention_heads": 28, "num_key_value_heads": 4}
    text = ("dir:\nconfig-begin:\n" + json.dumps(config) +
            "\nconfig-end:\nweights:4000000000 model-00001-of-00002.safetensors\nweights:3000000000 model-00002.safetensors\n")
    assert parse_model("/m", text) == ModelShape("/m", True, 28, 4, 7 * GB, architectures=QWEN, weight_names=(
        "model-00001-of-00002.safetensors", "model-00002.safetensors"))
    assert parse_model("/m", "missing:\n") == ModelShape("/m", False)
    assert parse_model("/m", "dir:\n").error == "no readable config.json"


@pytest.mark.parametrize("model, supported, problem", [
    (QWEN_7B, ("LlamaForCausalLM", "Qwen2ForCausalLM"), ""),
    (QWEN_7B, (), ""),  # an engine that names no architectures loads any
    (ModelShape("/m", False), (), "does not exist on the host"),
    (parse_model("/m", "dir:\n"), (), "has no readable config.json"),
    (parse_model("/m", "dir:\nconfig-begin:\n{\nconfig-end:\n"), (), "cannot be loaded: config.json is not JSON"),
    (replace(QWEN_7B, architectures=("MixtralForCausalLM",)), ("LlamaForCausalLM",),
     "is MixtralForCausalLM (config.json), which the engine does not load (it loads LlamaForCausalLM)"),
])
def test_a_model_folder_the_engine_cannot_load_says_why(model, supported, problem):
    assert model_problem(model, supported).startswith(problem) and (problem or not model_problem(model, supported))


def _folder(*lines: str) -> ModelShape:
    config = {"architectures": ["Qwen2ForCausalLM"], "num_attention_heads": 28, "num_key_value_heads": 4}
    return parse_model("/m", "dir:\nconfig-begin:\n" + json.dumps(config) + "\nconfig-end:\n" + "".join(f"{x}\n" for x in lines))


INDEX = json.dumps({"metadata": {}, "weight_map": {"a": "model-00001-of-00003.safetensors",
                                                   "b": "model-00002-of-00003.safetensors",
                                                   "c": "model-00003-of-00003.safetensors"}})


@pytest.mark.parametrize("model, any_format, problem", [
    (_folder("weights:100 model.safetensors"), False, ""),
    (_folder(), False, "has no weights (*.safetensors); copy them there, or --set load-format=dummy for random weights"),
    (_folder("other:pytorch_model.bin"), False, "has no weights (*.safetensors)"),
    (_folder("other:pytorch_model.bin"), True, ""),  # vLLM and SGLang load .bin checkpoints too
    (_folder(), True, "has no weights (*.safetensors, *.bin, *.pt or *.pth)"),
    (_folder("index-begin:", INDEX, "index-end:", "weights:100 model-00001-of-00003.safetensors"), False,
     "lacks 2 of the 3 shards model.safetensors.index.json lists (model-00002-of-00003.safetensors, "
     "model-00003-of-00003.safetensors): a copy that has not finished?"),
    (_folder("index-begin:", INDEX, "index-end:", *(f"weights:100 model-0000{i}-of-00003.safetensors" for i in (1, 2, 3))),
     False, ""),
    (_folder("index-begin:", "{", "index-end:", "weights:100 model.safetensors"), False,
     "cannot be loaded: model.safetensors.index.json is not a safetensors index"),
])
def test_a_model_folder_without_all_its_weights_is_refused_before_anything_is_sent(model, any_format, problem):
    found = model_problem(model, (), any_format=any_format)
    assert found.startswith(problem) and (problem or not found), found


def test_a_model_loaded_with_dummy_weights_needs_none(tmp_path):
    from hosttune.deploy.preconditions import model_needs_weights

    assert model_needs_weights(job(tmp_path / "a", a100_facts(), engine="custom", gpus="0"))
    assert not model_needs_weights(job(tmp_path / "b", a100_facts(), engine="custom", gpus="0",
                                       overrides=parse_sets(["load-format=dummy"])))


# -- units, nginx, probe, scrape -------------------------------------------------------------------


def replica_release(tmp_path, engine="custom", model=QWEN_7B, facts=None, sets=(), **kwargs):
    inv = inventory(tmp_path)
    host = inv.hosts[0]
    preset = load_preset(engine)
    settings = resolve(host, preset, model.path, None, parse_sets(list(sets)))
    result = plan_layout(LayoutRequest(**{"gpus": "0-3", **kwargs}), facts or a100_facts(), model, host.name, settings.port)
    entry = fake_entry(tmp_path / "wh", engine, archs=() if engine == "custom" else ("8.0",),
                       cuda=None if engine == "custom" else "12.4")
    return make_layout_release(preset, settings, result, entry, host.name)


def env_of(release, index) -> dict[str, str]:
    return dict(line.split("=", 1) for line in release.meta[f"replica-{index}.env"].decode().splitlines())


def test_each_replica_is_an_instance_of_one_template_with_its_gpus_node_and_port(tmp_path):
    release = replica_release(tmp_path)
    assert list(release.units) == [REPLICA_TEMPLATE, "hosttune-probe.service", "hosttune-probe.timer"]
    unit = release.units[REPLICA_TEMPLATE].decode()
    venv = f"/opt/hosttune/releases/{release.id}"
    assert f"EnvironmentFile={venv}/.hosttune/replica-%i.env\n" in unit
    assert (f"ExecStart=/usr/bin/numactl --cpunodebind=${{HOSTTUNE_NUMA}} --membind=${{HOSTTUNE_NUMA}} {venv}/bin/hosttune-engine "
            "serve --model /models/qwen2.5-7b --host 127.0.0.1 --port ${HOSTTUNE_PORT} --device cuda --shutdown-timeout 30 --enable-prefix-caching\n") in unit
    assert "Restart=always" in unit and "TimeoutStopSec=45" in unit and "KillMode=mixed" in unit
    assert [env_of(release, i) for i in range(4)] == [
        {"HOSTTUNE_PORT": str(8101 + i), "CUDA_VISIBLE_DEVICES": str(i), "HOSTTUNE_NUMA": str(i // 2)} for i in range(4)]
    assert [r["port"] for r in release.replicas] == [8101, 8102, 8103, 8104]
    timer = release.units["hosttune-probe.timer"].decode()
    assert "OnUnitActiveSec=10" in timer and f"{venv}/.hosttune/replica_lb.py probe" in release.units["hosttune-probe.service"].decode()
    assert "\nSyslogIdentifier=hosttune\n" in release.units["hosttune-probe.service"].decode()  # not "env"
    targets = json.loads(release.files[SCRAPE_FILE])
    assert [t["targets"] for t in targets] == [[f"127.0.0.1:{8101 + i}"] for i in range(4)]  # on loopback only
    assert targets[2]["labels"] == {"job": "hosttune", "host": "gpu-a", "engine": "custom", "replica": "2", "gpus": "2"}


@pytest.mark.parametrize("engine, sets, flag", [
    ("custom", (), "--gpu-memory-utilization 0.225"),  # the engine's own 0.9, split four ways
    ("vllm", ("gpu-memory-utilization=0.95",), "--gpu-memory-utilization 0.237"),  # what the inventory set, split
    ("sglang", (), "--mem-fraction-static 0.212"),  # the test inventory's 0.85
])
def test_replicas_sharing_a_gpu_each_get_their_part_of_its_memory(tmp_path, engine, sets, flag):
    release = replica_release(tmp_path, engine, QWEN_7B, sets=sets, gpus="0", per_gpu=4)
    argv = release.units[REPLICA_TEMPLATE].decode().split("ExecStart=")[1].split("\n")[0].split()
    name, value = flag.split()
    assert argv[argv.index(name) + 1] == value and argv.count(name) == 1
    assert [env_of(release, i)["CUDA_VISIBLE_DEVICES"] for i in range(4)] == ["0"] * 4
    alone = replica_release(tmp_path / "alone", engine, QWEN_7B, sets=sets).units[REPLICA_TEMPLATE].decode()
    assert flag not in alone


def test_sharing_a_gpu_on_an_engine_without_a_memory_flag_is_refused(tmp_path):
    from hosttune.deploy.plan import check_sharing

    preset = load_preset("custom")
    bare = replace(preset, serve=replace(preset.serve, memory_flag=None))
    shared = layout(a100_facts(), QWEN_7B, "0", per_gpu=2)
    check_sharing(preset, shared, "gpu-01")
    check_sharing(bare, layout(a100_facts(), QWEN_7B, "0"), "gpu-01")
    with pytest.raises(DeployError, match="^gpu-01: custom has no memory flag in its preset"):
        check_sharing(bare, shared, "gpu-01")


def test_vllm_and_sglang_replicas_get_their_tp_flag(tmp_path):
    vllm = replica_release(tmp_path / "v", "vllm", TWO_GPU).units[REPLICA_TEMPLATE].decode()
    assert "--tensor-parallel-size 2\n" in vllm and "--disable-log-requests" not in vllm
    sglang = replica_release(tmp_path / "s", "sglang", TWO_GPU).units[REPLICA_TEMPLATE].decode()
    assert "--model-path /models/two-gpu" in sglang and "--tp-size 2\n" in sglang
    one = replica_release(tmp_path / "o", "vllm", QWEN_7B).units[REPLICA_TEMPLATE].decode()
    assert "tensor-parallel-size" not in one  # TP 1 is every engine's default


def test_host_local_nginx_balances_over_the_replicas_file(tmp_path):
    conf = replica_release(tmp_path).files[NGINX_CONF].decode()
    for line in ("upstream hosttune_local {", "least_conn;", "include /etc/hosttune/nginx/local-servers.conf;",
                 "listen 8100 default_server;", "proxy_next_upstream error timeout http_502 http_503 non_idempotent;",
                 "proxy_next_upstream_tries 4;", "proxy_buffering off;", "keepalive 64;", "keepalive_timeout 60s;"):
        assert line in conf
    assert "hash" not in conf and "ssl" not in conf  # no deploy.nginx: plain http on the service port
    assert conf.splitlines()[0] == "# Managed by hosttune deploy: this host's nginx front over its custom engine."


def host_local_conf(tmp_path, affinity: bool) -> str:
    inv = inventory(tmp_path)
    preset = load_preset("custom")
    settings = replace(resolve(inv.hosts[0], preset, "/m", None, parse_sets([])), session_affinity=affinity)
    result = plan_layout(LayoutRequest("0-3"), a100_facts(), QWEN_7B, "h", settings.port)
    return render_nginx(local_upstream(preset, settings, result)).decode()


def test_session_affinity_hashes_the_session_header(tmp_path):
    conf = host_local_conf(tmp_path, True)
    assert "hash $hosttune_local_key consistent;" in conf and "least_conn" not in conf
    assert "map $http_x_session_id $hosttune_local_key {" in conf and '"" $request_id;' in conf


@pytest.mark.skipif(shutil.which("nginx") is None and os.environ.get("HOSTTUNE_REQUIRE_LIVE") != "1",
                    reason="nginx not installed (scripts/test.sh installs nginx-light as root)")
@pytest.mark.parametrize("affinity", [False, True])
def test_host_local_nginx_passes_nginx_t(tmp_path, affinity):
    servers = tmp_path / "local-servers.conf"
    servers.write_text("server 127.0.0.1:8101 max_fails=3 fail_timeout=10s;\n"
                       "server 127.0.0.1:8102 max_fails=3 fail_timeout=10s down;\n")
    conf = tmp_path / "hosttune-local.conf"
    conf.write_text(host_local_conf(tmp_path / "inv", affinity).replace("/etc/hosttune/nginx/local-servers.conf", str(servers)))
    (tmp_path / "logs").mkdir()
    main = tmp_path / "nginx.conf"
    main.write_text(f"pid {tmp_path}/nginx.pid;\nerror_log {tmp_path}/logs/error.log;\nevents {{}}\n"
                    f"http {{\n    access_log {tmp_path}/logs/access.log;\n    include {conf};\n}}\n")
    result = subprocess.run(["nginx", "-t", "-p", str(tmp_path), "-c", str(main)], capture_output=True, text=True)
    assert result.returncode == 0 and "test is successful" in result.stderr, result.stderr
    servers.write_text("")  # an upstream with no server is refused: replica_lb.py always lists every replica
    assert subprocess.run(["nginx", "-t", "-p", str(tmp_path), "-c", str(main)], capture_output=True).returncode != 0


def test_a_7b_model_on_the_8_gpu_host_renders_8_instances(tmp_path):
    release = replica_release(tmp_path, facts=h100_facts(), gpus="all")
    assert [(env_of(release, i)["CUDA_VISIBLE_DEVICES"], env_of(release, i)["HOSTTUNE_NUMA"]) for i in range(8)] == \
        [(str(i), str(i // 4)) for i in range(8)]


# -- engine releases per CUDA ----------------------------------------------------------------------


def job(tmp_path, facts, engine="vllm", model=QWEN_7B, **request):
    inv = inventory(tmp_path)
    abi = rollout._python(inv.hosts[0], facts)[1]
    fake_entry(tmp_path / "wh", engine, archs=("8.0", "9.0"), ref="v0.11.0-0123456789ab", abi=abi)
    fake_entry(tmp_path / "wh", engine, archs=("8.0", "9.0"), ref="v0.20.1-0123456789ab", cuda="13.0", built_at=1.0, abi=abi)
    req = rollout.DeployRequest(engine, model.path, tmp_path / "wh", **request)
    return rollout.make_job(inv.hosts[0], facts, req, model=model)


def test_vllm_release_follows_the_hosts_cuda(tmp_path):
    cuda12 = job(tmp_path / "a", a100_facts(), gpus="0-3")
    assert cuda12.entry.key.ref.startswith("v0.11.0-") and "shutdown-timeout" not in cuda12.settings.flags
    cuda13 = job(tmp_path / "b", h100_facts(), gpus="all")
    assert cuda13.entry.key.ref.startswith("v0.20.1-") and cuda13.settings.flags["shutdown-timeout"] == 30
    unit = cuda13.release.units[REPLICA_TEMPLATE].decode()
    assert "--shutdown-timeout 30" in unit and "TimeoutStopSec=45" in unit and len(cuda13.release.replicas) == 8
    old = replace(a100_facts(), gpu=replace(a100_facts().gpu, cuda_driver_version="11.8"))
    with pytest.raises(PresetError, match="its driver supports CUDA 11.8; vllm releases are pinned for CUDA 12.x"):
        job(tmp_path / "c", old)
    with pytest.raises(PresetError, match=r"^h: no NVIDIA driver reports a CUDA version here; vllm releases are pinned for "
                                          r"CUDA 12.x .*: install the driver \(hosttune apply\) or deploy with --ref$"):
        load_preset("vllm").release_for(None, "h")  # not a driver that supports "CUDA unknown"


def test_a_missing_model_folder_is_refused(tmp_path):
    with pytest.raises(DeployError, match="the model folder /models/qwen2.5-7b does not exist on the host"):
        job(tmp_path, a100_facts(), model=replace(QWEN_7B, exists=False))


# -- rolling restart over a scripted transport --------------------------------------------------------


def lb_calls(log):
    return [(a[2], a[3:]) if a[0] == "python3" and a[1].endswith("replica_lb.py") else ("restart", a[2])
            for _, a in log if (a[0] == "python3" and a[1].endswith("replica_lb.py")) or a[:2] == ("systemctl", "restart")]


def test_a_redeploy_rolls_one_replica_at_a_time(tmp_path):
    j = job(tmp_path, a100_facts(), engine="custom", gpus="0-3", replicas="2",
            overrides=parse_sets(["device=cuda"]))
    running = "".join(f"instance:hosttune-engine@{i}.service active\n" for i in range(2))
    log: list = []
    t = ScriptedTransport("gpu-a", log, state=f"current:/opt/hosttune/releases/custom-old\n{running}nginx:/usr/sbin/nginx\n")
    outcome = dhost.deploy_one(t, j)
    assert outcome.state == "deployed", outcome.error
    assert lb_calls(log) == [("sync", ()), ("out", ("0",)), ("restart", "hosttune-engine@0.service"), ("in", ("0",)),
                             ("out", ("1",)), ("restart", "hosttune-engine@1.service"), ("in", ("1",))]
    gates = [json.loads(a[3])["port"] for _, a in log if a[:2] == ("python3", "-c") and "UNKNOWN" not in a[2]]
    assert gates == [8101, 8102]  # each replica's gate, on its own port, between its restart and its return


def test_a_first_deploy_marks_new_replicas_out_until_their_gate(tmp_path):
    j = job(tmp_path, a100_facts(), engine="custom", gpus="0-1")
    log: list = []
    outcome = dhost.deploy_one(ScriptedTransport("gpu-a", log, state="nginx:/usr/sbin/nginx\n"), j)
    assert outcome.state == "deployed"
    assert lb_calls(log)[:2] == [("out", ("0", "1")), ("out", ("0",))]


class NewReplicaOneFails(ScriptedTransport):
    """Replica 1's gate fails while `current` is the new release; everything else passes."""

    new_dir = current = ""
    failing_port = 8102

    def _command(self, argv, stdin, timeout):
        argv = tuple(argv)
        if argv[:2] == ("sh", "-c") and len(argv) > 6 and argv[4] == "link" and argv[5] == "/opt/hosttune/current":
            self.current = argv[6]
        if argv[:2] == ("python3", "-c") and "UNKNOWN" not in argv[2]:
            self.gate_ok = not (json.loads(argv[3])["port"] == self.failing_port and self.current == self.new_dir)
        return super()._command(argv, stdin, timeout)


def test_a_replica_failing_its_gate_puts_back_the_replicas_that_moved(tmp_path):
    j = job(tmp_path, a100_facts(), engine="custom", gpus="0-3", replicas="2")
    old = replace(j.release, id="custom-old")
    running = "".join(f"instance:hosttune-engine@{i}.service active\n" for i in range(2))
    log: list = []
    t = NewReplicaOneFails("gpu-a", log, state=f"current:{old.dir}\n{running}nginx:/usr/sbin/nginx\n")
    t.new_dir = j.release.dir
    t.files[f"{old.dir}/.hosttune/release.json"] = old.manifest()
    for name, body in {**old.units, **old.meta, "host-hosttune-local.conf": old.files[NGINX_CONF],
                       "host-hosttune-replicas.json": old.files[SCRAPE_FILE]}.items():
        t.files[f"{old.dir}/.hosttune/{name}"] = body
    outcome = dhost.deploy_one(t, j)
    assert outcome.state == "failed" and outcome.restored == "custom-old" and outcome.serving == "custom-old"
    assert "gate failed at health" in outcome.error and outcome.journal == "engine: model not found"
    calls = lb_calls(log)
    assert calls[:6] == [("sync", ()), ("out", ("0",)), ("restart", "hosttune-engine@0.service"), ("in", ("0",)),
                         ("out", ("1",)), ("restart", "hosttune-engine@1.service")]  # replica 1 never went back in
    # the previous release back on both replicas that moved, one at a time
    assert calls[6:] == [("sync", ()), ("out", ("0",)), ("restart", "hosttune-engine@0.service"), ("in", ("0",)),
                         ("out", ("1",)), ("restart", "hosttune-engine@1.service"), ("in", ("1",))]
    assert [a for _, a in log if a[0] == "journalctl"][0][2] == "hosttune-engine@1.service"


def test_putting_back_replicas_whose_ports_moved_down_stops_the_new_ones_in_the_way_first(tmp_path):
    """--port 8099 over nginx on 8100 and replicas on 8101-8102: new replica 0 took 8100 and replica 1 8101. Replica
    1 fails its gate: the previous release's nginx takes 8100 at its switch and its replica 0 8101, so the new
    replicas 0 and 1 are taken out and stopped before that switch, where nginx and replica 0 could not bind."""
    old = replace(job(tmp_path / "old", a100_facts(), engine="custom", gpus="0-3", replicas="2", port=8100).release,
                  id="custom-old")
    j = job(tmp_path, a100_facts(), engine="custom", gpus="0-3", replicas="2", port=8099)
    assert [r["port"] for r in old.replicas] == [8101, 8102] and [r["port"] for r in j.release.replicas] == [8100, 8101]
    running = "".join(f"instance:hosttune-engine@{i}.service active\n" for i in range(2))
    log: list = []
    t = NewReplicaOneFails("gpu-a", log, state=f"current:{old.dir}\n{running}nginx:/usr/sbin/nginx\nnginx-listen:8100\n")
    t.failing_port, t.new_dir = 8101, j.release.dir
    t.files[f"{old.dir}/.hosttune/release.json"] = old.manifest()
    for name, body in {**old.units, **old.meta, "host-hosttune-local.conf": old.files[NGINX_CONF],
                       "host-hosttune-replicas.json": old.files[SCRAPE_FILE]}.items():
        t.files[f"{old.dir}/.hosttune/{name}"] = body
    outcome = dhost.deploy_one(t, j)
    assert outcome.state == "failed" and outcome.restored == "custom-old", outcome.error
    argvs = [a for _, a in log]
    stop = argvs.index(("systemctl", "stop", "hosttune-engine@0.service", "hosttune-engine@1.service"))
    out = argvs.index(("python3", f"{j.release.dir}/.hosttune/replica_lb.py", "out", "0", "1"))
    back = next(i for i, a in enumerate(argvs) if a[:2] == ("sh", "-c") and a[4:6] == ("write", NGINX_CONF)
                and i > argvs.index(("systemctl", "restart", "hosttune-engine@1.service")))
    assert out < stop < back


def test_rolling_back_replicas_whose_ports_moved_down_stops_the_live_ones_in_the_way_first(tmp_path):
    """--rollback after --port 8099 moved the replicas down: the previous release's nginx takes 8100 at its switch
    and its replica 0 8101, which live replicas 0 and 1 hold: out of nginx and stopped before that switch."""
    from hosttune.deploy.rollback import rollback_one
    from hosttune.deploy.settings import ServeSettings

    old = replace(job(tmp_path / "old", a100_facts(), engine="custom", gpus="0-3", replicas="2", port=8100).release,
                  id="custom-old")
    new = replace(job(tmp_path, a100_facts(), engine="custom", gpus="0-3", replicas="2", port=8099).release,
                  id="custom-new")
    running = "".join(f"instance:hosttune-engine@{i}.service active\n" for i in range(2))
    log: list = []
    t = ScriptedTransport("gpu-a", log, state=f"current:{new.dir}\nprevious:{old.dir}\n{running}nginx:/usr/sbin/nginx\n")
    for release in (old, new):
        t.files[f"{release.dir}/.hosttune/release.json"] = release.manifest()
        for name, body in {**release.units, **release.meta, "host-hosttune-local.conf": release.files[NGINX_CONF],
                           "host-hosttune-replicas.json": release.files[SCRAPE_FILE]}.items():
            t.files[f"{release.dir}/.hosttune/{name}"] = body
    planned = rollback_one(t, inventory(tmp_path).hosts[0], ServeSettings("", "", 1, {}, {}), dry_run=True)
    assert planned.ops[1] == "$ systemctl stop hosttune-engine@0.service hosttune-engine@1.service"
    log.clear()
    outcome = rollback_one(t, inventory(tmp_path).hosts[0], ServeSettings("", "", 1, {}, {}))
    assert outcome.state == "rolled-back", outcome.error
    argvs = [a for _, a in log]
    stop = argvs.index(("systemctl", "stop", "hosttune-engine@0.service", "hosttune-engine@1.service"))
    out = argvs.index(("python3", f"{new.dir}/.hosttune/replica_lb.py", "out", "0", "1"))
    switch = next(i for i, a in enumerate(argvs) if a[:2] == ("sh", "-c") and a[4:6] == ("write", NGINX_CONF))
    assert out < stop < switch


def test_rolling_back_replicas_over_a_live_release_that_cannot_be_read_stops_its_replicas_first_and_says_why(tmp_path):
    """The live release's release.json is gone: which of its replicas hold the ports the previous release takes is
    unknown, so every one is stopped before the switch and the plan says why in one line naming the file, where none
    was stopped without a word and the previous release's replicas could not bind their ports."""
    from hosttune.deploy.rollback import rollback_one
    from hosttune.deploy.settings import ServeSettings

    old = replace(job(tmp_path / "old", a100_facts(), engine="custom", gpus="0-3", replicas="2", port=8100).release,
                  id="custom-old")
    running = "".join(f"instance:hosttune-engine@{i}.service active\n" for i in range(2))
    log: list = []
    t = ScriptedTransport("gpu-a", log, state=f"current:/opt/hosttune/releases/custom-gone\nprevious:{old.dir}\n"
                                              f"{running}nginx:/usr/sbin/nginx\n")
    t.files[f"{old.dir}/.hosttune/release.json"] = old.manifest()
    for name, body in {**old.units, **old.meta, "host-hosttune-local.conf": old.files[NGINX_CONF],
                       "host-hosttune-replicas.json": old.files[SCRAPE_FILE]}.items():
        t.files[f"{old.dir}/.hosttune/{name}"] = body
    planned = rollback_one(t, inventory(tmp_path).hosts[0], ServeSettings("", "", 1, {}, {}), dry_run=True)
    assert planned.ops[:2] == (
        "stop every replica of the live release before the switch (which of them hold the ports custom-old takes is "
        "unknown): gpu-a: release custom-gone has no readable release.json (cat: "
        "/opt/hosttune/releases/custom-gone/.hosttune/release.json: No such file or directory)",
        "$ systemctl stop hosttune-engine@0.service hosttune-engine@1.service")
    assert planned.ops[-1].endswith("; on failure custom-gone cannot come back, its release.json unreadable")  # not
    #                                 "custom-gone comes back", which the run cannot do
    log.clear()
    outcome = rollback_one(t, inventory(tmp_path).hosts[0], ServeSettings("", "", 1, {}, {}))
    assert outcome.state == "rolled-back", outcome.error
    argvs = [a for _, a in log]
    stop = argvs.index(("systemctl", "stop", "hosttune-engine@0.service", "hosttune-engine@1.service"))
    switch = next(i for i, a in enumerate(argvs) if a[:2] == ("sh", "-c") and a[4:6] == ("write", NGINX_CONF))
    assert stop < switch


def test_rolling_back_a_cordoned_host_is_refused_before_anything_changes(tmp_path):
    """--rollback restarts replicas and puts them in nginx: on a host remediate cordoned it would serve again from the
    GPU it was taken out for. Refused as a deploy is, naming the cordon."""
    from hosttune.deploy.rollback import rollback_one
    from hosttune.deploy.settings import ServeSettings

    old = replace(job(tmp_path, a100_facts(), engine="custom", gpus="0-3", replicas="2").release, id="custom-old")
    cordon = 'cordon:{"at": 1, "reason": "GPU1: Xid 79", "run": "R"}\n'
    log: list = []
    t = ScriptedTransport("gpu-a", log, state=f"current:/opt/hosttune/releases/custom-new\nprevious:{old.dir}\n{cordon}")
    t.files[f"{old.dir}/.hosttune/release.json"] = old.manifest()
    for name, body in {**old.units, **old.meta, "host-hosttune-local.conf": old.files[NGINX_CONF],
                       "host-hosttune-replicas.json": old.files[SCRAPE_FILE]}.items():
        t.files[f"{old.dir}/.hosttune/{name}"] = body
    for dry_run in (True, False):
        outcome = rollback_one(t, inventory(tmp_path).hosts[0], ServeSettings("", "", 1, {}, {}), dry_run=dry_run)
        assert outcome.state is Outcome.FAILED and outcome.error == (
            "nothing changed: gpu-a is cordoned (GPU1: Xid 79); hosttune uncordon takes it back")
    assert not any(a[:1] == ("systemctl",) or a[0] == "python3" or (a[:2] == ("sh", "-c") and a[3:4] == ("hosttune",)
                                                                      and a[4] in ("write", "link", "remove"))
                   for _, a in log)


def test_several_replicas_need_nginx_and_an_unknown_flag_is_refused_before_any_change(tmp_path):
    j = job(tmp_path, a100_facts(), engine="custom", gpus="0-1")
    log: list = []
    refused = dhost.deploy_one(ScriptedTransport("gpu-a", log, state=""), j)
    assert refused.state == "failed" and "nothing changed: gpu-a: 2 replicas need nginx on the host" in refused.error
    from hosttune.deploy.plan import wheel_set
    donor = f"/opt/hosttune/releases/custom-same-wheels\ninstalled:{wheel_set(j.release, j.python)} /opt/hosttune/releases/custom-same"
    t = ScriptedTransport("gpu-a", log, state=f"nginx:/usr/sbin/nginx\ncurrent:{donor}\n")
    t.unknown_flags = ["--bogus"]
    log.clear()
    refused = dhost.deploy_one(t, j)
    assert "the installed hosttune-engine" in refused.error and "does not know --bogus" in refused.error
    assert len(render([refused]).splitlines()) == 1 and exit_code([refused]) == 2
    assert not any(a[:1] == ("systemctl",) or (a[:2] == ("sh", "-c") and a[4] in ("write", "link", "remove"))
                   for _, a in log)


def test_dry_run_lists_the_roll(tmp_path):
    j = job(tmp_path, a100_facts(), engine="custom", gpus="0-1")
    outcome = dhost.deploy_one(ScriptedTransport("gpu-a", [], state="nginx:/usr/sbin/nginx\n"), j, dry_run=True)
    text = "\n".join(outcome.ops)
    assert outcome.state == "planned" and "gate hosttune-engine@0.service" in text and "replica_lb.py in 1" in text
    assert f"write {NGINX_CONF}" in text and "systemctl enable --now --quiet hosttune-probe.timer" in text
    # each replica's gate as the run takes it: its own port's deadlines, and what a failed one leads to
    port = j.release.replicas[1]["port"]
    assert (f"gate hosttune-engine@1.service on port {port}: /health within 600 s, 3 warmup requests, a one-token "
            "generation within 60 s; on failure the replica stays out of nginx and the replicas are stopped and "
            "disabled") in outcome.ops
    before = replace(job(tmp_path / "old", a100_facts(), engine="custom", gpus="0-1", port=8100).release,
                     id="custom-old")
    old = ScriptedTransport("gpu-a", [], state="nginx:/usr/sbin/nginx\ncurrent:/opt/hosttune/releases/custom-old\n")
    old.files = {f"{before.dir}/.hosttune/{name}": body for name, body in
                 {**before.units, **before.meta, "release.json": before.manifest(),
                  "host-hosttune-local.conf": before.files[NGINX_CONF],
                  "host-hosttune-replicas.json": before.files[SCRAPE_FILE]}.items()}
    assert any(line.endswith("on failure the replica stays out of nginx and the release live before comes back on the "
                             "replicas that moved, one at a time") for line in dhost.deploy_one(old, j, dry_run=True).ops)
    old.files.clear()  # what a failed gate would put back cannot be read: the plan does not promise it
    assert any(line.endswith("on failure the replica stays out of nginx and the release live before cannot come back, "
                             "its release.json unreadable") for line in dhost.deploy_one(old, j, dry_run=True).ops)


# -- the host-side balancer script ---------------------------------------------------------------------


def replica_lb(tmp_path, replicas, script: bytes | None = None, **conf):
    """replica_lb.py as deploy installs it (or `script`, an older one), beside its replicas.json, with nginx and
    systemctl recorded."""
    from hosttune.deploy.replicas import lb_script

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(parents=True)
    for tool in ("nginx", "systemctl"):  # record what would reach nginx and systemd
        (bin_dir / tool).write_text(f"#!/bin/sh\necho {tool} \"$@\" >> {tmp_path}/calls\n")
        (bin_dir / tool).chmod(0o755)
    (tmp_path / "replica_lb.py").write_bytes(script or lb_script())
    conf = {"replicas": replicas, "servers_file": str(tmp_path / "servers.conf"), "state_dir": str(tmp_path / "state"),
            "max_fails": 3, "fail_timeout_s": 10, "probe_timeout_s": 1, **conf}
    (tmp_path / "replicas.json").write_text(json.dumps(conf))
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}

    def lb(*args):
        out = subprocess.run([sys.executable, str(tmp_path / "replica_lb.py"), *args], env=env, capture_output=True,
                             text=True, timeout=60)
        return json.loads(out.stdout)

    return lb


def test_replica_lb_marks_drained_and_failing_replicas_down(tmp_path):
    lb = replica_lb(tmp_path, [{"index": 0, "port": 1}, {"index": 1, "port": 2}])
    servers = tmp_path / "servers.conf"
    assert lb("out", "1")["ok"]
    assert "server 127.0.0.1:1 max_fails=3 fail_timeout=10s;" in servers.read_text()
    assert "server 127.0.0.1:2 max_fails=3 fail_timeout=10s down;" in servers.read_text()
    assert "nginx -t -q" in (tmp_path / "calls").read_text() and "systemctl reload-or-restart nginx.service" in (tmp_path / "calls").read_text()
    probed = lb("probe")  # nothing listens on port 1: it fails its generation and goes down too; 2 stays drained
    assert probed["replicas"]["1"] == "drained" and probed["replicas"]["0"] != "ok"
    assert servers.read_text().count(" down;") == 2
    lb("in", "1")
    assert servers.read_text().count(" down;") == 1 and "127.0.0.1:2 max_fails=3 fail_timeout=10s;" in servers.read_text()


def test_replica_lb_takes_every_replica_it_is_given_out_and_back_in(tmp_path):
    """A first deploy marks all its new replicas out at once (`out 0 1 2`) until each passes its gate: every one of
    them, where only the first was, and nginx sent requests to the others before they had started."""
    lb = replica_lb(tmp_path, [{"index": i, "port": 1 + i} for i in range(3)])
    servers = tmp_path / "servers.conf"
    assert lb("out", "0", "1", "2")["ok"]
    assert servers.read_text().count(" down;") == 3
    assert lb("in", "1", "2")["ok"]
    assert servers.read_text().count(" down;") == 1 and "127.0.0.1:1 max_fails=3 fail_timeout=10s down;" in servers.read_text()
    assert not lb("out")["ok"]  # no replica named: an error, not a silent no-op


def test_replica_lb_leaves_the_servers_file_nginx_last_accepted_when_nginx_refuses_the_new_one(tmp_path):
    """nginx -t judges the new file in place; refused, the one before comes back (or none), so the next reload of
    nginx, by anyone, still loads: where the refused file stayed and every later reload failed."""
    lb = replica_lb(tmp_path, [{"index": 0, "port": 1}, {"index": 1, "port": 2}])
    servers = tmp_path / "servers.conf"
    assert lb("out", "1")["ok"]
    accepted = servers.read_text()
    nginx = tmp_path / "bin" / "nginx"
    nginx.write_text(f"#!/bin/sh\necho nginx \"$@\" >> {tmp_path}/calls\necho 'nginx: [emerg] bad' >&2\nexit 1\n")
    out = lb("in", "1")
    assert not out["ok"] and "[emerg] bad" in out["error"]
    assert servers.read_text() == accepted and sorted(p.name for p in tmp_path.iterdir() if "servers" in p.name) == \
        ["servers.conf"]
    assert "systemctl reload-or-restart" not in (tmp_path / "calls").read_text().split("nginx -t -q")[-1]
    servers.unlink()  # the first sync of a host: refused, no file is left for nginx to include
    assert not lb("out", "0")["ok"] and not servers.exists()


def test_a_release_whose_replica_lb_takes_one_replica_is_given_its_replicas_one_call_each(tmp_path):
    """Releases older hosttune installed carry a replica_lb.py whose `out 0 1 2 3` marks only replica 0: rolling back
    onto one (or putting it back) names each replica in a call of its own, so every new one stays out of nginx until
    its gate, where the others took requests before they had started. This hosttune's script takes them in one call."""
    from hosttune.deploy.replicas import LB_SCRIPT
    from hosttune.deploy.restore import out_of_the_way
    from hosttune.deploy.rolling import switch_ops
    from hosttune.deploy.state import HostState

    one_index = (FIXTURES / "replica_lb" / "one-index.py").read_bytes()
    release = job(tmp_path, a100_facts(), engine="custom", gpus="0-3").release
    old = replace(release, meta={**release.meta, LB_SCRIPT: one_index})
    bare = HostState(None, None, False)

    def lb_calls(ops):
        return [op.argv[2:] for op in ops if op.argv[:1] == ("python3",) and op.argv[1].endswith(LB_SCRIPT)]

    assert lb_calls(switch_ops(release, bare)) == [("out", "0", "1", "2", "3")]
    calls = lb_calls(switch_ops(old, bare))
    assert calls == [("out", "0"), ("out", "1"), ("out", "2"), ("out", "3")]
    lb = replica_lb(tmp_path / "lb", [{"index": i, "port": 8101 + i} for i in range(4)], script=one_index)
    assert all(lb(*argv)["ok"] for argv in calls)
    assert (tmp_path / "lb" / "servers.conf").read_text().count(" down;") == 4
    moved = replace(old, settings={**old.settings, "replicas": [{**r, "port": r["port"] - 1} for r in old.replicas]})
    assert lb_calls(out_of_the_way(release, moved, None)) == calls  # each on a port the one put back takes


class KeyedEngine(BaseHTTPRequestHandler):
    """/v1/models and /v1/completions for `Authorization: Bearer KEY` only, 401 otherwise."""

    KEY = "ht-probe-key-0123456789abcdef"

    def _answer(self, body: dict) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        ok = self.headers.get("Authorization") == f"Bearer {self.KEY}"
        data = json.dumps(body if ok else {"error": {"message": "invalid API key"}}).encode()
        self.send_response(200 if ok else 401)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        self._answer({"data": [{"id": "m"}]})

    def do_POST(self):
        self._answer({"choices": [{"text": "!"}]})

    def log_message(self, *args):
        pass


def test_the_probe_sends_the_replicas_key_from_their_key_file(tmp_path):
    server = ThreadingHTTPServer(("127.0.0.1", 0), KeyedEngine)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        key_file = tmp_path / "prod.env"
        key_file.write_text(f"HOSTTUNE_ENGINE_API_KEY={KeyedEngine.KEY}\n")
        replicas = [{"index": 0, "port": server.server_address[1]}]
        keyed = replica_lb(tmp_path / "keyed", replicas, key_file=str(key_file))
        assert keyed("probe")["replicas"] == {"0": "ok"}
        unkeyed = replica_lb(tmp_path / "unkeyed", replicas)  # without it the replica answers 401: out of nginx
        assert "401" in unkeyed("probe")["replicas"]["0"]
        assert " down;" in (tmp_path / "unkeyed" / "servers.conf").read_text()
    finally:
        server.shutdown()
        server.server_close()


def test_going_back_to_one_service_stops_the_replicas_probe_and_local_nginx(tmp_path):
    from hosttune.actions.base import Command
    from hosttune.deploy.rolling import leave_ops
    from hosttune.deploy.state import UnitFile, parse_state

    state = parse_state("unit:hosttune-engine@.service a inactive\nunit:hosttune-probe.timer b active\n"
                        "instance:hosttune-engine@0.service active\ninstance:hosttune-engine@1.service failed\n")
    assert state.instances == {"hosttune-engine@0.service": "active", "hosttune-engine@1.service": "failed"}
    described = [op for op in leave_ops(state)]
    assert [op.argv if isinstance(op, Command) else op.path for op in described] == [
        ("systemctl", "disable", "--now", "hosttune-engine@0.service", "hosttune-engine@1.service"),
        ("systemctl", "disable", "--now", "hosttune-probe.timer"),
        "/etc/systemd/system/hosttune-engine@.service", "/etc/systemd/system/hosttune-probe.timer",
        NGINX_CONF, ("systemctl", "try-reload-or-restart", "nginx.service")]
    assert leave_ops(parse_state("")) == [] and isinstance(state.units["hosttune-probe.timer"], UnitFile)


# -- canaries --------------------------------------------------------------------------------------


def test_canaries_go_first_and_a_failed_check_stops_the_rest(tmp_path, monkeypatch):
    inv = fleet_of(tmp_path, 4)
    ran: list[str] = []
    monkeypatch.setattr(rollout, "_single", lambda host, request: ran.append(host.name) or
                        dhost.HostDeploy(host, Outcome.DEPLOYED, "r", "r"))
    request = rollout.DeployRequest("sglang", "/m", tmp_path, canary=1)
    checked: list[list[str]] = []

    def slo_missed(outcomes):
        checked.append([o.host.name for o in outcomes])
        return "the canary h0 missed the SLO e2e=2s at 1 req/s (3 of 30 requests ok)"

    outcomes = rollout.deploy_fleet(inv, request, canary_check=slo_missed)
    assert ran == ["h0"] and checked == [["h0"]]
    assert [o.state for o in outcomes] == ["deployed", "skipped", "skipped", "skipped"]
    assert outcomes[1].error == "not run: the canary h0 missed the SLO e2e=2s at 1 req/s (3 of 30 requests ok)"
    ran.clear()
    assert [o.state for o in rollout.deploy_fleet(inv, request, canary_check=lambda o: None)] == ["deployed"] * 4
    assert ran[0] == "h0" and sorted(ran[1:]) == ["h1", "h2", "h3"]


def test_a_failed_canary_stops_the_rest_without_a_check(tmp_path, monkeypatch):
    inv = fleet_of(tmp_path, 3)
    monkeypatch.setattr(rollout, "_single", lambda host, request: dhost.HostDeploy(host, Outcome.FAILED, "r", None, error="x"))
    outcomes = rollout.deploy_fleet(inv, rollout.DeployRequest("sglang", "/m", tmp_path, canary=1))
    assert [o.state for o in outcomes] == ["failed", "skipped", "skipped"]
    assert outcomes[2].error == "not run: the canary h0 failed"


def test_the_canary_slo_bench_passes_a_fast_host_and_stops_a_slow_one(tmp_path):
    from hosttune.deploy.canary import CanaryBench, slo_check

    def check_against(ttft: str):
        with running("--ttft", ttft, "--itl", "0.001", lifetime=60) as url:
            port = int(url.rsplit(":", 1)[1])
            host = replace(inventory(tmp_path).hosts[0], connection=replace(inventory(tmp_path).hosts[0].connection,
                                                                             address="127.0.0.1"))
            request = rollout.DeployRequest("custom", "/m", tmp_path, port=port)
            bench = CanaryBench("ttft=200ms", rate=10, duration="2s", max_tokens="4")
            return slo_check(bench, request)([dhost.HostDeploy(host, Outcome.DEPLOYED, "r", "r")])

    assert check_against("0.01") is None
    missed = check_against("0.4")
    assert missed.startswith("the canary gpu-a missed the SLO ttft=200ms at 10 req/s (") and "requests ok)" in missed


MODEL_READ = {  # what model.py's read script prints for each folder on the scripted host
    "/models/qwen2.5-7b": "dir:\nconfig-begin:\n{\"num_attention_heads\": 28, \"num_key_value_heads\": 4}\nconfig-end:\n"
                          "weights:15230000000 model.safetensors\n",
    "/models/qwen2.5-72b": "dir:\nconfig-begin:\n{\"num_attention_heads\": 64, \"num_key_value_heads\": 8}\nconfig-end:\n"
                           "weights:145400000000 model.safetensors\n",
    "/models/missing": "missing:\n",
}


class ModelHost(ScriptedTransport):
    def _command(self, argv, stdin, timeout):
        argv = tuple(argv)
        if argv[:2] == ("sh", "-c") and argv[3:4] == ("hosttune",) and argv[4] in MODEL_READ:
            self.log.append((self.host_name, argv))
            return CommandResult(argv, 0, MODEL_READ[argv[4]], "", 0.0)
        return super()._command(argv, stdin, timeout)


@pytest.mark.parametrize("model, extra, message", [
    ("/models/qwen2.5-7b", dict(tensor_parallel=3), "--tensor-parallel 3 does not divide /models/qwen2.5-7b's 28"),
    ("/models/qwen2.5-7b", dict(gpus="0-7"), "--gpus 0-7 asks for GPU 4,5,6,7, but the host has GPUs 0-3"),
    ("/models/qwen2.5-72b", dict(tensor_parallel=2), "a 1/2 shard of /models/qwen2.5-72b (72.7 GB) is more than 75%"),
    ("/models/missing", {}, "the model folder /models/missing does not exist on the host"),
])
def test_refusals_only_read_the_host(tmp_path, monkeypatch, model, extra, message):
    log: list = []
    host = inventory(tmp_path).hosts[0]
    monkeypatch.setattr(rollout, "open_transport", lambda spec: ModelHost(spec.host_name, log))
    monkeypatch.setattr(rollout, "gather", lambda t, **_: type("Run", (), {"facts": a100_facts()})())
    fake_entry(tmp_path / "wh", "vllm")
    outcome = rollout._single(host, rollout.DeployRequest("vllm", model, tmp_path / "wh", **extra))
    assert outcome.state == "failed" and outcome.error.startswith("nothing changed: gpu-a: ") and message in outcome.error
    assert len(render([outcome]).splitlines()) == 1 and exit_code([outcome]) == 2
    assert [a for _, a in log[:2]] == [("cat", "--", "/var/lib/hosttune/cordon.json"),  # not cordoned
                                       ("cat", "--", "/opt/hosttune/current/.hosttune/release.json")]  # what serves now
    assert [a[4] for _, a in log[2:]] == [model]  # one read of the model folder, and nothing else


def test_a_cordoned_host_is_refused_before_its_deploy_is_decided(tmp_path, monkeypatch):
    log: list = []
    host = inventory(tmp_path).hosts[0]
    scripted = ModelHost(host.name, log)
    scripted.files["/var/lib/hosttune/cordon.json"] = b'{"at": 1, "reason": "GPU1: Xid 79", "run": "R"}\n'
    monkeypatch.setattr(rollout, "open_transport", lambda spec: scripted)
    outcome = rollout._single(host, rollout.DeployRequest("vllm", "/models/missing", tmp_path / "wh"))  # no wheels either
    assert outcome.state == "failed"
    assert outcome.error == "nothing changed: gpu-a is cordoned (GPU1: Xid 79); hosttune uncordon takes it back"
    assert [a for _, a in log] == [("cat", "--", "/var/lib/hosttune/cordon.json")]  # nothing else read, nothing sent


def test_gpus_for_an_engine_on_cpu_are_refused_not_ignored(tmp_path):
    with pytest.raises(DeployError) as err:
        job(tmp_path / "a", a100_facts(), engine="custom", gpus="0", overrides=parse_sets(["device=cpu"]))
    assert str(err.value) == ("gpu-a: --gpus 0: the engine runs on CPU (device cpu) and would use no GPU; drop --gpus, "
                              "or the device flag")
    assert job(tmp_path / "b", a100_facts(), engine="custom", overrides=parse_sets(["device=cpu"])).layout.replicas


def _positions(positions: int, **config) -> ModelShape:
    base = {"architectures": list(QWEN), "num_attention_heads": 32, "num_key_value_heads": 4,
            "max_position_embeddings": positions, **config}
    return parse_model("/models/tiny", "dir:\nconfig-begin:\n" + json.dumps(base) + "\nconfig-end:\n"
                       "weights:2200000000 model.safetensors\n")


@pytest.mark.parametrize("engine, sets, where", [
    ("vllm", (), "{tmp}/inventory.yaml:{line}: deploy.vllm.max-model-len=32768"),  # gpu-a's own, over the preset's
    ("vllm", ("max-model-len=4096",), "--set max-model-len=4096"),
    ("custom", ("max-model-len=3000",), "--set max-model-len=3000"),
])
def test_a_context_past_the_models_positions_is_refused_before_anything_is_sent(tmp_path, engine, sets, where):
    """vLLM and the bundled engine refuse at start a max-model-len past max_position_embeddings (no rope scaling)."""
    with pytest.raises(DeployError) as info:
        job(tmp_path, a100_facts(), engine=engine, model=_positions(2048), gpus="0", overrides=parse_sets(list(sets)))
    value = where.rsplit("=", 1)[1]
    line = str(info.value).split("inventory.yaml:")[1].split(":")[0] if "inventory.yaml:" in str(info.value) else ""
    assert str(info.value) == (f"gpu-a: {where.format(tmp=tmp_path, line=line)}: past the 2048 positions of /models/tiny "
                               f"(max_position_embeddings in config.json), which {engine if engine != 'custom' else 'the bundled engine'} "
                               f"refuses at start; give max-model-len 2048 or less")
    assert int(value) > 2048


def test_a_context_within_the_models_positions_or_stretched_by_rope_scaling_is_taken(tmp_path):
    assert job(tmp_path / "a", a100_facts(), model=_positions(32768), gpus="0").settings.flags["max-model-len"] == 32768
    yarn = _positions(2048, rope_scaling={"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 2048})
    assert job(tmp_path / "b", a100_facts(), model=yarn, gpus="0")  # vLLM stretches the positions by the factor
    long_ok = parse_sets(["env.VLLM_ALLOW_LONG_MAX_MODEL_LEN=1"])  # vLLM's own way past the check
    assert job(tmp_path / "c", a100_facts(), model=_positions(2048), gpus="0", overrides=long_ok)


def test_a_quantization_the_bundled_engine_does_not_load_is_refused_as_its_model(tmp_path):
    """Its loader takes fp8, compressed-tensors, awq and gptq checkpoints; vLLM and SGLang name none, so any."""
    bnb = _quantized({"quant_method": "bitsandbytes", "load_in_4bit": True}, 29568)
    assert bnb.quant_method == "bitsandbytes"
    custom = load_preset("custom").serve
    assert model_problem(bnb, custom.architectures, quant_methods=custom.quant_methods) == (
        "is quantized with bitsandbytes (config.json quantization_config), which the engine does not load (it loads "
        "fp8, compressed-tensors, awq, gptq)")
    assert model_problem(AWQ_72B, custom.architectures, quant_methods=custom.quant_methods) == ""
    assert model_problem(bnb, (), quant_methods=load_preset("vllm").serve.quant_methods) == ""
