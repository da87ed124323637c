"""ed25519 key pairs for test clients and test sshds, and the files that name them."""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey


@dataclass(frozen=True)
class KeyPair:
    private_path: Path
    public: str  # "ssh-ed25519 AAAA... comment", one line, no newline


def generate_key(private_path: Path, comment: str) -> KeyPair:
    """Write an OpenSSH-format ed25519 private key (mode 0600) and its .pub beside it."""
    key = Ed25519PrivateKey.generate()
    private = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
    )
    public = key.public_key().public_bytes(
        serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
    ).decode() + f" {comment}"
    private_path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(private_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(private)
    Path(f"{private_path}.pub").write_text(public + "\n")
    return KeyPair(private_path, public)


def known_hosts_line(address: str, port: int, host_public: str) -> str:
    """One known_hosts line; OpenSSH and paramiko write non-22 ports as [addr]:port."""
    keytype, blob = host_public.split()[:2]
    target = address if port == 22 else f"[{address}]:{port}"
    return f"{target} {keytype} {blob}"


def ssh_config_block(alias: str, address: str, port: int, user: str, key: Path, known_hosts: Path) -> str:
    return (
        f"Host {alias}\n"
        f"    HostName {address}\n"
        f"    Port {port}\n"
        f"    User {user}\n"
        f"    IdentityFile {key}\n"
        f"    IdentitiesOnly yes\n"
        f"    UserKnownHostsFile {known_hosts}\n"
        f"    StrictHostKeyChecking yes\n"
        f"    BatchMode yes\n"
    )
