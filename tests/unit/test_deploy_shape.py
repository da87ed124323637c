"""A deployment's shape as data: what the inventory declares (checked, errors naming the line), the
run's options over it, what the live release recorded under both, and the plan's words for what a
new shape takes away (replicas, the nginx front, the key)."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from hosttune.config.inventory import load_inventory
from hosttune.deploy import rollout
from hosttune.deploy.errors import DeployError
from hosttune.deploy.model import ModelShape
from hosttune.deploy.shape import Guard, Shape, declared, parse_live, record

from deploy_fixtures import a100_facts, fake_entry

MODEL = ModelShape("/models/qwen", True, num_heads=28, num_kv_heads=4, weight_bytes=2_000_000_000)


def host_with(tmp_path: Path, deploy: str):
    path = tmp_path / "inventory.yaml"
    path.write_text(textwrap.dedent("""\
        defaults:
          pins: {{python: "3.10"}}
        groups:
          prod:
            vars:
              gpus: "0-3"
              deploy:
        {deploy}
            hosts:
              gpu-a: {{address: 10.0.0.1}}
        """).format(deploy=textwrap.indent(textwrap.dedent(deploy), " " * 8)))
    return load_inventory(path).hosts[0]


def test_the_inventory_declares_the_shape(tmp_path):
    host = host_with(tmp_path, "engine: vllm\nmodel: /models/qwen\nreplicas: 2\ntensor_parallel: 2\nport: 8100\n")
    assert declared(host) == Shape("vllm", "/models/qwen", "2", 2, 8100)
    assert declared(host_with(tmp_path, "replicas: per-gpu\n")).replicas == "per-gpu"


@pytest.mark.parametrize("deploy, message", [
    ("engine: tgi\n", "deploy.engine must be one of custom, vllm, sglang (got 'tgi')"),
    ("replicas: 0\n", "deploy.replicas must be per-gpu or a number of replicas (got 0)"),
    ("replicas: true\n", "deploy.replicas must be per-gpu or a number of replicas (got True)"),
    ("tensor_parallel: two\n", "deploy.tensor_parallel must be a positive integer (got 'two')"),
    ("replicas_per_gpu: 0\n", "deploy.replicas_per_gpu must be a positive integer (got 0)"),
    ("model: 7\n", "deploy.model must be the model folder on the hosts (got 7)"),
    ('model: "org/m\\rx"\n', "deploy.model must be the model folder on the hosts (got 'org/m\\rx')"),  # no unit holds it
])
def test_a_bad_shape_names_its_line(tmp_path, deploy, message):
    with pytest.raises(DeployError, match=r"inventory.yaml:\d+: ") as err:
        declared(host_with(tmp_path, deploy))
    assert message in str(err.value)


def test_options_win_for_one_run_then_the_inventory_then_what_is_live(tmp_path):
    host = host_with(tmp_path, "engine: vllm\nreplicas: 2\n")
    live = Shape("sglang", "/models/live", "4", 1, 9000)
    none = rollout.DeployRequest(None, None, tmp_path / "wh")
    wanted = rollout.for_host(host, none, live)
    assert (wanted.engine, wanted.model, wanted.replicas, wanted.tensor_parallel, wanted.port) == \
        ("vllm", "/models/live", "2", 1, 9000)
    wanted = rollout.for_host(host, rollout.DeployRequest(None, "/m", tmp_path / "wh", replicas="1"), live)
    assert (wanted.model, wanted.replicas) == ("/m", "1")
    assert rollout.for_host(host_with(tmp_path, "engine: vllm\nmodel: /m\n"), none, None).replicas == "per-gpu"
    with pytest.raises(DeployError, match="which model to serve\\? Give --model, or declare deploy.model"):
        rollout.for_host(host, none, None)


def test_a_redeploy_with_no_options_keeps_the_live_replicas(tmp_path):
    """Nothing declared and no option: the 2 replicas the live release recorded, not per-gpu's 4."""
    host = host_with(tmp_path, "vllm: {max-num-seqs: 64}\n")
    fake_entry(tmp_path / "wh", "vllm", archs=("8.0",), abi="cp310")
    first = rollout.make_job(host, a100_facts(), rollout.for_host(
        host, rollout.DeployRequest("vllm", MODEL.path, tmp_path / "wh", replicas="2")), model=MODEL)
    live = parse_live(first.release.manifest().decode())
    again = rollout.make_job(host, a100_facts(), rollout.for_host(
        host, rollout.DeployRequest(None, None, tmp_path / "wh"), live[0]), model=MODEL)
    assert len(again.release.replicas) == 2 and again.release.id == first.release.id
    assert live[1].removals(again.guard) == ()
    assert first.release.settings["shape"] == record("vllm", MODEL.path, 8000, 2, 1, Guard(2))


