"""Launch configurations of the Triton kernels, tuned per GPU and persisted on disk.

A kernel asks `launch_config(kernel, key, default)` for its block shapes, warps
and stages. Answers come from JSON tables: the one shipped beside this module
(`tuned_configs.json`, measured on the GPUs we benchmark on) and, over it, a
user table (`$HOSTTUNE_KERNEL_CONFIGS`, default `~/.cache/hosttune/kernel_configs.json`)
that `tune()` writes. Nothing is tuned while serving, so a restart reads the
table instead of re-tuning. Tables are keyed by the device name, then the
kernel, then a shape key the kernel builds (head dim, GQA group, length bucket).
"""

from __future__ import annotations

import json
import os
from functools import lru_cache
from pathlib import Path
from typing import Callable

SHIPPED = Path(__file__).with_name("tuned_configs.json")
USER_ENV = "HOSTTUNE_KERNEL_CONFIGS"


def user_table_path() -> Path:
    return Path(os.environ.get(USER_ENV) or Path.home() / ".cache" / "hosttune" / "kernel_configs.json")


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
def _tables() -> dict:
    merged: dict = {}
    for path in (SHIPPED, user_table_path()):
        for dev, kernels in _read(path).items():
            for kernel, keys in kernels.items():
                merged.setdefault(dev, {}).setdefault(kernel, {}).update(keys)
    return merged


def reload_tables() -> None:
    """Forget the cached tables (after `tune` wrote, or a test changed the environment)."""
    _tables.cache_clear()


def launch_config(kernel: str, key: str, device, default: dict) -> dict:
    """The tuned config for (device, kernel, key), else `default`."""
    found = _tables().get(device_key(device), {}).get(kernel, {}).get(key)
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
    """Record a tuned config in the user table (or `path`)."""
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
