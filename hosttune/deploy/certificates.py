"""The TLS files of a host's nginx front, read on this machine before anything is sent: nginx must be able to
load each certificate file and the private key, and the key must be the one of the chain's first certificate,
or nginx -t would fail only after the release went live."""

from __future__ import annotations

from pathlib import Path

from cryptography import x509
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization

from hosttune.deploy.errors import DeployError


def _read(path: Path, where: str) -> bytes:
    if not path.exists():
        raise DeployError(f"{where}: {path} does not exist")
    if not path.is_file():
        raise DeployError(f"{where}: {path} is not a file")
    try:
        return path.read_bytes()
    except OSError as exc:
        raise DeployError(f"{where}: cannot read {path}: {exc.strerror}") from None


def certificates(path: Path, where: str) -> list[x509.Certificate]:
    """The PEM certificates in `path` (a chain: the server's first)."""
    try:
        found = x509.load_pem_x509_certificates(_read(path, where))
    except ValueError:
        found = []
    if not found:
        raise DeployError(f"{where}: {path} holds no PEM certificate")
    return found


def _public(key) -> bytes:
    return key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)


def private_key(path: Path, where: str):
    """The unencrypted PEM private key in `path` (nginx has no passphrase to open it with)."""
    data = _read(path, where)
    try:
        return serialization.load_pem_private_key(data, password=None)
    except TypeError:
        raise DeployError(f"{where}: {path} is encrypted; nginx reads an unencrypted key") from None
    except (ValueError, UnsupportedAlgorithm):
        raise DeployError(f"{where}: {path} is not a PEM private key") from None


def check_pair(cert: Path, key: Path, where: str) -> None:
    """`where` is the inventory's file:line; the errors name the field and the file."""
    leaf = certificates(cert, f"{where}: deploy.nginx.tls_cert")[0]
    if _public(private_key(key, f"{where}: deploy.nginx.tls_key").public_key()) != _public(leaf.public_key()):
        raise DeployError(f"{where}: deploy.nginx.tls_key: {key} is not the private key of {cert}")
