"""CUDA architectures: "8.0" as a compute capability, sm_80 in machine code, 80 for CMake.

An arch is written as the compute capability the GPU reports ("8.0", "9.0"), optionally
with the architecture-specific suffix ("9.0a", needed by some Hopper kernels).
"""

from __future__ import annotations

import re
from typing import Iterable

from hosttune.build.errors import BuildError
from hosttune.probes.facts import Facts

_ARCH = re.compile(r"^(\d+)\.(\d)([af]?)$")


def parse_arch(text: str) -> str:
    """Validate one arch ("8.0", "9.0a"); raises BuildError naming the bad value."""
    text = text.strip()
    if not _ARCH.match(text):
        raise BuildError(f"--arch: {text!r} is not a CUDA compute capability such as 8.0 or 9.0")
    return text


def parse_arch_list(text: str) -> tuple[str, ...]:
    """ "8.0,9.0" (or "8.0;9.0", "8.0 9.0") → ("8.0", "9.0"), sorted, without duplicates. An empty entry
    ("8.0,,9.0") is refused rather than dropped: it is most likely an arch left out."""
    if not text.strip():
        raise BuildError("--arch: give 'auto' or a list such as 8.0,9.0")
    parts = re.split(r"\s*[,;]\s*|\s+", text.strip())
    if "" in parts:
        raise BuildError(f"--arch {text!r} has an empty entry; list archs such as 8.0,9.0")
    return sort_archs(parse_arch(p) for p in parts)


def sort_archs(archs: Iterable[str]) -> tuple[str, ...]:
    def key(arch: str) -> tuple[int, int, str]:
        major, minor, suffix = _ARCH.match(arch).groups()
        return int(major), int(minor), suffix

    return tuple(sorted(set(archs), key=key))


def sm_name(arch: str) -> str:
    """ "9.0a" → "sm_90a": the name cuobjdump lists for the machine code of that arch."""
    major, minor, suffix = _ARCH.match(arch).groups()
    return f"sm_{major}{minor}{suffix}"


def compute_name(arch: str) -> str:
    """ "9.0a" → "compute_90a": what `nvcc --list-gpu-arch` prints."""
    return "compute" + sm_name(arch)[2:]


def torch_cuda_arch_list(archs: tuple[str, ...]) -> str:
    """TORCH_CUDA_ARCH_LIST: "8.0;9.0"."""
    return ";".join(archs)


def cmake_cuda_architectures(archs: tuple[str, ...]) -> str:
    """CMAKE_CUDA_ARCHITECTURES: "80;90" (real machine code plus PTX of each)."""
    return ";".join(sm_name(a)[3:] for a in archs)


def archs_of(facts: Iterable[Facts]) -> tuple[str, ...]:
    """Every distinct compute capability of the GPUs on these hosts."""
    found = {g.compute_cap for f in facts for g in f.gpu.gpus if g.compute_cap}
    return sort_archs(parse_arch(a) for a in found)


def covers(built: tuple[str, ...], wanted: str) -> bool:
    """Does machine code built for `built` run on a GPU of compute capability `wanted`?

    Same major and minor: yes ("9.0a" code runs on a 9.0 GPU). Other minors of the same
    major would run too (binary compatibility within a major), but engines tune kernels per
    minor, so hosttune asks for an exact build.
    """
    return any(a.rstrip("af") == wanted.rstrip("af") for a in built)
