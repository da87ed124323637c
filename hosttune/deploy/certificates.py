"""The TLS files of a host's nginx front, read on this machine before anything is sent: each certificate file
holds PEM certificates, the key is an unencrypted PEM private key of the chain's first certificate, and that
certificate is valid now. Otherwise nginx -t would fail only once the new release is live, or nginx would
serve a certificate every client refuses."""

from __future__ import annotations

from datetime import datetime, timezone
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


def _check_dates(leaf: x509.Certificate, cert: Path, where: str) -> None:
    """nginx serves an expired certificate without a word; every client would refuse it."""
    now = datetime.now(timezone.utc)
    if leaf.not_valid_after_utc < now:
        raise DeployError(f"{where}: {cert} expired on {leaf.not_valid_after_utc:%Y-%m-%d %H:%M} UTC; renew it")
    if leaf.not_valid_before_utc > now:
        raise DeployError(f"{where}: {cert} is valid only from {leaf.not_valid_before_utc:%Y-%m-%d %H:%M} UTC")


def check_pair(cert: Path, key: Path, where: str) -> None:
    """`where` is the inventory's file:line; the errors name the field and the file."""
    leaf = certificates(cert, f"{where}: deploy.nginx.tls_cert")[0]
    _check_dates(leaf, cert, f"{where}: deploy.nginx.tls_cert")
    if _public(private_key(key, f"{where}: deploy.nginx.tls_key").public_key()) != _public(leaf.public_key()):
        raise DeployError(f"{where}: deploy.nginx.tls_key: {key} is not the private key of {cert}")
