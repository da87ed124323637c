"""Shared pieces of the engine benchmarks: the model shape, FLOP and byte counts, the
hardware ceilings measured in the same run, and timing helpers (CUDA events, graph replay)."""

from __future__ import annotations

import atexit
import datetime
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

if not __package__:  # imported by a script run as a file: this checkout's packages
    import _checkout  # noqa: F401

from benchmarks.engine.qwen25_7b import QWEN25_7B  # noqa: E402,F401  (one definition, shared with the GPU checks)

REPO = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Shape:
    """What the roofline models need to know about the model (bf16)."""

    hidden: int = 3584
    inter: int = 18944
    layers: int = 28
    heads: int = 28
    kv_heads: int = 4
    head_dim: int = 128
    vocab: int = 152064
    dtype_bytes: int = 2

    @property
    def layer_params(self) -> int:
        h, q, kv = self.hidden, self.heads * self.head_dim, self.kv_heads * self.head_dim
        return h * (q + 2 * kv) + q * h + h * 2 * self.inter + self.inter * h

    @property
    def linear_params(self) -> int:
        """Every matrix a decode step multiplies by: the layers' projections and the LM head."""
        return self.layers * self.layer_params + self.hidden * self.vocab

    @property
    def weight_bytes(self) -> int:
        return self.linear_params * self.dtype_bytes

    @property
    def kv_bytes_per_token(self) -> int:
        return self.layers * 2 * self.kv_heads * self.head_dim * self.dtype_bytes

    def attention_flops(self, q_len: int, prefix: int = 0) -> float:
        """QK^T and PV over a causal prompt chunk of q_len after `prefix` cached tokens, all layers."""
        pairs = q_len * prefix + q_len * (q_len + 1) / 2
        return self.layers * 4 * self.heads * self.head_dim * pairs

    def prefill_flops(self, n: int) -> float:
        """A prompt of n tokens: every projection on every token, causal attention, the LM head once."""
        return 2 * n * self.layers * self.layer_params + self.attention_flops(n) + 2 * self.hidden * self.vocab

    def decode_step_flops(self, batch: int) -> float:
        return 2 * batch * self.linear_params


SHAPE = Shape()


def head_commit() -> str:
    """The repository's short commit, for a script that records its own."""
    return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=REPO).stdout.strip()


def env_info(commit: str) -> dict:
    import torch
    import triton

    try:
        smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,clocks.max.sm",
                              "--format=csv,noheader"], capture_output=True, text=True).stdout.strip()
    except FileNotFoundError:
        smi = "no nvidia-smi"
    info = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), "gpu": smi,
            "torch": torch.__version__, "cuda": torch.version.cuda, "triton": triton.__version__,
            "python": sys.version.split()[0], "commit": commit}
    try:
        import transformers

        info["transformers"] = transformers.__version__
    except ImportError:
        pass
    return info


def sync() -> None:
    import torch

    if torch.cuda.is_available():  # the benchmarks' CPU tests run them on a tiny model
        torch.cuda.synchronize()


def bench_ms(fn, rep_ms: int = 60) -> float:
    """Median ms of fn() with CUDA events (triton's do_bench: warm-up first, L2 flushed between calls)."""
    import triton

    return triton.testing.do_bench(fn, warmup=10, rep=rep_ms, return_mode="median")


def graph_ms(fn, replays: int = 15) -> float:
    """Median ms of one replay of fn() captured as a CUDA graph (after one eager warm-up)."""
    import torch

    fn()
    sync()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    graph.replay()
    sync()
    return replay_ms(graph, replays)


def per_launch_us(fn, launches: int) -> float:
    """Microseconds per call of fn() with `launches` calls captured in one CUDA graph, so that the replay's
    own cost is shared among them."""
    return graph_ms(lambda: [fn() for _ in range(launches)]) * 1e3 / launches


def replay_ms(graph, replays: int) -> float:
    """Median ms of one replay of a captured CUDA graph, each timed by CUDA events."""
    import torch

    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


BLAS_LIBRARIES = ("cublas", "cublaslt")  # torch's two CUDA GEMM paths; a floor takes the faster


@contextmanager
def blas_library(name: str):
    """torch's CUDA GEMMs through `name` inside the block."""
    import torch

    before = torch.backends.cuda.preferred_blas_library()
    torch.backends.cuda.preferred_blas_library(name)
    try:
        yield
    finally:
        torch.backends.cuda.preferred_blas_library(before)


def per_library(measure) -> dict[str, float]:
    """measure() once under each BLAS library, by library name."""
    results = {}
    for lib in BLAS_LIBRARIES:
        with blas_library(lib):
            results[lib] = measure()
    return results


def measure_ceilings() -> dict:
    """Device-to-device copy bandwidth (bytes read + written) and the bf16 GEMM rate (8192^3, random data),
    the faster of the two BLAS libraries."""
    import torch

    n = 1 << 30  # 1 GiB each way
    src = torch.empty(n, dtype=torch.uint8, device="cuda").random_()
    dst = torch.empty_like(src)
    copy_ms = bench_ms(lambda: dst.copy_(src), rep_ms=100)
    del src, dst
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    rates = per_library(lambda: 2 * 8192**3 / bench_ms(lambda: a @ b, rep_ms=200) / 1e9)
    del a, b
    torch.cuda.empty_cache()
    return {"copy_tb_s": 2 * n / copy_ms / 1e9, "gemm_tflop_s": max(rates.values()), "gemm_tflop_s_by_library": rates}


def model_folder(config: dict) -> str:
    """A model folder holding only `config.json` (the engine makes dummy weights for it), removed when this
    process exits."""
    folder = Path(tempfile.mkdtemp(prefix="qwen7b-dummy-"))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    (folder / "config.json").write_text(json.dumps(config))
    return str(folder)


class Deadline:
    """The run's time budget: sections ask before starting whether enough is left."""

    def __init__(self, seconds: float):
        self.end = time.monotonic() + seconds

    def left(self) -> float:
        return self.end - time.monotonic()

    def allows(self, seconds: float) -> bool:
        return self.left() >= seconds
