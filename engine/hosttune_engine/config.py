"""Engine configuration: one dataclass with defaults, validated when built."""

from __future__ import annotations

import ctypes
import importlib.util
import math
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from hosttune_engine.errors import ConfigError

LOAD_FORMATS = ("auto", "safetensors", "dummy")
DTYPES = ("auto", "bfloat16", "float16", "float32")
DEVICES = ("auto", "cuda", "cpu")
KERNEL_BACKENDS = ("auto", "triton", "torch")
SCHEDULING_POLICIES = ("fcfs", "priority")
QUANTIZATIONS = ("fp8", "fp8-block", "fp8-channel", "fp8-tensor", "awq", "gptq")  # all but fp8: dummy weights
KV_CACHE_DTYPES = ("auto", "fp8")


@dataclass(frozen=True)
class EngineConfig:
    """Everything the engine needs to start.

    `kernel_backend="auto"` runs the Triton kernels on CUDA and their torch
    references elsewhere. `num_kv_blocks` overrides the KV pool size that is
    otherwise derived from free GPU memory and `gpu_memory_utilization` (or
    from `cpu_kv_cache_gib` on CPU). `max_num_seqs` is the hard maximum batch
    size; `max_num_batched_tokens` is the per-step token budget that chunks long
    prefills. On CUDA, decode-only steps of up to `max_cuda_graph_batch_size`
    sequences replay CUDA graphs captured at start; `enforce_eager` turns that off.
    `max_step_ms` gives steps that hold decodes a time budget for their prefill tokens,
    from step costs measured at start, or after warmup in a server (0: 2.4 times a full decode-only step
    measured then).
    `tensor_parallel_size` GPUs run one copy of the model, each a shard of it, in a
    process of its own (`parallel/`); 1 is one GPU in this process.
    `quantization="fp8"` quantizes a bf16 checkpoint's projections to FP8 at load (a quantized
    checkpoint needs nothing: config.json says its layout); with `load_format="dummy"` any of
    QUANTIZATIONS quantizes the random weights in that layout. `step_log` names a file that gets a JSON
    line per step (its real time, tokens and the budget's estimate), for tuning `max_step_ms`.
    `kv_cache_dtype="fp8"` keeps keys and values in e4m3 with one scale per row (kernels/kv_quant.py):
    about twice the tokens in the same memory; "auto" keeps them in the model's dtype.
    """

    model: str
    load_format: str = "auto"
    dtype: str = "auto"
    device: str = "auto"
    kernel_backend: str = "auto"
    seed: int = 0
    block_size: int = 16
    gpu_memory_utilization: float = 0.90
    cpu_kv_cache_gib: float = 0.25
    num_kv_blocks: int | None = None
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    max_model_len: int | None = None
    enable_prefix_caching: bool = True
    scheduling_policy: str = "fcfs"
    tokenizer: str | None = None
    enforce_eager: bool = False
    max_cuda_graph_batch_size: int = 256
    max_step_ms: float | None = None  # None: steps bounded by tokens only; 0: a budget from the measured costs
    tensor_parallel_size: int = 1
    quantization: str | None = None
    step_log: str | None = None  # a file that gets a JSON line per step (core/step_log.py)
    kv_cache_dtype: str = "auto"

    def __post_init__(self) -> None:
        _check_choice("load_format", self.load_format, LOAD_FORMATS)
        _check_choice("dtype", self.dtype, DTYPES)
        _check_choice("device", self.device, DEVICES)
        _check_choice("kernel_backend", self.kernel_backend, KERNEL_BACKENDS)
        _check_choice("scheduling_policy", self.scheduling_policy, SCHEDULING_POLICIES)
        _check_choice("kv_cache_dtype", self.kv_cache_dtype, KV_CACHE_DTYPES)
        if self.quantization is not None:
            _check_choice("quantization", self.quantization, QUANTIZATIONS)
            if self.quantization != "fp8" and self.load_format != "dummy":
                raise ConfigError(f"quantization={self.quantization!r} is for dummy weights only; with a "
                                  "checkpoint use 'fp8' (quantize at load) or none (config.json says the layout)")
        check_block_size(self.block_size)
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ConfigError(
                f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}"
            )
        if self.num_kv_blocks is not None and self.num_kv_blocks < 1:
            raise ConfigError(f"num_kv_blocks must be >= 1, got {self.num_kv_blocks}")
        if self.max_num_seqs < 1:
            raise ConfigError(f"max_num_seqs must be >= 1, got {self.max_num_seqs}")
        if self.max_num_batched_tokens < self.max_num_seqs:
            raise ConfigError(
                "max_num_batched_tokens must be >= max_num_seqs so every running sequence "
                f"can decode each step ({self.max_num_batched_tokens} < {self.max_num_seqs})"
            )
        if self.max_model_len is not None and self.max_model_len < 2:
            raise ConfigError(f"max_model_len must be >= 2, got {self.max_model_len}")
        if self.max_cuda_graph_batch_size < 1:
            raise ConfigError(f"max_cuda_graph_batch_size must be >= 1, got {self.max_cuda_graph_batch_size}")
        if self.max_step_ms is not None and not 0 <= self.max_step_ms < math.inf:  # NaN compares False
            raise ConfigError(f"max_step_ms must be >= 0 (0: measured), got {self.max_step_ms}")
        check_tensor_parallel_size(self.tensor_parallel_size)
        if not 0 < self.cpu_kv_cache_gib < math.inf:
            raise ConfigError(f"cpu_kv_cache_gib must be > 0, got {self.cpu_kv_cache_gib}")


