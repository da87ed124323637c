"""A fleet of N plain sshd processes on loopback, for benchmarking fact gathering.

Every "host" is this machine, reached through its own sshd on 127.0.0.1:<port> with its
own host key and config; logins are key-only, as root, with one generated client key.
What a client needs is written beside them: known_hosts, ssh_config, a hosttune inventory
and an Ansible inventory (with ansible.cfg).

    python benchmarks/fleet.py up 50            # prints the directory; sshds keep running
    hosttune check --inventory /tmp/hosttune-fleet/inventory.yaml
    ANSIBLE_CONFIG=/tmp/hosttune-fleet/ansible.cfg ansible all -m setup
    python benchmarks/fleet.py down

Needs root. Installs openssh-server if sshd is missing (without starting the system sshd).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

SSHD = "/usr/sbin/sshd"
DEFAULT_DIR = Path("/tmp/hosttune-fleet")
DEFAULT_BASE_PORT = 22200
MAX_HOSTS = 200

SSHD_CONFIG = """\
ListenAddress 127.0.0.1
Port {port}
HostKey {dir}/ssh_host_ed25519_key
PidFile {dir}/sshd.pid
AuthorizedKeysFile {authorized_keys}
StrictModes no
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin prohibit-password
UsePAM no
UseDNS no
PrintMotd no
PrintLastLog no
MaxStartups 100:30:200
Subsystem sftp internal-sftp
LogLevel ERROR
"""


@dataclass(frozen=True)
class SshdHost:
    name: str
    address: str
    port: int
    host_key: str  # "ssh-ed25519 AAAA..."
    config: str    # path of this sshd's config
    pidfile: str


class SshdFleet:
    """The sshds under one directory; up() starts them, down() kills them and their sessions."""

    def __init__(self, workdir: Path = DEFAULT_DIR):
        self.workdir = workdir
        self.client_key = workdir / "client_ed25519"

    def __enter__(self) -> "SshdFleet":
        return self

    def __exit__(self, *exc) -> None:
        self.down()

    def up(self, count: int, base_port: int = DEFAULT_BASE_PORT) -> list[SshdHost]:
        if not 1 <= count <= MAX_HOSTS:
            raise ValueError(f"count must be 1..{MAX_HOSTS}")
        ensure_sshd()
        self.down()
        self.workdir.mkdir(parents=True)
        _keygen(self.client_key, "hosttune-bench-client")
        authorized = self.workdir / "authorized_keys"
        authorized.write_text(Path(f"{self.client_key}.pub").read_text())
        authorized.chmod(0o600)
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege separation dir
        hosts = [self._start(i, port) for i, port in enumerate(_free_ports(base_port, count), 1)]
        _wait_for_banners([h.port for h in hosts], deadline=time.monotonic() + 30)
        self._write_client_files(hosts)
        return hosts

    def _start(self, index: int, port: int) -> SshdHost:
        name = f"h{index:02d}"
        hostdir = self.workdir / "hosts" / name
        hostdir.mkdir(parents=True)
        host_key = _keygen(hostdir / "ssh_host_ed25519_key", name)
        config = hostdir / "sshd_config"
        config.write_text(SSHD_CONFIG.format(port=port, dir=hostdir,
                                             authorized_keys=self.workdir / "authorized_keys"))
        # sshd daemonizes and writes its pidfile; its log goes to the file given by -E.
        subprocess.run([SSHD, "-f", str(config), "-E", str(hostdir / "sshd.log")], check=True)
        return SshdHost(name, "127.0.0.1", port, host_key, str(config), str(hostdir / "sshd.pid"))

    def hosts(self) -> list[SshdHost]:
        path = self.workdir / "fleet.json"
        if not path.exists():
            return []
        return [SshdHost(**h) for h in json.loads(path.read_text())["hosts"]]

    def down(self) -> None:
        """Kill every sshd of this fleet and every session they spawned; remove the directory."""
        masters = [_read_pid(Path(h.pidfile)) for h in self.hosts()]
        masters += [_read_pid(p) for p in self.workdir.glob("hosts/*/sshd.pid")]
        pids = {p for p in masters if p and _is_sshd(p)}
        doomed = pids | _descendants(pids)
        for pid in doomed:
            _signal(pid, signal.SIGKILL)
        _wait_gone(doomed, deadline=time.monotonic() + 10)
        if self.workdir.exists():
            shutil.rmtree(self.workdir)

    def _write_client_files(self, hosts: list[SshdHost]) -> None:
        d, key = self.workdir, self.client_key
        known_hosts = d / "known_hosts"
        known_hosts.write_text("".join(f"[{h.address}]:{h.port} {h.host_key}\n" for h in hosts))
        (d / "ssh_config").write_text("".join(
            f"Host {h.name}\n    HostName {h.address}\n    Port {h.port}\n    User root\n"
            f"    IdentityFile {key}\n    IdentitiesOnly yes\n    UserKnownHostsFile {known_hosts}\n"
            f"    StrictHostKeyChecking yes\n    BatchMode yes\n\n" for h in hosts))
        (d / "inventory.yaml").write_text(_hosttune_inventory(hosts, key, known_hosts))
        (d / "ansible_inventory.ini").write_text(_ansible_inventory(hosts, key, known_hosts))
        (d / "ansible.cfg").write_text(
            f"[defaults]\ninventory = {d / 'ansible_inventory.ini'}\nhost_key_checking = True\n"
            "interpreter_python = /usr/bin/python3\n")
        (d / "fleet.json").write_text(json.dumps({"hosts": [asdict(h) for h in hosts]}, indent=1))


def _hosttune_inventory(hosts: list[SshdHost], key: Path, known_hosts: Path) -> str:
    lines = [
        "# Generated by benchmarks/fleet.py: sshds on loopback, all of them this machine.",
        "defaults:",
        "  ssh:",
        "    user: root",
        f"    key: {key}",
        f"    known_hosts: {known_hosts}",
        "hosts:",
    ]
    for h in hosts:
        lines += [f"  {h.name}:", f"    address: {h.address}", "    ssh:", f"      port: {h.port}"]
    return "\n".join(lines) + "\n"


def _ansible_inventory(hosts: list[SshdHost], key: Path, known_hosts: Path) -> str:
    lines = ["[fleet]"]
    lines += [f"{h.name} ansible_host={h.address} ansible_port={h.port}" for h in hosts]
    lines += [
        "", "[fleet:vars]", "ansible_user=root", f"ansible_ssh_private_key_file={key}",
        f"ansible_ssh_common_args=-o UserKnownHostsFile={known_hosts} -o StrictHostKeyChecking=yes"
        " -o IdentitiesOnly=yes",
    ]
    return "\n".join(lines) + "\n"


def ensure_sshd() -> None:
    """Install openssh-server if sshd is missing, without letting it start the system sshd."""
    if Path(SSHD).exists():
        return
    if os.geteuid() != 0:
        raise SystemExit("sshd is missing and installing it needs root")
    policy = Path("/usr/sbin/policy-rc.d")
    had_policy = policy.exists()
    if not had_policy:
        policy.write_text("#!/bin/sh\nexit 101\n")  # "action forbidden": no service starts
        policy.chmod(0o755)
    try:
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        subprocess.run(["apt-get", "update", "-qq"], check=True, env=env)
        subprocess.run(["apt-get", "install", "-y", "-qq", "--no-install-recommends", "openssh-server"],
                       check=True, env=env)
    finally:
        if not had_policy:
            policy.unlink()


def _keygen(path: Path, comment: str) -> str:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
                   check=True)
    return " ".join(Path(f"{path}.pub").read_text().split()[:2])


def _free_ports(base: int, count: int) -> list[int]:
    ports, port = [], base
    while len(ports) < count:
        if port > base + 10 * MAX_HOSTS:
            raise RuntimeError(f"not enough free ports above {base}")
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
                ports.append(port)
            except OSError:
                pass
        port += 1
    return ports


def _wait_for_banners(ports: list[int], deadline: float) -> None:
    pending = set(ports)
    while pending and time.monotonic() < deadline:
        pending = {p for p in pending if not _banner(p)}
        if pending:
            time.sleep(0.05)
    if pending:
        raise RuntimeError(f"sshd did not answer on ports {sorted(pending)}")


def _banner(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as sock:
            sock.settimeout(2)
            return sock.recv(64).startswith(b"SSH-")
    except OSError:
        return False


def _read_pid(path: Path) -> int | None:
    try:
        return int(path.read_text().split()[0])
    except (FileNotFoundError, ValueError, IndexError):
        return None


def _is_sshd(pid: int) -> bool:
    try:
        return os.readlink(f"/proc/{pid}/exe") == SSHD
    except OSError:
        return False


def _descendants(roots: set[int]) -> set[int]:
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = set(), list(roots)
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _wait_gone(pids: set[int], deadline: float) -> None:
    while any(Path(f"/proc/{p}").exists() for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dir", type=Path, default=DEFAULT_DIR, help=f"fleet directory ({DEFAULT_DIR})")
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="start N sshds and write the client files")
    up.add_argument("count", type=int)
    up.add_argument("--base-port", type=int, default=DEFAULT_BASE_PORT)
    sub.add_parser("down", help="kill the fleet's sshds and remove its directory")
    sub.add_parser("status", help="list the fleet's hosts and whether they answer")
    args = parser.parse_args(argv)
    fleet = SshdFleet(args.dir)
    if args.command == "up":
        started = time.monotonic()
        hosts = fleet.up(args.count, args.base_port)
        print(f"{len(hosts)} sshds up in {time.monotonic() - started:.2f}s; files in {args.dir}")
    elif args.command == "down":
        fleet.down()
    else:
        for h in fleet.hosts():
            print(f"{h.name} {h.address}:{h.port} {'up' if _banner(h.port) else 'DOWN'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
