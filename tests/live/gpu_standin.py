"""Stand-in GPUs for the remediation live tests: a host without a GPU that shows two H200s and their faults.

- `nvidia-smi`: the recorded H200's XML and CSV with two GPUs; `--query-compute-apps` lists nothing;
  `-r -i N` logs the reset in `resets` and clears the GPU (a pending row remap goes), fails as a lost
  GPU does (`reset-fails-N`), or exits 0 while the GPU is gone from NVML afterwards (`reset-loses-N`);
- `dmesg`: the Xid lines a test writes;
- `dcgmi`: logs its arguments in `diags` and passes.
"""
from __future__ import annotations

from pathlib import Path

STANDIN = "/var/lib/standin-gpu"
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
GPU_IDS = ("00000000:3B:00.0", "00000000:86:00.0")
XID_13 = "[ 1822.334410] NVRM: Xid (PCI:0000:3b:00): 13, pid=48211, name=python3, Graphics SM Warp Exception\n"
XID_79 = "[ 9120.553001] NVRM: Xid (PCI:0000:86:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.\n"

NVIDIA_SMI = f"""#!/bin/sh
d={STANDIN}
case "$*" in
  "-q -x") cat $d/smi.xml ;;
  --query-gpu*) cat $d/smi.csv ;;
  --query-compute-apps*) cat $d/apps 2>/dev/null; exit 0 ;;
  "-r -i "*) echo "$3" >> $d/resets
     if [ -e "$d/reset-fails-$3" ]; then echo "Unable to reset GPU $3: the GPU is lost" >&2; exit 1; fi
     if [ -e "$d/reset-loses-$3" ]; then cp $d/one-gpu.xml $d/smi.xml; else cp $d/healthy.xml $d/smi.xml; fi
     echo "GPU $3 was successfully reset." ;;
  *) exit 1 ;;
esac
"""


def two_gpus(remap_pending_on: int | None = None, count: int = 2) -> str:
    """The recorded H200's XML with two GPUs (or only the first), one of them with a row remap pending if asked."""
    text = (FIXTURES / "h200" / "nvidia-smi-q.xml").read_text()
    start, end = text.index("\t<gpu id="), text.index("</gpu>") + len("</gpu>\n")
    gpus = []
    for i, bus in enumerate(GPU_IDS[:count]):
        gpu = text[start:end].replace("00000000:00:06.0", bus).replace("<minor_number>0<", f"<minor_number>{i}<")
        if i == remap_pending_on:
            gpu = gpu.replace("<remapped_row_pending>No<", "<remapped_row_pending>Yes<")
        gpus.append(gpu)
    return text[:start].replace("<attached_gpus>1<", f"<attached_gpus>{count}<") + "".join(gpus) + text[end:]


def two_gpus_csv() -> str:
    header, row = (FIXTURES / "h200" / "nvidia-smi-query.csv").read_text().splitlines()[:2]
    return "\n".join([header] + [row.replace("0, ", f"{i}, ", 1).replace("00000000:00:06.0", b) for i, b in enumerate(GPU_IDS)]) + "\n"


def gpu_files() -> dict[str, tuple[str, int]]:
    """Path → (text, mode) of the stand-in tools and the GPUs' recorded outputs."""
    return {
        "/usr/local/bin/nvidia-smi": (NVIDIA_SMI, 0o755),
        "/usr/local/bin/dmesg": (f"#!/bin/sh\ncat {STANDIN}/dmesg.txt 2>/dev/null\nexit 0\n", 0o755),
        "/usr/local/bin/dcgmi": (f"#!/bin/sh\necho \"$*\" >> {STANDIN}/diags\necho '| Memory | Pass |'\n", 0o755),
        f"{STANDIN}/healthy.xml": (two_gpus(), 0o644),
        f"{STANDIN}/one-gpu.xml": (two_gpus(count=1), 0o644),
        f"{STANDIN}/smi.csv": (two_gpus_csv(), 0o644),
    }


def write_files(host, files: dict[str, tuple[str, int]]) -> None:
    for path, (text, mode) in files.items():
        target = host.path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
        target.chmod(mode)


def set_faults(host, *, smi: str | None = None, dmesg: str = "", reset_fails: bool = False, reset_loses: bool = False) -> None:
    """The GPUs as a test starts them: the XML (healthy unless given), the kernel log, how a reset of GPU 1 goes."""
    host.exec(f"rm -rf {STANDIN}/resets {STANDIN}/diags {STANDIN}/reset-fails-* {STANDIN}/reset-loses-*")
    host.path(f"{STANDIN}/smi.xml").write_text(smi or two_gpus())
    host.path(f"{STANDIN}/dmesg.txt").write_text(dmesg)
    if reset_fails or reset_loses:
        host.path(f"{STANDIN}/reset-{'fails' if reset_fails else 'loses'}-1").write_text("")


def resets(host) -> list[str]:
    """The GPUs the stand-in nvidia-smi was asked to reset, in order."""
    return host.exec(f"cat {STANDIN}/resets 2>/dev/null; true").stdout.split()
