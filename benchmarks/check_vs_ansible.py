"""Wall time of `hosttune check` against N hosts, next to Ansible's fact gathering.

Every host is an sshd on a loopback port of this machine (benchmarks/fleet.py). For
N = 1, 10, 50 it times, in one run on the same hosts:
  - `hosttune check --format json` (default forks; the JSON gives per-host connect/probe/parse),
  - `ansible all -m setup` with Ansible's default forks (5) and with N forks,
  - a plain sequential `ssh HOST true` loop, as the floor of doing it one by one.
Each measurement is the median of --repeat runs. Needs root (it starts sshds).

    python benchmarks/check_vs_ansible.py [--sizes 1,10,50] [--repeat 3] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fleet import DEFAULT_DIR, SshdFleet  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
HOSTTUNE = ROOT / ".venv" / "bin" / "hosttune"
ANSIBLE_VENV = Path("/tmp/hosttune-bench-ansible")


def ensure_ansible() -> Path:
    ansible = ANSIBLE_VENV / "bin" / "ansible"
    if not ansible.exists():
        subprocess.run([sys.executable, "-m", "venv", str(ANSIBLE_VENV)], check=True)
        subprocess.run([str(ANSIBLE_VENV / "bin" / "pip"), "install", "-q", "ansible-core"], check=True)
    return ansible


def timed(argv: list[str], env: dict | None = None) -> tuple[float, subprocess.CompletedProcess]:
    start = time.monotonic()
    proc = subprocess.run(argv, capture_output=True, text=True, env=env)
    return time.monotonic() - start, proc


def run_hosttune(inventory: Path) -> tuple[float, dict]:
    wall, proc = timed([str(HOSTTUNE), "check", "-i", str(inventory), "--format", "json"])
    doc = json.loads(proc.stdout)
    unreachable = [h["host"] for h in doc["hosts"] if not h["reachable"]]
    if unreachable:
        raise SystemExit(f"hosttune could not reach {unreachable}: {doc['hosts'][0]['error']}")
    return wall, doc


def run_ansible(ansible: Path, forks: int) -> float:
    env = dict(os.environ, ANSIBLE_CONFIG=str(DEFAULT_DIR / "ansible.cfg"), ANSIBLE_STDOUT_CALLBACK="json")
    wall, proc = timed([str(ansible), "all", "-m", "setup", "-f", str(forks)], env)
    if proc.returncode != 0:
        raise SystemExit(f"ansible failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return wall


def run_ssh_loop(hosts) -> float:
    config = DEFAULT_DIR / "ssh_config"
    start = time.monotonic()
    for h in hosts:
        subprocess.run(["ssh", "-F", str(config), h.name, "true"], check=True, capture_output=True)
    return time.monotonic() - start


def breakdown(doc: dict) -> dict:
    t = [h["timings"] for h in doc["hosts"]]
    return {k: statistics.mean(x[k] for x in t) for k in ("connect_s", "probe_s", "parse_s", "total_s")}


def measure(n: int, repeat: int, ansible: Path) -> dict:
    with SshdFleet() as fleet:
        hosts = fleet.up(n)
        inv = DEFAULT_DIR / "inventory.yaml"
        run_hosttune(inv)  # warm the page cache and sshd's first-connection work once
        ht = [run_hosttune(inv) for _ in range(repeat)]
        row = {
            "n": n,
            "hosttune_s": statistics.median(w for w, _ in ht),
            "per_host": breakdown(ht[-1][1]),
            "ansible_default_forks_s": statistics.median(run_ansible(ansible, 5) for _ in range(repeat)),
            "ansible_n_forks_s": statistics.median(run_ansible(ansible, n) for _ in range(repeat)),
            "ssh_loop_s": statistics.median(run_ssh_loop(hosts) for _ in range(repeat)),
        }
    row["speedup_vs_ansible_n_forks"] = row["ansible_n_forks_s"] / row["hosttune_s"]
    row["speedup_vs_ansible_default"] = row["ansible_default_forks_s"] / row["hosttune_s"]
    return row


def startup_s() -> float:
    """Interpreter start plus importing the CLI: paid once per invocation."""
    return statistics.median(timed([str(HOSTTUNE), "--help"])[0] for _ in range(5))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1,10,50")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    ansible = ensure_ansible()
    version = subprocess.run([str(ansible), "--version"], capture_output=True, text=True).stdout.splitlines()[0]
    rows = [measure(int(n), args.repeat, ansible) for n in args.sizes.split(",")]
    result = {"ansible": version, "cpus": os.cpu_count(), "cli_startup_s": startup_s(), "rows": rows}
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    print(f"{version}; {os.cpu_count()} CPUs; hosttune CLI start-up {result['cli_startup_s']:.2f}s")
    print("per host (mean): connect = SSH handshake+auth, probe = script round trip, parse = parsers+checks")
    print(f"{'N':>3} {'hosttune':>9} {'ansible -f5':>12} {'ansible -fN':>12} {'ssh loop':>9} {'x vs -fN':>9} "
          f"{'connect':>8} {'probe':>7} {'parse':>7}")
    for r in rows:
        p = r["per_host"]
        print(f"{r['n']:>3} {r['hosttune_s']:>8.2f}s {r['ansible_default_forks_s']:>11.2f}s {r['ansible_n_forks_s']:>11.2f}s "
              f"{r['ssh_loop_s']:>8.2f}s {r['speedup_vs_ansible_n_forks']:>8.1f}x {p['connect_s']:>7.3f}s {p['probe_s']:>6.3f}s {p['parse_s']:>6.3f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