def activation_dtype(name: str, checkpoint_dtype: str | None, on_cuda: bool) -> str:
    """The dtype an engine computes in, of DTYPES' names: `name` unless "auto"; on the CPU float32 (its
    half-precision matmuls are slow and loose); on a GPU float16 for a float16 checkpoint, else bfloat16."""
    if name != "auto":
        return name
    if not on_cuda:
        return "float32"
    return "float16" if checkpoint_dtype == "float16" else "bfloat16"


def runs_triton(backend: str, on_cuda: bool) -> bool:
    """Whether the Triton kernels run: `triton` asks for them anywhere, `auto` on CUDA. Triton has no CPU driver,
    so on the CPU only its interpreter runs them."""
    if backend == "triton" and not on_cuda and os.environ.get("TRITON_INTERPRET") != "1":
        raise ConfigError("kernel_backend='triton' on the CPU needs TRITON_INTERPRET=1 (Triton's interpreter, slow); "
                          "use kernel_backend 'auto' or 'torch'")
    return backend == "triton" or (backend == "auto" and on_cuda)


@dataclass(frozen=True)
class CudaFacts:
    """What the CUDA driver counts and gives, and the CUDA torch was built for, read before torch is imported."""

    num_gpus: int
    driver_cuda: int  # 12040 for 12.4; 0 where no driver loads
    torch_cuda: str | None  # '12.8'; None for a build without CUDA, '' where torch does not say

    @classmethod
    def read(cls, device: str) -> "CudaFacts | None":
        """The driver's answer, from its one probe (cuInit), where `device` may be a GPU; None where it cannot
        (device='cpu', or not Linux)."""
        if device == "cpu" or not sys.platform.startswith("linux"):
            return None
        return cls(*driver_gpus(), torch_cuda())


def surely_cpu(device: str, cuda: CudaFacts | None = None) -> bool:
    """Whether `device` runs on the CPU, known before torch is imported: 'cpu', or 'auto' on a Linux machine whose
    CUDA driver gives torch no GPU: none loads (torch reaches every GPU through libcuda.so.1), it fails to
    initialize, or it counts no device (none present, or none in CUDA_VISIBLE_DEVICES); or where torch is a CPU
    build. Otherwise whether torch sees a GPU is torch's to say. `cuda` is what `CudaFacts.read` gave, if read."""
    if device != "auto" or not sys.platform.startswith("linux"):
        return device == "cpu"
    cuda = cuda or CudaFacts.read(device)
    return cuda.num_gpus < 1 or cuda.torch_cuda is None


