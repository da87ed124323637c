"""A container's writable root: an overlay over the cached image, made into one host."""
from __future__ import annotations

import os
import subprocess
import uuid
from pathlib import Path

from .sshkeys import KeyPair

ADDRESS = "127.0.0.1"


def make_root(image_root: Path, hostdir: Path) -> tuple[Path, str]:
    """An overlay (image below, per-host upper on disk); a full copy if overlayfs is refused."""
    root, upper, work = hostdir / "root", hostdir / "upper", hostdir / "work"
    for d in (root, upper, work):
        d.mkdir()
    options = f"lowerdir={image_root},upperdir={upper},workdir={work}"
    if subprocess.run(["mount", "-t", "overlay", "overlay", "-o", options, str(root)],
                      capture_output=True).returncode == 0:
        return root, "overlay"
    root.rmdir()
    subprocess.run(["cp", "-a", "--reflink=auto", str(image_root), str(root)], check=True)
    return root, "copy"


def personalize(root: Path, name: str, port: int, host_key: KeyPair, client_public: str) -> None:
    """What makes a container this host: name, machine id, host key, port, authorized key."""
    (root / "etc/hostname").write_text(f"{name}\n")
    (root / "etc/hosts").write_text(f"127.0.0.1\tlocalhost\n127.0.1.1\t{name}\n::1\tlocalhost\n")
    (root / "etc/machine-id").write_text(uuid.uuid4().hex + "\n")
    ssh = root / "etc/ssh"
    for suffix in ("", ".pub"):
        src = Path(f"{host_key.private_path}{suffix}")
        dest = ssh / src.name
        dest.write_bytes(src.read_bytes())
        dest.chmod(0o600 if suffix == "" else 0o644)
    (ssh / "sshd_config.d/60-hosttune-listen.conf").write_text(f"ListenAddress {ADDRESS}\nPort {port}\n")
    uid, gid, home = _passwd_entry(root, "deploy")
    _authorize(root / "root/.ssh", client_public, 0, 0)
    _authorize(root / home.lstrip("/") / ".ssh", client_public, uid, gid)


def _authorize(ssh_dir: Path, public: str, uid: int, gid: int) -> None:
    ssh_dir.mkdir(mode=0o700, exist_ok=True)
    keys = ssh_dir / "authorized_keys"
    keys.write_text(public + "\n")
    keys.chmod(0o600)
    for p in (ssh_dir, keys):
        os.chown(p, uid, gid)


def _passwd_entry(root: Path, user: str) -> tuple[int, int, str]:
    for line in (root / "etc/passwd").read_text().splitlines():
        fields = line.split(":")
        if fields[0] == user:
            return int(fields[2]), int(fields[3]), fields[5]
    raise RuntimeError(f"user {user} missing from the image at {root}")
