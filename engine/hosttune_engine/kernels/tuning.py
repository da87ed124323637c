"""Launch configurations of the Triton kernels, tuned per GPU and persisted on disk.

Tables are keyed by the device name, then the kernel, then a shape key the kernel builds (head dim, GQA
group, batch or length bucket, projection shape). They come from three places, later over earlier:
- the table shipped beside this module (`tuned_configs.json`, measured on the GPUs we benchmark on);
- the tuned-table cache (`$HOSTTUNE_ENGINE_CACHE`, default `~/.cache/hosttune-engine/`), one file per GPU name,
  driver and Triton version, written by `hosttune-engine tune`; a file counts only where all three match
  this machine, since a new driver or Triton can change what is fastest;
- an explicit table (`$HOSTTUNE_KERNEL_CONFIGS`, default `~/.cache/hosttune/kernel_configs.json`), which the
  benchmarks' own sweeps write with `save_config`.
Nothing is tuned while serving, so a restart reads the tables instead of re-tuning.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import tempfile
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Callable

from hosttune_engine.errors import ConfigError

SHIPPED = Path(__file__).with_name("tuned_configs.json")
USER_ENV = "HOSTTUNE_KERNEL_CONFIGS"
CACHE_ENV = "HOSTTUNE_ENGINE_CACHE"
SHIPPED_ENV = "HOSTTUNE_ENGINE_SHIPPED_TABLE"  # "off": ignore the shipped table (to measure a tune against it)


@dataclass(frozen=True)
class TableKey:
    """What a tuned table was measured on."""

    gpu: str  # the CUDA device name, e.g. "NVIDIA H200"
    driver: str  # the NVIDIA driver version
    triton: str  # the Triton version

    @property
    def file_name(self) -> str:
        return re.sub(r"[^A-Za-z0-9._-]+", "_", f"{self.gpu}-driver{self.driver}-triton{self.triton}") + ".json"


def cached_paths(gpu: str) -> list[Path]:
    """The cache's table files tuned on `gpu`, under any driver and Triton (their names begin with the GPU's)."""
    prefix = TableKey(gpu, "", "").file_name.split("-driver")[0] + "-driver"
    folder = cache_dir() / "tuned"
    return sorted(p for p in folder.glob("*.json") if p.name.startswith(prefix)) if folder.is_dir() else []


def user_table_path() -> Path:
    return Path(os.environ.get(USER_ENV) or Path.home() / ".cache" / "hosttune" / "kernel_configs.json")


def cache_dir() -> Path:
    """Where `hosttune-engine tune` writes and the engine reads tuned tables."""
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "hosttune-engine")


def cache_path(key: TableKey) -> Path:
    return cache_dir() / "tuned" / key.file_name


def _read(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


@lru_cache(maxsize=None)
def _device_name(index: int) -> str:
    import torch

    return torch.cuda.get_device_name(index) if torch.cuda.is_available() else "cpu"


def device_key(device) -> str:
    """The table key of a device: its CUDA name ('NVIDIA H200'), or 'cpu'."""
    if getattr(device, "type", "cpu") != "cuda":
        return "cpu"
    return _device_name(device.index if device.index is not None else 0)


@lru_cache(maxsize=1)
def driver_version() -> str:
    """The NVIDIA driver's version ('550.54.15'), else the CUDA driver API's, else 'none'."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20, check=True).stdout.split()
        if out:
            return out[0]
    except (OSError, subprocess.SubprocessError):
        pass
    import torch

    return f"cuda{torch._C._cuda_getDriverVersion()}" if torch.cuda.is_available() else "none"


def triton_version() -> str:
    import triton

    return triton.__version__


def present_key(gpu: str) -> TableKey:
    """The table key of this machine's GPU named `gpu`."""
    return TableKey(gpu, driver_version(), triton_version())


def cached_table(key: TableKey) -> dict:
    """The kernels of the cached table tuned on exactly `key`, or {}."""
    return _read(cache_path(key)).get("kernels", {})


def cached_about(key: TableKey) -> dict:
    """What the cached table tuned on `key` says of itself besides its kernels (when, for which weights)."""
    return {k: v for k, v in _read(cache_path(key)).items() if k != "kernels"}


def cached_tables() -> list[tuple[TableKey, dict]]:
    """Every table in the cache: (what it was tuned on, its kernels)."""
    found = []
    for path in sorted((cache_dir() / "tuned").glob("*.json")):
        raw = _read(path)
        if {"gpu", "driver", "triton", "kernels"} <= set(raw):
            found.append((TableKey(raw["gpu"], raw["driver"], raw["triton"]), raw["kernels"]))
    return found


def check_cache_writable() -> None:
    """Refuse, in one line, a cache folder a tuned table could not be written to (made if missing)."""
    folder = cache_dir() / "tuned"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryFile(dir=folder).close()
    except OSError as e:
        raise ConfigError(f"{folder}: cannot write the tuned table there ({e.strerror}); set ${CACHE_ENV} to a "
                          "folder this user can write") from None


