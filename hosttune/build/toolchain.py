"""What the build machine offers: the Python that builds, nvcc and its CUDA version, cuobjdump, memory.

Read once per build, before anything is planned; a missing tool is a clear error here
rather than a compiler failure ten minutes in.
"""

from __future__ import annotations

import glob
import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from hosttune.build.errors import BuildError

# nvcc compiling vLLM's or SGLang's template-heavy kernels peaks at several GiB per job;
# more parallel jobs than memory allows ends in the OOM killer, not in a faster build.
GIB_PER_JOB = 6
_PY_INFO = ("import importlib.util, json, sys, sysconfig; print(json.dumps([sys.version_info[0], sys.version_info[1], "
            "sys.implementation.name, sysconfig.get_paths()['purelib'], sysconfig.get_paths()['platlib'], "
            "importlib.util.find_spec('pip') is not None, importlib.util.find_spec('torch') is not None]))")


@dataclass(frozen=True)
class Toolchain:
    python: str  # the interpreter that runs pip wheel
    python_abi: str  # "cp311": the CPython ABI the wheels are built for
    site_dirs: tuple[str, ...]
    cpu_count: int
    mem_total_bytes: int
    nvcc: str | None = None
    cuda_version: str | None = None  # "13.0", from nvcc --version
    cuda_home: str | None = None
    nvcc_archs: tuple[str, ...] = ()  # compute capabilities this nvcc can compile for
    has_torch: bool = False  # the interpreter imports torch (what --no-build-isolation builds against)

    @property
    def max_jobs(self) -> int:
        """Parallel compile jobs: one per GIB_PER_JOB of memory, at most one per CPU."""
        return max(1, min(self.cpu_count, self.mem_total_bytes // (GIB_PER_JOB * 2**30)))


def _memory_bytes() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def python_info(python: str) -> tuple[str, tuple[str, ...], bool]:
    """(ABI tag, site-packages dirs, whether it has torch) of an interpreter."""
    try:
        out = subprocess.run([python, "-c", _PY_INFO], capture_output=True, text=True, check=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        raise BuildError(f"--python {python}: cannot run it ({exc})") from None
    try:
        major, minor, impl, purelib, platlib, has_pip, has_torch = json.loads(out)
    except (ValueError, TypeError):  # not JSON, or not the seven values _PY_INFO prints
        raise BuildError(f"--python {python}: not a Python interpreter (it answered {out.strip()[:80]!r} "
                         f"to a Python one-liner)") from None
    if impl != "cpython":
        raise BuildError(f"--python {python}: {impl} is not CPython; engine wheels are built for CPython")
    if not has_pip:  # every step that makes a wheel is its `pip wheel`
        raise BuildError(f"--python {python}: has no pip, which builds the wheels; install it ({python} -m ensurepip, "
                         "or the distribution's python3-pip), or give a Python that has it")
    return f"cp{major}{minor}", tuple(dict.fromkeys((purelib, platlib))), bool(has_torch)


def find_nvcc() -> str | None:
    for candidate in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if candidate and os.access(os.path.join(candidate, "bin", "nvcc"), os.X_OK):
            return os.path.join(candidate, "bin", "nvcc")
    return shutil.which("nvcc")


def parse_nvcc_version(text: str) -> str | None:
    """ "Cuda compilation tools, release 13.0, V13.0.88" → "13.0"."""
    match = re.search(r"release (\d+\.\d+)", text)
    return match.group(1) if match else None


def parse_gpu_archs(text: str) -> tuple[str, ...]:
    """`nvcc --list-gpu-arch` ("compute_75 compute_80 ...") → ("7.5", "8.0", ...)."""
    found = []
    for name in re.findall(r"compute_(\d+)([af]?)", text):
        digits, suffix = name
        found.append(f"{digits[:-1]}.{digits[-1]}{suffix}")
    return tuple(found)


def cuda_home_of(nvcc: str) -> str:
    """/usr/local/cuda-13.0/bin/nvcc → /usr/local/cuda-13.0 (a wrapper script on PATH: its CUDA_HOME)."""
    real = Path(nvcc).resolve()
    if real.parent.name == "bin" and (real.parent / "ptxas").exists():
        return str(real.parent.parent)
    for home in ("/usr/local/cuda", *sorted(glob.glob("/usr/local/cuda-*"), reverse=True)):
        if os.access(os.path.join(home, "bin", "nvcc"), os.X_OK):
            return home
    return str(real.parent.parent)


def _run(argv: list[str]) -> str:
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return ""
    return proc.stdout + proc.stderr


def read_toolchain(python: str | None = None, *, need_cuda: bool) -> Toolchain:
    python = python or sys.executable
    abi, site_dirs, has_torch = python_info(python)
    base = dict(python=python, python_abi=abi, site_dirs=site_dirs, has_torch=has_torch,
                cpu_count=os.cpu_count() or 1, mem_total_bytes=_memory_bytes())
    nvcc = find_nvcc()
    if nvcc is None:
        if need_cuda:
            raise BuildError("nvcc not found (looked in $CUDA_HOME, /usr/local/cuda and PATH); "
                             "install the CUDA toolkit the fleet is pinned to, or set CUDA_HOME")
        return Toolchain(**base)
    version = parse_nvcc_version(_run([nvcc, "--version"]))
    archs = parse_gpu_archs(_run([nvcc, "--list-gpu-arch"]))
    return Toolchain(**base, nvcc=nvcc, cuda_version=version, cuda_home=cuda_home_of(nvcc), nvcc_archs=archs)


def find_cuobjdump(toolchain: Toolchain, explicit: str | None = None) -> str:
    """cuobjdump: --cuobjdump, then PATH and the CUDA toolkit, then the copy Triton's wheel ships."""
    if explicit:
        if not os.access(explicit, os.X_OK):
            raise BuildError(f"--cuobjdump {explicit}: not an executable file")
        return explicit
    candidates = [os.environ.get("HOSTTUNE_CUOBJDUMP"), shutil.which("cuobjdump")]
    if toolchain.cuda_home:
        candidates.append(os.path.join(toolchain.cuda_home, "bin", "cuobjdump"))
    candidates += [os.path.join(d, "triton", "backends", "nvidia", "bin", "cuobjdump") for d in toolchain.site_dirs]
    for path in candidates:
        if path and os.access(path, os.X_OK):
            return path
    raise BuildError("cuobjdump not found (needed to check the wheels' machine code): install the CUDA "
                     "toolkit's cuobjdump, or `pip install triton` into the build Python (its wheel ships "
                     "one under triton/backends/nvidia/bin/), or pass --cuobjdump PATH")
