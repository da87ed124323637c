"""Shared data for the deploy tests: recorded host facts, an inventory with deploy: vars, a fake wheelhouse."""

from __future__ import annotations

import json
import textwrap
import time
from dataclasses import replace
from pathlib import Path

from hosttune.build.wheelhouse import Entry, WheelKey, describe_wheels, write_manifest
from hosttune.config.inventory import load_inventory
from hosttune.probes.gather import parse_probe_output
from hosttune.transport.base import CommandResult, Transport

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"

INVENTORY = """\
defaults:
  pins: {python: "3.10"}
groups:
  a100:
    vars:
      gpus: "0-3"
      deploy:
        port: 8100
        lb_port: 8080
        env: {NCCL_DEBUG: WARN}
        vllm: {gpu-memory-utilization: 0.95, enable-prefix-caching: false, max-num-seqs: 128}
        sglang: {mem-fraction-static: 0.85, schedule-policy: fcfs}
    hosts:
      gpu-a:
        address: 10.0.0.11
        deploy:
          vllm: {max-model-len: 32768}
      gpu-b:
        address: 10.0.0.12
  ray:
    vars:
      deploy: {multinode: true}
    hosts:
      node-0: {address: 10.0.1.10}
      node-1: {address: 10.0.1.11}
      node-2: {address: 10.0.1.12}
"""


def a100_facts():
    """4 A100s, GPUs 0-1 on NUMA node 0 and 2-3 on node 1, numactl installed, systemd."""
    return parse_probe_output((FIXTURES / "a100-4gpu-2numa" / "probe-output.txt").read_text())


def h100_facts():
    """8 H100s, GPUs 0-3 on NUMA node 0 and 4-7 on node 1, driver CUDA 13.0, numactl installed, systemd."""
    return parse_probe_output((FIXTURES / "h100-8gpu-2numa" / "probe-output.txt").read_text())


def h200_facts():
    """The lent H200 box: PID 1 is not systemd."""
    return parse_probe_output((FIXTURES / "h200" / "probe-output.txt").read_text())


def inventory(tmp_path: Path):
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / "inventory.yaml"
    path.write_text(INVENTORY)
    return load_inventory(path)


def fleet_of(tmp_path: Path, count: int):
    """An inventory of count single hosts h0, h1, ... (the a100 group's hosts, renamed)."""
    base = [h for h in inventory(tmp_path).hosts if h.group == "a100"]
    return type(inventory(tmp_path))(tuple(replace(base[i % 2], name=f"h{i}") for i in range(count)), "x")


def fake_entry(wheelhouse: Path, engine: str = "vllm", archs=("8.0",), cuda: str | None = "12.4",
               abi: str = "cp310", ref: str = "v0.11.0-0123456789ab", built_at: float | None = None) -> Entry:
    """A complete wheelhouse entry with a (fake) wheel of the engine."""
    key = WheelKey(engine, ref, tuple(archs), cuda, abi)
    path = wheelhouse / key.name
    (path / "wheels").mkdir(parents=True)
    tag = "py3-none-any" if not archs else f"{abi}-{abi}-linux_x86_64"
    (path / "wheels" / f"{engine}-1.0-{tag}.whl").write_bytes(f"wheel of {key.name}".encode())
    entry = Entry(path, key, tuple(describe_wheels(path / "wheels", "engine")), "src", None,
                  built_at or time.time(), 1.0, {})
    write_manifest(entry)
    return entry


HEALTHY = {"cmd": "found:/usr/bin/{v}", "mcmd": "found:/usr/bin/{v}", "venv": "ok:", "dir": "kind:dir",
           "space": "free-kb:100000000 /", "port": "", "pkg": "candidate:1.0"}