def write_cached_table(key: TableKey, kernels: dict, about: dict) -> Path:
    """Write a tuned table for `key` to the cache (replacing one tuned on the same key)."""
    path = cache_path(key)
    path.parent.mkdir(parents=True, exist_ok=True)
    body = {"gpu": key.gpu, "driver": key.driver, "triton": key.triton, **about, "kernels": kernels}
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(body, indent=1, sort_keys=True))
    tmp.replace(path)
    reload_tables()
    return path


# A GPU with no shipped table of its own reads the table of one with the same SMs and tensor cores, where the same
# tiles win: on an H100 80GB HBM3 the H200's table against none gave AWQ decode 3.7x at 1 row and 4.2x at 64,
# FP8 decode 1.1x, bf16 the same or better (benchmarks/history/NOTES.md). A tune for the GPU itself still wins
# over it, entry by entry. The H200 NVL is the H200's chip on a PCIe card.
BORROWS = (("H100", "NVIDIA H200"), ("H800", "NVIDIA H200"), ("GH200", "NVIDIA H200"), ("H200", "NVIDIA H200"))


def shipped_source(gpu: str) -> str | None:
    """Whose shipped table `gpu` reads: its own, a GPU's it borrows (`BORROWS`), or none."""
    return _shipped(gpu)[0]


def shipped_table(gpu: str) -> dict:
    return _shipped(gpu)[1]


def _shipped(gpu: str) -> tuple[str | None, dict]:
    """(whose shipped table `gpu` reads, that table), the file read once."""
    if os.environ.get(SHIPPED_ENV) == "off":
        return None, {}
    tables = _read(SHIPPED)
    # a name in another case (`plan --gpu h100`) borrows as the GPU itself does
    source = gpu if gpu in tables else next((name for part, name in BORROWS if part.lower() in gpu.lower()
                                             and name in tables), None)
    return source, tables.get(source, {}) if source else {}


def _merge(into: dict, kernels: dict) -> None:
    for kernel, keys in kernels.items():
        into.setdefault(kernel, {}).update(keys)


@lru_cache(maxsize=None)
def table_for(gpu: str, present: bool = True) -> dict:
    """The merged table for `gpu`: shipped, then its cached table (tuned on this driver and Triton when
    `present`, else the newest file for that name), then the explicit table."""
    merged: dict = {}
    _merge(merged, shipped_table(gpu))
    if gpu != "cpu":
        _merge(merged, _cached_for(gpu, present))
    _merge(merged, _read(user_table_path()).get(gpu, {}))
    return merged


def _cached_for(gpu: str, present: bool) -> dict:
    key = _cached_key(gpu, present)
    return cached_table(key) if key else {}


def _cached_key(gpu: str, present: bool) -> TableKey | None:
    """The cached table that counts for `gpu`: this machine's versions' when present, else the last by name."""
    if present:
        key = present_key(gpu)
        return key if cached_table(key) else None
    same = [key for key, _ in cached_tables() if key.gpu == gpu]
    return same[-1] if same else None


def table_sources(gpu: str, present: bool = True) -> list[str]:
    """Where `table_for(gpu, present)` takes entries from, in words (empty: no table has this GPU)."""
    source = shipped_source(gpu)
    found = [] if not source else ["shipped"] if source == gpu else [f"shipped, {source}'s (same architecture)"]
    key = _cached_key(gpu, present) if gpu != "cpu" else None
    if key is not None:
        found.append(f"tuned on driver {key.driver}, Triton {key.triton} ({cache_path(key)})")
    if _read(user_table_path()).get(gpu):
        found.append(str(user_table_path()))
    return found


def reload_tables() -> None:
    """Forget the cached tables (after `tune` wrote, or a test changed the environment)."""
    table_for.cache_clear()


def launch_config(kernel: str, key: str, device, default: dict) -> dict:
    """The tuned config for (device, kernel, key), else `default`."""
    found = table_for(device_key(device)).get(kernel, {}).get(key)
    return {**default, **found} if found else dict(default)


def length_bucket(n: int) -> str:
    """Prefill length ranges that get their own variants: under 1K, 1K-3K, 3K and more."""
    return "lt1k" if n < 1024 else ("1k-3k" if n < 3072 else "ge3k")


def batch_bucket(n: int) -> str:
    for limit in (1, 8, 32, 64, 128):
        if n <= limit:
            return f"le{limit}"
    return "gt128"


def save_config(kernel: str, key: str, device_name: str, config: dict, path: Path | None = None) -> Path:
    """Record a tuned config in the explicit table (or `path`)."""
    path = path or user_table_path()
    table = _read(path)
    table.setdefault(device_name, {}).setdefault(kernel, {})[key] = config
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(table, indent=1, sort_keys=True))
    tmp.replace(path)
    reload_tables()
    return path


def tune(candidates: list[dict], time_one: Callable[[dict], float]) -> tuple[dict, list[tuple[dict, float]]]:
    """Time every candidate (`time_one` returns ms, or raises when a config fails); the fastest wins."""
    results = []
    for cfg in candidates:
        try:
            results.append((cfg, time_one(cfg)))
        except Exception as e:  # a config that does not compile or fits no shared memory is skipped
            results.append((cfg, float("inf")))
            print(f"  config {cfg} failed: {type(e).__name__}: {str(e)[:200]}", flush=True)
    best = min(results, key=lambda r: r[1])
    if best[1] == float("inf"):
        raise RuntimeError("no candidate config ran")
    return best[0], results
