"""Programmatic dependent launch (Hopper and later): a kernel launched with it may start while the kernel
before it on the stream is still finishing, and waits for that kernel's results only where it reads them.

A one-token decode step is a chain of short kernels, each a few microseconds; without it every GEMV pays
its launch after the previous kernel has drained. A GEMV launched this way signals at once that the kernel
after it may launch too, then waits (`wait_for_inputs`) before it reads the activations or writes anything:
whatever the previous kernel writes or still reads is untouched before the wait. Inside a CUDA graph the
launch is captured as a programmatic edge, so replays overlap the same way.
"""

from __future__ import annotations

from functools import lru_cache

import torch
import triton
import triton.language as tl

try:
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
except ImportError:  # a Triton without grid dependency control: no kernel is launched this way
    gdc_launch_dependents = gdc_wait = None


@triton.jit
def wait_for_inputs(PDL: tl.constexpr):
    """Let the next kernel launch, then wait until the previous one's writes are visible (no-op without PDL)."""
    if PDL:
        gdc_launch_dependents()
        gdc_wait()


@lru_cache(maxsize=None)
def _capable(index: int) -> bool:
    return torch.cuda.get_device_capability(index) >= (9, 0)


def use_pdl(cfg: dict, device: torch.device) -> bool:
    """Whether a launch with this config takes programmatic dependent launch: the config asks for it (PDL 1,
    what the tuner measured faster), the GPU is Hopper or later and Triton has grid dependency control."""
    if not cfg.get("PDL") or device.type != "cuda" or gdc_wait is None:
        return False
    return _capable(device.index if device.index is not None else torch.cuda.current_device())


def pdl_launch_args(pdl: bool) -> dict:
    """The launch keyword for a PDL launch (none otherwise: the interpreter takes no launch_pdl)."""
    return {"launch_pdl": True} if pdl else {}