def needs_answers(requests, overrides: dict[str, str]) -> str:
    """needs.sh's output for a host that has everything asked about, but for `overrides`."""
    out = []
    for i, request in enumerate(requests):
        kind, _, value = request.partition(":")
        answer = overrides.get(request, HEALTHY[kind].format(v=value))
        out += [f"@@n:{i}", *([answer] if answer else []), f"@@n-end:{i}"]
    return "\n".join(out) + "\n"


class ScriptedTransport(Transport):
    """Answers commands by rules; records every argv (the host's side of the conversation)."""

    def __init__(self, name: str, log: list, gate_ok=True, state="", ray_nodes=0):
        self.host_name, self.log, self.gate_ok, self.state, self.ray_nodes = name, log, gate_ok, state, ray_nodes
        self.files: dict[str, bytes] = {}
        self.unknown_flags: list[str] = []
        self.needs: dict[str, str] = {}  # "kind:value" → the preconditions script's answer (default: all there)
        self.models: dict[str, str] = {}  # model folder → what the model read prints (default: nothing, no folder)
        self.nginx_defaults = ""  # what the read of nginx's default servers prints ("default-server:PORT FILE" lines)

    def _command(self, argv, stdin, timeout):
        argv = tuple(argv)
        self.log.append((self.host_name, argv))
        out = ""
        if argv[:2] == ("sh", "-c") and "# hosttune preconditions" in argv[2]:
            out = needs_answers(argv[6:], self.needs)
        elif argv[:2] == ("sh", "-c") and "default_server" in argv[2]:
            out = self.nginx_defaults
        elif argv[:2] == ("sh", "-c") and "config-begin" in argv[2]:
            out = self.models.get(argv[4], "")  # the model folder's read (hosttune.deploy.model)
        elif argv[:2] == ("sh", "-c") and argv[3:4] == ("hosttune",) and not argv[4].startswith(("write", "link", "remove")):
            out = self.state  # state.sh
        elif argv[:2] == ("python3", "-c") and "UNKNOWN" in argv[2]:
            out = "UNKNOWN " + json.dumps(self.unknown_flags)  # flagcheck: what the engine's --help lacks
        elif argv[:2] == ("python3", "-c"):
            out = json.dumps({"ok": self.gate_ok, "phase": "done" if self.gate_ok else "health", "health_s": 1.0,
                              "warmup": {"requests": 3, "s": 1.0}, "gate_s": 0.1, "error": "" if self.gate_ok else "boom"})
        elif argv[0] == "cat" and argv[-1] not in self.files:
            return CommandResult(argv, 1, "", f"cat: {argv[-1]}: No such file or directory", 0.0)
        elif argv[0] == "cat":
            out = self.files[argv[-1]].decode()
        elif argv[0].endswith("/bin/ray"):
            out = "Active:\n" + "".join(f" 1 node_{i:040x}\n" for i in range(self.ray_nodes)) + "Pending:\n"
        elif argv[0] == "journalctl":
            out = "engine: model not found"
        return CommandResult(argv, 0, out, "", 0.0)


def group_inventory(tmp_path: Path, deploy: str) -> Path:
    """An inventory of group prod (gpu-a at 10.0.0.1, gpu-b at 10.0.0.2) whose deploy: vars are `deploy` (YAML)."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / "inventory.yaml"
    path.write_text(textwrap.dedent("""\
        groups:
          prod:
            vars:
              deploy:
        {deploy}
            hosts:
              gpu-a: {{address: 10.0.0.1}}
              gpu-b: {{address: 10.0.0.2}}
        """).format(deploy=textwrap.indent(textwrap.dedent(deploy), " " * 8)))
    return path


def tls_pair(folder: Path, name: str = "serve.test", days: float = 1) -> tuple[Path, Path]:
    """A self-signed certificate for `name` and its EC private key, as PEM files in `folder` (cert.pem, key.pem)."""
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=days))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(name)]), critical=False)
            .sign(key, hashes.SHA256()))
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "cert.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (folder / "key.pem").write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                       serialization.NoEncryption()))
    return folder / "cert.pem", folder / "key.pem"
