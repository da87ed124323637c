"""The CUDA probe's libcuda and NVML calls through ctypes, against a stand-in library built here
(tests/fixtures/cuda-standin): argument passing, the smoke test's check, errors, the load's samples."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from hosttune.probes import host_health

ROOT = Path(__file__).resolve().parents[2]
PROBE = ROOT / "hosttune" / "probes" / "cuda_probe.py"
SOURCE = ROOT / "tests" / "fixtures" / "cuda-standin" / "libcuda_standin.c"


@pytest.fixture(scope="module")
def libdir(tmp_path_factory):
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler to build the libcuda stand-in")
    out = tmp_path_factory.mktemp("cuda-standin")
    subprocess.run([cc, "-shared", "-fPIC", "-O1", "-o", str(out / "libcuda.so.1"), str(SOURCE)], check=True)
    (out / "libnvidia-ml.so.1").symlink_to(out / "libcuda.so.1")
    return out


def probe(libdir, *args, **env):
    full = {**os.environ, "LD_LIBRARY_PATH": str(libdir), **env}
    result = subprocess.run([sys.executable, "-c", PROBE.read_text(), *args], capture_output=True, text=True, env=full, timeout=60)
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_smoke_passes_on_every_gpu(libdir):
    run = host_health.parse_cuda_smoke(probe(libdir, "smoke"), 0)
    assert run.runtime == "libcuda" and run.error is None
    assert [(g.index, g.bdf, g.ok) for g in run.gpus] == [(0, "0000:3b:00.0", True), (1, "0000:3c:00.0", True)]


def test_smoke_catches_a_wrong_kernel_result(libdir):
    run = host_health.parse_cuda_smoke(probe(libdir, "smoke", STANDIN_WRONG="1"), 0)
    assert not any(g.ok for g in run.gpus) and "kernel result wrong" in run.gpus[0].error


def test_cuinit_802_is_named(libdir):
    run = host_health.parse_cuda_smoke(probe(libdir, "smoke", STANDIN_CUINIT_RC="802"), 0)
    assert run.error == "cuInit: CUDA_ERROR_SYSTEM_NOT_READY (802)" and run.gpus == ()


def test_load_samples_every_gpu_for_its_duration(libdir):
    run = host_health.parse_active_load(probe(libdir, "load", "2"), 0)
    assert run.load_error is None and 2.0 <= run.load_s < 3.0
    assert {s.gpu for s in run.samples} == {0, 1} and len(run.samples) >= 4
    s = run.samples[0]
    assert (s.pstate, s.sm_mhz, s.sm_max_mhz, s.util_pct, s.power_w, s.reasons) == ("P0", 1965, 1980, 100, 431.25, ("sw_power_cap",))


def test_without_libcuda_the_probe_says_so(tmp_path):
    out = json.loads(subprocess.run([sys.executable, "-c", PROBE.read_text(), "smoke"], capture_output=True, text=True,
                                    env={**os.environ, "LD_LIBRARY_PATH": str(tmp_path)}).stdout)
    if out["runtime"] is not None:
        pytest.skip("this machine has a real libcuda")
    assert out["error"] == "libcuda.so.1 not found"


def _ptxas():
    return shutil.which("ptxas") or next((p for p in ("/usr/local/cuda/bin/ptxas",) if Path(p).exists()), None)


@pytest.mark.parametrize("arch", ["sm_75", "sm_80", "sm_90"])
def test_probe_kernels_assemble_for_the_gpus_the_driver_jits_them_to(tmp_path, arch):
    ptxas = _ptxas()
    if ptxas is None:
        pytest.skip("no CUDA toolkit (ptxas) on this machine")
    ns: dict = {}
    source = PROBE.read_text()
    exec(source[source.index("PTX = b"):source.index("N = 1 << 20")], ns)  # just the PTX constant
    ptx = tmp_path / "probe.ptx"
    ptx.write_bytes(ns["PTX"].rstrip(b"\x00"))
    result = subprocess.run([ptxas, f"-arch={arch}", str(ptx), "-o", str(tmp_path / "probe.cubin")], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
