"""The whole probe script on this machine with GPU stand-ins on PATH and LD_LIBRARY_PATH: an
nvidia-smi that prints the H200's recorded XML and documented NVLink outputs, a libcuda/NVML
stand-in (the kernel log stays this machine's: tests/live shows a stand-in for it). Shows the health sections reach Facts through the shell."""

import shutil
import subprocess
from pathlib import Path

import pytest

from hosttune.checks import run_checks
from hosttune.checks.findings import Status
from hosttune.probes.gather import parse_probe_output, probe_script
from hosttune.config.profile import load_profile

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures"

NVIDIA_SMI = """#!/bin/sh
case "$*" in
  "-q -x") cat {fx}/h200/nvidia-smi-q.xml ;;
  "nvlink -s") cat {fx}/gpu-health/nvlink-status-8gpu.txt ;;
  "nvlink -e") cat {fx}/gpu-health/nvlink-errors-1.txt ;;
  --query-gpu*) cat {fx}/h200/nvidia-smi-query.csv ;;
  *) exit 1 ;;
esac
"""


@pytest.fixture(scope="module")
def standins(tmp_path_factory):
    cc = shutil.which("cc") or shutil.which("gcc")
    python3 = shutil.which("python3", path="/usr/bin:/bin")
    if cc is None or python3 is None:
        pytest.skip("needs cc and a system python3")
    d = tmp_path_factory.mktemp("standins")
    (d / "bin").mkdir()
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(d / "libcuda.so.1"), str(FIXTURES / "cuda-standin" / "libcuda_standin.c")], check=True)
    (d / "libnvidia-ml.so.1").symlink_to(d / "libcuda.so.1")
    (d / "bin" / "nvidia-smi").write_text(NVIDIA_SMI.format(fx=FIXTURES))
    (d / "bin" / "python3").symlink_to(python3)  # no pynvml: the nvidia-smi path, as on a bare host
    for f in (d / "bin").iterdir():
        f.chmod(0o755)
    return d


def run_probe(d: Path, active_s: int = 0, **env) -> str:
    # The script puts the system directories first, so only names the system lacks come from bin/.
    full = {"PATH": f"{d / 'bin'}:/usr/bin:/bin", "LD_LIBRARY_PATH": str(d), "STANDIN_GPUS": "1", **env}
    result = subprocess.run(["sh", "-s"], input=probe_script(active_s), capture_output=True, env=full, timeout=120)
    assert result.returncode == 0, result.stderr
    return result.stdout.decode()


def test_passive_probe_reads_health_through_the_shell(standins):
    if shutil.which("nvidia-smi", path="/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"):
        pytest.skip("a real nvidia-smi would shadow the stand-in")
    facts = parse_probe_output(run_probe(standins))
    h = facts.health
    assert facts.gpu.source == "nvidia-smi-xml" and len(facts.gpu.gpus) == 1
    assert h.gpus[0].vbios == "96.00.A5.00.1A" and len(h.nvlinks) == 8 and len(h.nvlink_errors) == 2
    assert h.cuda.runtime == "libcuda" and h.cuda.gpus[0].ok and h.active is None
    assert h.uvm_loaded is False and facts.health.shm.size_kib  # this machine's own nvidia-uvm and /dev/shm


def test_active_probe_samples_the_load(standins):
    if shutil.which("nvidia-smi", path="/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"):
        pytest.skip("a real nvidia-smi would shadow the stand-in")
    facts = parse_probe_output(run_probe(standins, active_s=2))
    run = facts.health.active
    assert run is not None and run.load_error is None and 2.0 <= run.load_s < 4.0
    assert run.samples and run.diag is None and run.allreduce is None  # no DCGM, one GPU
    (g,) = facts.gpu.gpus
    assert (g.pstate, g.sm_clock_mhz, g.utilization_pct) == ("P0", 1965, 100)  # as under the load, not idle
    findings = {f.check_id: f for f in run_checks(facts, load_profile("inference-latency"))}
    assert findings["gpu.load"].status is Status.OK, findings["gpu.load"].detail
    assert findings["cuda.smoke"].status is Status.OK
    assert facts.probe_errors == ()
