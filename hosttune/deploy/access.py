"""Who may call a deployed engine: the group's API key, and the host's nginx in front of its replicas.

Inventory (every key optional, usually in a group's `deploy:` vars):

    deploy:
      api_key: true                 # a key for the group, generated on the first deploy into
                                    # KEYS_DIR/<group>.key (hosttune deploy --keys-dir) and reused
      api_key_file: keys/prod.key   # or the group's key from this file (relative to the inventory)
      nginx:                        # the host's nginx listens on the network; the engine binds 127.0.0.1
        port: 443                   # default 80, or 443 with TLS
        tls_cert: certs/prod.pem    # certificate chain and private key (local files, relative to the
        tls_key: certs/prod.key     # inventory), uploaded; nginx then speaks https only
        tls_ca: certs/ca.pem        # the CA that signed tls_cert: the group balancer verifies the hosts with it
        tls_name: serve.example.net # a name tls_cert carries: the balancer checks the hosts' certificate for it

On the host the key lives in /etc/hosttune/keys/<group>.env (root, 0600) as the one line the
engine reads from its environment (HOSTTUNE_ENGINE_API_KEY, VLLM_API_KEY, ...); the unit names
it with EnvironmentFile=, so the key is never on a command line, in a unit file or in the journal.
The key is never printed: plans and recaps name the file only.
"""

from __future__ import annotations

import hashlib
import os
import re
import secrets
import threading
from dataclasses import dataclass, field
from pathlib import Path

from hosttune.deploy.certificates import check_pair, check_trust
from hosttune.deploy.errors import DeployError
from hosttune.config.inventory import Host

HOST_KEY_DIR = "/etc/hosttune/keys"
HOST_TLS_DIR = "/etc/hosttune/tls"
GENERATED_PREFIX = "ht-"
MIN_KEY_LENGTH = 16
PLANNED_KEY = GENERATED_PREFIX + "made-on-the-first-deploy"  # what a dry run plans with before the key exists
_KEY = re.compile(r"^[\x21-\x7e]+$")  # printable ASCII, no spaces: it travels in an HTTP header
_GROUP = re.compile(r"^[A-Za-z0-9_.-]+$")
_generate_lock = threading.Lock()  # hosts of one group resolve their key in parallel threads


@dataclass(frozen=True)
class Tls:
    cert: Path  # local files
    key: Path
    ca: Path | None = None  # what signed cert: the group balancer verifies the hosts against it
    name: str | None = None  # the name cert carries, for the balancer's check


@dataclass(frozen=True)
class Front:
    """The host's nginx in front of the replicas."""

    port: int
    tls: Tls | None = None


@dataclass(frozen=True)
class Access:
    """What guards one host's engine: its group's key (None: anyone may call) and the nginx front."""

    group: str = ""
    key: str | None = field(default=None, repr=False)
    front: Front | None = None

    @property
    def env_file(self) -> str | None:
        return f"{HOST_KEY_DIR}/{self.group}.env" if self.key else None

    @property
    def fingerprint(self) -> str | None:
        """Names the key in a release summary (a new key is a new release) without revealing it."""
        if not self.key:
            return None
        return "sha256:" + hashlib.sha256(b"hosttune api key\0" + self.key.encode()).hexdigest()[:16]


def _base(host: Host) -> Path:
    return Path(host.source.rsplit(":", 1)[0]).parent


def _local(host: Host, value, where: str) -> Path:
    if not isinstance(value, str) or not value:
        raise DeployError(f"{host.source}: {where} must be a file path")
    path = Path(value).expanduser()
    return path if path.is_absolute() else _base(host) / path


def access_for(host: Host, keys_dir: Path, *, makes_keys: bool = True) -> Access:
    """The host's Access from its `deploy:` vars; a generated key is created once, then reused (makes_keys
    False, for --dry-run: a key not made yet is not made, and a stand-in takes its place in the plan)."""
    doc = host.deploy
    if not _GROUP.match(host.group):
        raise DeployError(f"{host.source}: group name {host.group!r} cannot name a key file")
    return Access(host.group, _key(host, doc, keys_dir, makes_keys), _front(host, doc.get("nginx")))


def _key(host: Host, doc: dict, keys_dir: Path, makes_keys: bool) -> str | None:
    wanted = doc.get("api_key", False)
    if not isinstance(wanted, bool):
        raise DeployError(f"{host.source}: deploy.api_key must be true or false (a file goes in deploy.api_key_file)")
    if doc.get("api_key_file") is not None:
        try:
            return read_key(_local(host, doc["api_key_file"], "deploy.api_key_file"))
        except DeployError as exc:
            raise DeployError(f"{host.source}: deploy.api_key_file: {exc}") from None
    if not wanted:
        return None
    path = keys_dir / f"{host.group}.key"
    return generated_key(path) if makes_keys or path.exists() else PLANNED_KEY


