"""The GPU a plan is for: this machine's, or one named (to print the plan another machine would run)."""

from __future__ import annotations

from dataclasses import dataclass

from hosttune_engine.errors import ConfigError

# Name fragment -> compute capability, for GPUs named on a machine without them (most specific first).
KNOWN = (("H200", (9, 0)), ("H100", (9, 0)), ("GH200", (9, 0)), ("L40S", (8, 9)), ("L40", (8, 9)), ("L4", (8, 9)),
         ("RTX 4090", (8, 9)), ("RTX 6000 Ada", (8, 9)), ("A100", (8, 0)), ("A800", (8, 0)), ("A30", (8, 0)),
         ("A40", (8, 6)), ("A10", (8, 6)), ("RTX 3090", (8, 6)), ("RTX A6000", (8, 6)), ("V100", (7, 0)),
         ("T4", (7, 5)))


AMPERE = (8, 0)  # the first compute capability with bfloat16
# The first with Triton's e4m3 type (fp8e4nv), which the FP8 KV cache's kernels and the FP8 tensor cores take;
# from Ampere to it the FP8-weight kernels decode e4m3 by integer operations instead (kernels/e4m3.py).
ADA = (8, 9)


def _dotted(capability: tuple[int, int]) -> str:
    return ".".join(map(str, capability))


def _fp8_refusal(fp8_weights: str | None, is_fp8_kv: bool) -> str:
    """What of FP8 a GPU before Ada cannot run (FP8 weights only before Ampere), why, and what runs instead."""
    refused, instead = [], []
    if fp8_weights:
        refused.append(f"FP8 weights ({fp8_weights})")
        instead.append("serve a 16-bit or a 4-bit AWQ/GPTQ checkpoint of the model")
    if is_fp8_kv:
        refused.append("an FP8 KV cache")
        instead.append("leave --kv-cache-dtype auto")
    return (f"cannot run {' or '.join(refused)}: the Triton kernels' e4m3 type needs {_dotted(ADA)} or later "
            f"(Ada or Hopper), and before it only FP8 weights run, decoded by integer operations from "
            f"{_dotted(AMPERE)} (Ampere) on; {' and '.join(instead)}")


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
        return self.capability >= ADA

    @property
    def decodes_e4m3_by_bits(self) -> bool:
        """Whether the FP8-weight kernels read e4m3 as bytes here (Triton has no e4m3 type before Ada)."""
        return self.is_cuda and self.capability < ADA

    def why_kernels_cannot_run(self, dtype: str, fp8_weights: str | None, is_fp8_kv: bool) -> str:
        """Why the Triton kernels cannot run activations of `dtype` (a torch dtype's name), weights of the FP8
        layout `fp8_weights` or an FP8 KV cache on this GPU, with what can, in one line; '' where they can.
        Before Ampere (8.0) a GPU has no bfloat16, and FP8 weights are refused; before Ada (8.9) Triton has no
        e4m3 type, so FP8 weights run decoded by integer operations (W8A16, activations in bf16) and the FP8 KV
        cache's kernels do not compile (the torch backend's references cast with torch instead and are not
        checked here)."""
        if self.capability >= ADA or not self.is_cuda:
            return ""
        head = f"{self.name} (compute capability {_dotted(self.capability)})"
        float16 = ", with --dtype float16" if dtype == "bfloat16" and self.capability < AMPERE else ""
        fp8_weights = fp8_weights if self.capability < AMPERE else None
        if fp8_weights or is_fp8_kv:
            return f"{head} {_fp8_refusal(fp8_weights, is_fp8_kv)}{float16}"
        if dtype == "bfloat16" and self.capability < AMPERE:
            return f"{head} has no bfloat16, which needs {_dotted(AMPERE)} or later: give --dtype float16"
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
