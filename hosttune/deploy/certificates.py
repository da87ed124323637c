"""The TLS files of a host's nginx front, read on this machine before anything is sent: each certificate file
holds PEM certificates, the key is an unencrypted PEM private key of the chain's first certificate, and that
certificate is valid now. Otherwise nginx -t would fail only once the new release is live, or nginx would
serve a certificate every client refuses."""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.x509.oid import NameOID

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


REFUSED = "so the group balancer would refuse every host"


def check_trust(cert: Path, ca: Path, name: str | None, where: str) -> None:
    """The group balancer (proxy_ssl_verify) and the canary bench verify each host's certificate against tls_ca,
    for tls_name: a chain tls_ca did not sign, or a name the certificate does not carry, would leave every host
    out once they serve."""
    chain = certificates(cert, f"{where}: deploy.nginx.tls_cert")
    anchors = certificates(ca, f"{where}: deploy.nginx.tls_ca")
    if not _chains_to(chain, anchors):
        raise DeployError(f"{where}: deploy.nginx.tls_ca: {ca} did not sign {cert} (nor a certificate of its chain), "
                          f"{REFUSED} (and the canary bench every canary)")
    names = _names(chain[0])
    if name is not None and not any(_matches(name, n) for n in names):
        raise DeployError(f"{where}: deploy.nginx.tls_name: {cert} is not for {name!r} (it names "
                          f"{', '.join(names) or 'nothing'}), {REFUSED}")


def _issued(child: x509.Certificate, parent: x509.Certificate) -> bool:
    try:
        child.verify_directly_issued_by(parent)
    except (ValueError, TypeError, InvalidSignature, UnsupportedAlgorithm):
        return False
    return True


def _chains_to(chain: list[x509.Certificate], anchors: list[x509.Certificate]) -> bool:
    """The leaf is an anchor, or an anchor signed it or a certificate of the chain that leads to one."""
    trusted = {a.fingerprint(hashes.SHA256()) for a in anchors}
    current, rest = chain[0], list(chain[1:])
    while True:
        if current.fingerprint(hashes.SHA256()) in trusted or any(_issued(current, a) for a in anchors):
            return True
        parent = next((c for c in rest if _issued(current, c)), None)
        if parent is None:
            return False
        rest.remove(parent)
        current = parent


def _names(leaf: x509.Certificate) -> list[str]:
    """The DNS names and addresses the certificate is for; its common name only when it lists no DNS name."""
    try:
        alt = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        dns, addresses = alt.get_values_for_type(x509.DNSName), [str(a) for a in alt.get_values_for_type(x509.IPAddress)]
    except x509.ExtensionNotFound:
        dns, addresses = [], []
    common = [str(a.value) for a in leaf.subject.get_attributes_for_oid(NameOID.COMMON_NAME)]
    return (dns or common) + addresses


def _matches(name: str, pattern: str) -> bool:
    """A name against one of the certificate's: the same, or under its wildcard's one leftmost label."""
    name, pattern = name.lower().rstrip("."), pattern.lower().rstrip(".")
    if pattern.startswith("*."):
        return "." in name and name.split(".", 1)[1] == pattern[2:] and name.split(".", 1)[0] != ""
    return name == pattern
