"""The controller's cost at fleet size: `hosttune status` and `hosttune check` over N inventory hosts, each a
distinct loopback address (127.10.x.y) served by real sshd processes on this machine.

Every "host" is this machine: sixteen addresses per sshd (OpenSSH listens on at most 16), one client key, a
known_hosts line per address. `status` reads the status files a real monitor pass left in
/var/lib/hosttune/monitor (the benchmark runs one first, and removes what it made); `check` runs the whole
probe script on every "host". Wall time, the controller's CPU (user + system) and its peak RSS come from
wait4 on the hosttune process alone; the sshd side runs on the same cores, so wall time includes it.

    python benchmarks/status_scale.py --hosts 250 1000 --out results.json     # needs root (sshd)

Not part of CI: it takes minutes at 1,000 hosts on a 2-core machine.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.fleet import SSHD, SSHD_CONFIG, ensure_sshd  # noqa: E402

WORKDIR = Path("/tmp/hosttune-status-scale")
PORT = 2299
# The "hosts" log in as a plain user whose shell is /bin/sh: this machine's root runs `pyenv init` from its
# .bashrc on every SSH login (bash sources it under sshd), ~150 ms of CPU a host's login would not cost.
USER = "htbench"
PER_SSHD = 16  # OpenSSH's limit on ListenAddress sockets
STATUS_DIR = Path("/var/lib/hosttune/monitor")


def address(index: int) -> str:
    return f"127.10.{index // 250}.{index % 250 + 1}"


def keygen(path: Path) -> str:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)
    return " ".join(Path(f"{path}.pub").read_text().split()[:2])


def start_sshds(count: int) -> list[str]:
    """ceil(count / 16) sshds; returns the known_hosts lines of every address."""
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
    lines = []
    for first in range(0, count, PER_SSHD):
        d = WORKDIR / f"sshd{first // PER_SSHD:03d}"
        d.mkdir()
        key = keygen(d / "ssh_host_ed25519_key")
        addresses = [address(i) for i in range(first, min(first + PER_SSHD, count))]
        config = SSHD_CONFIG.format(port=PORT, dir=d, authorized_keys=WORKDIR / "authorized_keys")  # benchmarks/fleet.py's
        listen = "\n".join(f"ListenAddress {a}" for a in addresses)
        (d / "sshd_config").write_text(config.replace("ListenAddress 127.0.0.1", listen, 1))
        subprocess.run([SSHD, "-f", str(d / "sshd_config"), "-E", str(d / "sshd.log")], check=True)
        lines += [f"[{a}]:{PORT} {key}\n" for a in addresses]
    return lines


def write_inventory(count: int) -> Path:
    path = WORKDIR / f"inventory-{count}.yaml"
    lines = ["defaults:", "  ssh:", f"    user: {USER}", f"    key: {WORKDIR / 'client'}",
             f"    known_hosts: {WORKDIR / 'known_hosts'}", f"    port: {PORT}", "hosts:"]
    lines += [f"  h{i:04d}:\n    address: {address(i)}" for i in range(count)]
    path.write_text("\n".join(lines) + "\n")
    return path


def measure(argv: list[str]) -> dict:
    """Wall time, CPU and peak RSS of one hosttune process (wait4: its own rusage, not the sshds')."""
    start = time.monotonic()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    out = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.monotonic() - start
    return {"argv": argv[1:4], "wall_s": round(wall, 2), "cpu_s": round(usage.ru_utime + usage.ru_stime, 2),
            "peak_rss_mib": round(usage.ru_maxrss / 1024, 1), "exit": os.waitstatus_to_exitcode(status),
            "output_bytes": len(out), "output": out}


def summary(kind: str, result: dict) -> dict:
    doc = json.loads(result.pop("output"))
    if kind == "status":
        states, errors = [h["state"] for h in doc], [h["error"] for h in doc if h["error"]]
    else:
        states = ["unreachable" if not h["reachable"] else "error" if h["error"] else "probed" for h in doc["hosts"]]
        errors = [h["error"] for h in doc["hosts"] if h["error"]]
    return {**result, "hosts": len(states), "states": {s: states.count(s) for s in sorted(set(states))},
            "first_errors": sorted(set(errors))[:3]}


def stop_sshds() -> None:
    for pidfile in WORKDIR.glob("sshd*/sshd.pid"):
        try:
            os.kill(int(pidfile.read_text().split()[0]), signal.SIGTERM)  # sshd's own pid from its pidfile
        except (OSError, ValueError):
            pass


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--hosts", type=int, nargs="+", default=[250, 1000])
    parser.add_argument("--forks", type=int, default=50)
    parser.add_argument("--skip-check", action="store_true", help="measure status only")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    ensure_sshd()
    made_user = subprocess.run(["useradd", "--no-create-home", "--shell", "/bin/sh", "--password", "*", USER], capture_output=True).returncode == 0
    hosttune = [sys.executable, "-m", "hosttune"]
    made = [d for d in (STATUS_DIR.parent, STATUS_DIR) if not d.exists()]  # removed again at the end
    shutil.rmtree(WORKDIR, ignore_errors=True)
    WORKDIR.mkdir(parents=True)
    keygen(WORKDIR / "client")
    (WORKDIR / "authorized_keys").write_text((WORKDIR / "client.pub").read_text())
    results = {"loadavg_before": os.getloadavg(), "cpus": os.cpu_count(), "runs": []}
    try:
        subprocess.run([*hosttune, "monitor", "--profile", str(REPO / "playbooks/inference-latency-monitored.yaml"),
                        "--textfile-dir", str(WORKDIR / "textfile")], capture_output=True)
        (WORKDIR / "known_hosts").write_text("".join(start_sshds(max(args.hosts))))
        time.sleep(1)
        for count in args.hosts:
            inventory = str(write_inventory(count))
            for kind in ("status", "check")[: 1 if args.skip_check else 2]:
                run = measure([*hosttune, kind, "-i", inventory, "--format", "json", "--forks", str(args.forks)])
                row = {"kind": kind, "inventory_hosts": count, "loadavg": os.getloadavg(), **summary(kind, run)}
                print(json.dumps(row), flush=True)
                results["runs"].append(row)
    finally:
        stop_sshds()
        if made_user:
            subprocess.run(["userdel", USER], capture_output=True)
        if made:
            shutil.rmtree(made[0], ignore_errors=True)
    if args.out:
        args.out.write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