def read_key(path: Path) -> str:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise DeployError(f"cannot read the API key file {path}: {getattr(exc, 'strerror', None) or exc}") from None
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.startswith("#")]
    if len(lines) != 1 or not _KEY.match(lines[0]) or len(lines[0]) < MIN_KEY_LENGTH:
        raise DeployError(f"{path}: an API key file holds one line: a key of at least {MIN_KEY_LENGTH} printable "
                          f"characters without spaces")
    return lines[0]


def generated_key(path: Path) -> str:
    """The key in `path`, made first (random, 0600 in a 0700 folder) if the file does not exist."""
    with _generate_lock:
        if path.exists():
            return read_key(path)
        key = GENERATED_PREFIX + secrets.token_urlsafe(32)
        try:
            path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except OSError as exc:
            raise DeployError(f"cannot make the API key file {path} ({exc.filename}: {exc.strerror}); "
                              "pass --keys-dir a folder you can write") from None
        with os.fdopen(fd, "w") as f:
            f.write(key + "\n")
        return key


def front_for(host: Host) -> Front | None:
    return _front(host, host.deploy.get("nginx"))


NGINX_KEYS = {"port", "tls_cert", "tls_key", "tls_ca", "tls_name"}
_NAME = re.compile(r"^[A-Za-z0-9*]([A-Za-z0-9.:-]{0,252})$")


def _tls(host: Host, doc: dict) -> Tls | None:
    if not (doc.get("tls_cert") or doc.get("tls_key")):
        if doc.get("tls_ca") or doc.get("tls_name"):
            raise DeployError(f"{host.source}: deploy.nginx.tls_ca and tls_name go with tls_cert and tls_key")
        return None
    if not (doc.get("tls_cert") and doc.get("tls_key")):
        raise DeployError(f"{host.source}: deploy.nginx needs both tls_cert and tls_key for TLS")
    ca = _local(host, doc["tls_ca"], "deploy.nginx.tls_ca") if doc.get("tls_ca") is not None else None
    name = doc.get("tls_name")
    if name is not None and (not isinstance(name, str) or not _NAME.match(name)):
        raise DeployError(f"{host.source}: deploy.nginx.tls_name must be a host name or address (got {name!r})")
    tls = Tls(_local(host, doc["tls_cert"], "deploy.nginx.tls_cert"), _local(host, doc["tls_key"], "deploy.nginx.tls_key"),
              ca, name)
    check_pair(tls.cert, tls.key, host.source)
    if ca:
        check_trust(tls.cert, ca, name, host.source)
    return tls


def _front(host: Host, doc) -> Front | None:
    if doc is None or doc is False:
        return None
    if doc is True:
        doc = {}
    if not isinstance(doc, dict) or set(doc) - NGINX_KEYS:
        raise DeployError(f"{host.source}: deploy.nginx takes {', '.join(sorted(NGINX_KEYS))}")
    tls = _tls(host, doc)
    port = doc.get("port", 443 if tls else 80)
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        raise DeployError(f"{host.source}: deploy.nginx.port must be a port number (got {port!r})")
    return Front(port, tls)


# An engine that takes its key only as a flag (SGLang's --api-key) runs through this launcher: it adds
# the flag to sys.argv from the environment, so the key is in the process's memory, not in its
# /proc/PID/cmdline (what ps shows). argv: ENV_NAME FLAG MODULE ARGS...
_LAUNCHER = ("import os, runpy, sys; env, flag, module = sys.argv[1:4]; "
             "sys.argv = [module, *sys.argv[4:], '--' + flag, os.environ.pop(env)]; "
             "runpy.run_module(module, run_name='__main__', alter_sys=True)")


def launched_with_key(command: tuple[str, ...], env_name: str, flag: str) -> tuple[str, ...]:
    """`python -m MODULE ARGS` as the launcher's `python -c LAUNCHER ENV FLAG MODULE ARGS`."""
    if len(command) < 3 or command[1] != "-m":
        raise DeployError(f"the engine takes its API key only as --{flag}, and its command {' '.join(command[:3])} "
                          f"is not 'python -m MODULE', which the key launcher needs")
    return (command[0], "-c", _LAUNCHER, env_name, flag, command[2], *command[3:])
