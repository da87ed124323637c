"""`hosttune deploy --tune`: the bundled engine's tune step as data (facts and options in, operations out)."""

from __future__ import annotations

import pytest

from hosttune.actions.base import Command
from hosttune.deploy import host as dhost
from hosttune.deploy import rollout
from hosttune.deploy.errors import DeployError
from hosttune.deploy.settings import parse_sets
from hosttune.deploy.tune import CACHE, CACHE_ENV

from deploy_fixtures import ScriptedTransport, a100_facts, fake_entry, inventory


def _job(tmp_path, engine: str, tune_s: float):
    host = next(h for h in inventory(tmp_path).hosts if h.name == "gpu-a")
    fake_entry(tmp_path / "wh", engine=engine, archs=() if engine == "custom" else ("8.0",))
    request = rollout.DeployRequest(engine, "/m", tmp_path / "wh", "0-1", tensor_parallel=2, tune_s=tune_s)
    return rollout.make_job(host, a100_facts(), request)


def _planned(job) -> list[tuple[str, ...]]:
    outcome = dhost.deploy_one(ScriptedTransport("gpu-a", []), job, dry_run=True)
    return [line for line in outcome.ops]


def test_tune_runs_the_releases_engine_tune_before_the_units_and_they_read_its_cache(tmp_path):
    job = _job(tmp_path, "custom", 90)
    assert job.settings.env[CACHE_ENV] == CACHE
    ops = dhost._tune_ops(job)
    assert [op.argv for op in ops] == [
        ("mkdir", "-p", CACHE),
        ("env", f"{CACHE_ENV}={CACHE}", "CUDA_VISIBLE_DEVICES=0", f"{job.release.dir}/bin/hosttune-engine", "tune",
         "--model", "/m", "--budget-s", "90", "--if-missing", "--tensor-parallel-size", "2")]
    assert all(isinstance(op, Command) for op in ops)
    lines = _planned(job)
    tune_at = next(i for i, line in enumerate(lines) if "hosttune-engine tune" in line)
    assert tune_at < lines.index("$ systemctl restart hosttune-serve.service")  # before the release starts
    assert f"{CACHE_ENV}={CACHE}".encode() in job.release.units["hosttune-serve.service"]


def test_tune_times_the_kernels_for_the_weights_dtype_kv_blocks_and_shards_the_service_runs(tmp_path):
    """Each replica runs TP 2: tune times one rank's shards, whose tuned entries are the ones its ranks read."""
    job = _job(tmp_path, "custom", 30)
    job.settings.flags.update({"quantization": "fp8", "dtype": "float16", "block-size": 32, "kv-cache-dtype": "fp8"})
    argv = dhost._tune_ops(job)[1].argv
    assert argv[argv.index("--if-missing") + 1:] == ("--quantization", "fp8", "--dtype", "float16", "--block-size",
                                                     "32", "--kv-cache-dtype", "fp8", "--tensor-parallel-size", "2")


def test_no_tune_step_without_the_option(tmp_path):
    job = _job(tmp_path, "custom", 0)
    assert dhost._tune_ops(job) == [] and CACHE_ENV not in job.settings.env
    assert not any("hosttune-engine tune" in line for line in _planned(job))


def test_tune_is_refused_for_an_engine_that_tunes_its_own_kernels(tmp_path):
    with pytest.raises(DeployError, match="--engine vllm tunes its own: drop --tune"):
        _job(tmp_path, "vllm", 60)


def test_tune_is_refused_for_the_bundled_engine_on_cpu(tmp_path):
    """Its replicas have no GPU, so the step would be left out of the plan without a word."""
    host = next(h for h in inventory(tmp_path).hosts if h.name == "gpu-a")
    fake_entry(tmp_path / "wh", engine="custom", archs=())
    request = rollout.DeployRequest("custom", "/m", tmp_path / "wh", tune_s=60, overrides=parse_sets(["device=cpu"]))
    with pytest.raises(DeployError, match="^--tune tunes the bundled engine's kernels for a GPU, and it runs on CPU "
                                          "\\(device cpu\\): drop --tune$"):
        rollout.make_job(host, a100_facts(), request)
