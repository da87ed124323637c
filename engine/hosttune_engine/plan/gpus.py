"""The GPU a plan is for: this machine's, or one named (to print the plan another machine would run)."""

from __future__ import annotations

from dataclasses import dataclass

from hosttune_engine.errors import ConfigError

# Name fragment -> compute capability, for GPUs named on a machine without them (most specific first).
KNOWN = (("H200", (9, 0)), ("H100", (9, 0)), ("GH200", (9, 0)), ("L40S", (8, 9)), ("L40", (8, 9)), ("L4", (8, 9)),
         ("RTX 4090", (8, 9)), ("RTX 6000 Ada", (8, 9)), ("A100", (8, 0)), ("A800", (8, 0)), ("A30", (8, 0)),
         ("A40", (8, 6)), ("A10", (8, 6)), ("RTX 3090", (8, 6)), ("RTX A6000", (8, 6)), ("V100", (7, 0)),
         ("T4", (7, 5)))


AMPERE = (8, 0)  # the first compute capability with bfloat16, FP8 weights and an FP8 KV cache in the kernels


@dataclass(frozen=True)
class GpuInfo:
    """A device as the plan sees it; `name` is also the tuned tables' key."""

    name: str  # "NVIDIA H200", or "cpu"
    capability: tuple[int, int]  # (0, 0) for the CPU
    present: bool  # this machine's (its driver and Triton version pick its cached table)

    @property
    def is_cuda(self) -> bool:
        return self.name != "cpu"

    @property
    def has_fp8_tensor_cores(self) -> bool:
        return self.capability >= (8, 9)

    def why_kernels_cannot_run(self, dtype: str, fp8_weights: str | None, is_fp8_kv: bool) -> str:
        """Why the Triton kernels cannot run activations of `dtype` (a torch dtype's name), weights of the FP8
        layout `fp8_weights` or an FP8 KV cache on this GPU, with what can, in one line; '' where they can.
        Before Ampere (8.0) a GPU has no bfloat16 and no FP8 (from 8.0 FP8 weights are converted in registers,
        from 8.9 they also run on FP8 tensor cores)."""
        if self.capability >= AMPERE or not self.is_cuda:
            return ""
        head = f"{self.name} (compute capability {'.'.join(map(str, self.capability))})"
        since = ".".join(map(str, AMPERE))
        float16 = ", with --dtype float16" if dtype == "bfloat16" else ""
        if fp8_weights:
            return (f"{head} cannot run FP8 weights ({fp8_weights}), which need {since} or later: serve a 16-bit "
                    f"checkpoint of the model{float16}")
        if is_fp8_kv:
            return f"{head} cannot run an FP8 KV cache, which needs {since} or later: leave --kv-cache-dtype auto{float16}"
        if dtype == "bfloat16":
            return f"{head} has no bfloat16, which needs {since} or later: give --dtype float16"
        return ""


CPU = GpuInfo("cpu", (0, 0), True)


def present_gpu(device) -> GpuInfo:
    """The GPU behind a torch device (CPU for a CPU device)."""
    import torch

    if getattr(device, "type", "cpu") != "cuda":
        return CPU
    return GpuInfo(torch.cuda.get_device_name(device), torch.cuda.get_device_capability(device), True)


def named_gpu(name: str) -> GpuInfo:
    """A GPU by its CUDA name, e.g. "NVIDIA A100-SXM4-80GB"."""
    for fragment, capability in KNOWN:
        if fragment.lower() in name.lower():
            return GpuInfo(name, capability, False)
    raise ConfigError(f"--gpu {name!r}: unknown GPU; give its CUDA name as nvidia-smi prints it, one of the "
                      f"families {', '.join(f for f, _ in KNOWN)}")