def check_cuda_driver(device: str, cuda: CudaFacts | None = None) -> None:
    """Refuse GPUs torch cannot use, before the model loads: 'cuda' where the driver gives no GPU or torch is a
    build without CUDA, and a driver that counts GPUs but gives an older CUDA than the one torch was built for
    (torch would see none, and 'auto' would serve on the CPU). A driver runs any runtime of its CUDA major (minor
    version compatibility), so only the majors are compared. `cuda` is what `CudaFacts.read` gave, if read."""
    if device == "cpu" or not sys.platform.startswith("linux"):
        return
    cuda = cuda or CudaFacts.read(device)
    num_gpus, driver_cuda, built_for = cuda.num_gpus, cuda.driver_cuda, cuda.torch_cuda
    if device == "cuda" and num_gpus < 1:
        raise ConfigError("device='cuda' but the CUDA driver gives no GPU (none loads, it fails to initialize, or it "
                          "counts none in CUDA_VISIBLE_DEVICES); use device='cpu' or 'auto'")
    if device == "cuda" and built_for is None:
        raise ConfigError("device='cuda' but torch is a build without CUDA; install a CUDA build of torch, or use "
                          "device='cpu' or 'auto'")
    if num_gpus < 1 or not built_for or not built_for.split(".")[0].isdigit():
        return
    if driver_cuda // 1000 < int(built_for.split(".")[0]):
        raise ConfigError(f"the NVIDIA driver gives CUDA {driver_cuda // 1000}.{driver_cuda % 1000 // 10}, older "
                          f"than the CUDA {built_for} torch was built for, so torch cannot use its {num_gpus} "
                          f"GPU{'s' if num_gpus > 1 else ''}; update the driver, or use device='cpu'")


def driver_gpus() -> tuple[int, int]:
    """The GPUs the CUDA driver counts and its CUDA version (12040 for 12.4); (0, 0) where none loads or it fails
    to initialize. The driver's first call, as torch's would be; tensor-parallel ranks are processes started
    afresh, not forks."""
    try:
        driver = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return 0, 0
    count, version = ctypes.c_int(0), ctypes.c_int(0)
    if driver.cuInit(0) != 0 or driver.cuDeviceGetCount(ctypes.byref(count)) != 0 or count.value < 1:
        return 0, 0
    return count.value, version.value if driver.cuDriverGetVersion(ctypes.byref(version)) == 0 else 0


TORCH_CUDA = re.compile(r"^cuda\b[^=\n]*=\s*(None|'[^']*')", re.MULTILINE)  # torch/version.py's line


def torch_cuda() -> str | None:
    """The CUDA version torch was built for ('12.8'), None for a build without CUDA, read from torch/version.py
    without importing torch (seconds); '' where that file does not say."""
    spec = importlib.util.find_spec("torch")
    try:
        text = Path(spec.submodule_search_locations[0], "version.py").read_text()
    except (AttributeError, TypeError, IndexError, OSError, UnicodeDecodeError):
        return ""
    found = TORCH_CUDA.search(text)
    if found is None:
        return ""
    return None if found.group(1) == "None" else found.group(1).strip("'")


def check_block_size(block_size: int) -> None:
    """A KV-cache block holds a power of two of tokens (the attention kernels' tiles split it evenly)."""
    if block_size < 1 or block_size & (block_size - 1):
        raise ConfigError(f"block_size must be a power of two, got {block_size}")


def check_tensor_parallel_size(tensor_parallel_size: int) -> None:
    if tensor_parallel_size < 1:
        raise ConfigError(f"tensor_parallel_size must be >= 1, got {tensor_parallel_size}")


def _check_choice(name: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ConfigError(f"{name} must be one of {', '.join(choices)}; got {value!r}")
