"""`hosttune deploy --tune`: the bundled engine tunes its kernels on each host before its release starts.

`hosttune-engine tune --if-missing` writes a table per GPU name, driver and Triton version into a cache on
the host that the release's units read (`HOSTTUNE_ENGINE_CACHE`), and leaves a table it already has: a
fleet of one GPU model tunes once per host, and again only after a driver or Triton upgrade. It runs
before the new units start, so on a first deploy it has the GPU to itself.
"""

from __future__ import annotations

from dataclasses import replace

from hosttune.actions.base import Command, Op
from hosttune.deploy.errors import DeployError
from hosttune.deploy.settings import ServeSettings

CACHE = "/var/cache/hosttune-engine"
CACHE_ENV = "HOSTTUNE_ENGINE_CACHE"
ENGINE = "custom"  # the bundled engine; vLLM and SGLang tune their own kernels


def with_cache(settings: ServeSettings, engine: str) -> ServeSettings:
    """The settings whose units read the tuned-table cache (refused for an engine other than the bundled one)."""
    if engine != ENGINE:
        raise DeployError(f"--tune tunes the bundled engine's kernels; --engine {engine} tunes its own: drop --tune")
    if str(settings.flags.get("device")) == "cpu":  # no GPU to tune on: the step would be left out unsaid
        raise DeployError("--tune tunes the bundled engine's kernels for a GPU, and it runs on CPU (device cpu): "
                          "drop --tune")
    return replace(settings, env={**settings.env, CACHE_ENV: CACHE})


def tune_ops(release_dir: str, settings: ServeSettings, gpu: int, budget_s: float,
             tensor_parallel: int = 1) -> list[Op]:
    """The release's `hosttune-engine tune` on one of the service's GPUs, into the units' cache: for the weights,
    the activations' dtype, the KV block size, the KV cache's dtype and the tensor parallelism the service is given
    (the tables' keys hold each: a float16 service reads no bfloat16 entry, an e4m3 cache none of a bf16 one, a
    rank of TP 2 the entries of its shards' shapes)."""
    same = tuple(arg for flag in ("quantization", "dtype", "block-size", "kv-cache-dtype") if settings.flags.get(flag)
                 for arg in (f"--{flag}", str(settings.flags[flag])))
    same += ("--tensor-parallel-size", str(tensor_parallel)) if tensor_parallel > 1 else ()
    argv = ("env", f"{CACHE_ENV}={CACHE}", f"CUDA_VISIBLE_DEVICES={gpu}", f"{release_dir}/bin/hosttune-engine", "tune",
            "--model", settings.model, "--budget-s", f"{budget_s:g}", "--if-missing", *same)
    return [Command(("mkdir", "-p", CACHE)), Command(argv)]