def test_a_redeploy_with_no_options_keeps_replicas_sharing_their_gpu(tmp_path):
    host = host_with(tmp_path, "vllm: {max-num-seqs: 64}\n")
    fake_entry(tmp_path / "wh", "vllm", archs=("8.0",), abi="cp310")
    first = rollout.make_job(host, a100_facts(), rollout.for_host(
        host, rollout.DeployRequest("vllm", MODEL.path, tmp_path / "wh", gpus="0", replicas_per_gpu=3)), model=MODEL)
    assert len(first.release.replicas) == 3 and first.release.settings["shape"]["replicas_per_gpu"] == 3
    live = parse_live(first.release.manifest().decode())
    assert live[0].replicas_per_gpu == 3
    again = rollout.make_job(host, a100_facts(), rollout.for_host(
        host, rollout.DeployRequest(None, None, tmp_path / "wh", gpus="0"), live[0]), model=MODEL)
    assert again.release.id == first.release.id


def test_an_older_release_without_a_shape_is_read_from_its_settings():
    doc = {"engine": "custom", "settings": {"model": "/m", "port": 8000, "replicas": [{"index": 0}, {"index": 1}],
                                            "tensor_parallel": 1, "api_key": {"file": "/etc/hosttune/keys/g.env"}}}
    assert parse_live(json.dumps(doc)) == (Shape("custom", "/m", "2", 1, 8000), Guard(2, True, None))
    assert parse_live("not json") is None


def test_the_plan_names_what_a_new_shape_takes_away():
    live = Guard(replicas=4, api_key=True, front_port=443)
    assert live.removals(Guard(4, True, 443)) == () and live.removals(Guard(8, True, 443)) == ()
    assert live.removals(Guard(1, False, None)) == (
        "removes 3 of the 4 replicas", "removes the host's nginx front on port 443",
        "removes the API key: the engine will answer anyone who reaches it")


@pytest.mark.parametrize("shape, options, message", [
    (Shape("vllm", MODEL.path, "4", 1), dict(gpus="0-1"),
     "gpu-a: --replicas 4 at TP 1 needs 4 GPUs, but --gpus 0-1 gives 2; the host serves 4 replicas at TP 1 now and "
     "this deploy keeps that: give --replicas and --tensor-parallel to change it"),
    (Shape("vllm", MODEL.path, "2", 1), dict(model="/models/big"),
     "gpu-a: a 1/1 shard of /models/big (145.0 GB) is more than 75% of a GPU's 80 GiB; use a larger --tensor-parallel; "
     "the host serves 2 replicas at TP 1 now and this deploy keeps that: give --replicas and --tensor-parallel to "
     "change it"),
    (Shape("vllm", MODEL.path, "4", 1), dict(tensor_parallel=2),
     "gpu-a: --replicas 4 at TP 2 needs 8 GPUs, but --gpus 0-3 gives 4; the host serves 4 replicas now and this "
     "deploy keeps that: give --replicas to change it"),
])
def test_a_shape_kept_from_the_live_release_that_no_longer_fits_says_where_it_came_from(tmp_path, shape, options,
                                                                                      message):
    """The user gave no --replicas or --tensor-parallel: the refusal names the live release, not only the option."""
    host = host_with(tmp_path, "vllm: {max-num-seqs: 64}\n")
    fake_entry(tmp_path / "wh", "vllm", archs=("8.0",), abi="cp310")
    request = rollout.DeployRequest(None, options.get("model"), tmp_path / "wh", gpus=options.get("gpus"),
                                    tensor_parallel=options.get("tensor_parallel"))
    model = ModelShape("/models/big", True, 64, 8, 145_000_000_000) if "model" in options else MODEL
    with pytest.raises(DeployError) as info:
        rollout.make_job(host, a100_facts(), rollout.for_host(host, request, shape), model=model)
    assert str(info.value) == message
    declared_host = host_with(tmp_path, "replicas: 4\ntensor_parallel: 1\n")  # the inventory's words: no note
    with pytest.raises(DeployError) as info:
        rollout.make_job(declared_host, a100_facts(), rollout.for_host(declared_host, request, shape), model=model)
    assert "this deploy keeps that" not in str(info.value)
