"""Run commands on a remote host over SSH (paramiko), with host keys checked."""

from __future__ import annotations

import logging
import os
import select
import socket
import threading
import time
from functools import lru_cache
from typing import Sequence

import paramiko
from paramiko.hostkeys import HostKeyEntry, InvalidHostKey

from hosttune.errors import CommandTimeout, HostKeyError, TransportError
from hosttune.quoting import join
from hosttune.transport.base import CommandResult, ConnectionSpec, Transport, with_become

_KNOWN_HOSTS_LOCK = threading.Lock()
# paramiko logs every failed handshake with a traceback from its own thread; the reason reaches
# the user as one TransportError line instead.
logging.getLogger("paramiko").addHandler(logging.NullHandler())
logging.getLogger("paramiko").propagate = False


class _HostKeyPolicy(paramiko.MissingHostKeyPolicy):
    """Refuse unknown keys unless the user accepted new ones; then record them."""

    def __init__(self, spec: ConnectionSpec, known_hosts: str):
        self.spec = spec
        self.known_hosts = known_hosts

    def missing_host_key(self, client, hostname, key):
        if not self.spec.accept_new_host_keys:
            raise HostKeyError(
                f"{self.spec.host_name}: unknown SSH host key for {hostname} "
                f"({key.get_name()} {key.fingerprint}); verify it and add it to "
                f"{self.known_hosts}, or pass --accept-new-host-keys"
            )
        line = f"{hostname} {key.get_name()} {key.get_base64()}\n"
        try:
            with _KNOWN_HOSTS_LOCK:
                os.makedirs(os.path.dirname(self.known_hosts) or ".", exist_ok=True)
                with open(self.known_hosts, "a", encoding="ascii") as fh:
                    fh.write(line)
        except OSError as exc:  # else paramiko's handshake reports it as a host that does not speak SSH
            raise HostKeyError(f"{self.spec.host_name}: cannot record the new host key of {hostname} in "
                               f"{self.known_hosts}: {exc.strerror or exc}; set ssh.known_hosts to a file you can "
                               "write") from None


def _private_key(spec: ConnectionSpec) -> str | None:
    """The inventory's ssh.key, checked before connecting: paramiko reports a missing or public key file as
    a failed handshake, which reads as a host that does not speak SSH."""
    if not spec.key:
        return None
    path = os.path.expanduser(spec.key)
    try:
        with open(path, "rb") as fh:
            head = fh.read(64 << 10)
    except OSError as exc:
        raise TransportError(f"{spec.host_name}: ssh.key {path}: {exc.strerror or exc}; give the private key file "
                             "this machine logs in with") from None
    if b"PRIVATE KEY-----" not in head:
        raise TransportError(f"{spec.host_name}: ssh.key {path} is not a private key file (a .pub file?); give the "
                             "private key, the file without .pub")
    return path


def _known_hosts_path(spec: ConnectionSpec) -> str:
    return os.path.expanduser(spec.known_hosts or "~/.ssh/known_hosts")


@lru_cache(maxsize=8)
def _known_entries(path: str, mtime_ns: int, size: int) -> tuple[dict[str, list[HostKeyEntry]], list[HostKeyEntry]]:
    """known_hosts parsed once per version of the file: entries by plain host name, and the hashed ones.

    paramiko's own load is quadratic in the file's lines; with one line per host a fleet of a thousand paid
    that on every connection.
    """
    by_name: dict[str, list[HostKeyEntry]] = {}
    hashed: list[HostKeyEntry] = []
    with open(path, encoding="utf-8", errors="replace") as fh:
        for lineno, line in enumerate(fh, 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            try:
                entry = HostKeyEntry.from_line(line, lineno)
            except (paramiko.SSHException, InvalidHostKey):
                continue  # a line that is not a key, as OpenSSH skips it
            for name in entry.hostnames if entry is not None else ():
                (hashed if name.startswith("|1|") else by_name.setdefault(name, [])).append(HostKeyEntry([name], entry.key))
    return by_name, hashed


def _load_host_keys(client: paramiko.SSHClient, known: str, address: str, port: int) -> None:
    """The known_hosts entries that can name this host (its plain name, and every hashed one) into the client."""
    stat = os.stat(known)
    by_name, hashed = _known_entries(known, stat.st_mtime_ns, stat.st_size)
    name = address if port == 22 else f"[{address}]:{port}"
    keys = client.get_host_keys()
    for entry in by_name.get(name, []) + hashed:
        keys.add(entry.hostnames[0], entry.key.get_name(), entry.key)


class SshTransport(Transport):
    """One SSH connection per host, opened on first use."""

    def __init__(self, spec: ConnectionSpec, read_only: bool = False):
        self.spec = spec
        self.read_only = read_only
        self.host_name = spec.host_name
        self._client: paramiko.SSHClient | None = None
        self.connect_s = 0.0

    def connect(self) -> paramiko.SSHClient:
        if self._client is None:
            start = time.monotonic()
            self._client = self._open()
            self.connect_s = time.monotonic() - start
        return self._client

    def _open(self) -> paramiko.SSHClient:
        spec, known = self.spec, _known_hosts_path(self.spec)
        client = paramiko.SSHClient()
        try:
            if os.path.exists(known):
                _load_host_keys(client, known, spec.address, spec.port)
        except (OSError, paramiko.SSHException) as exc:
            raise TransportError(f"{spec.host_name}: cannot read known_hosts {known}: {getattr(exc, 'strerror', None) or exc}") from exc
        client.set_missing_host_key_policy(_HostKeyPolicy(spec, known))
        key = _private_key(spec)
        sock = _ssh_socket(spec)
        try:
            client.connect(
                spec.address, port=spec.port, username=spec.user, key_filename=key, sock=sock,
                timeout=spec.timeout_s, banner_timeout=spec.timeout_s,
                auth_timeout=spec.timeout_s, look_for_keys=key is None, allow_agent=key is None,
            )
        except paramiko.BadHostKeyException as exc:
            raise HostKeyError(
                f"{spec.host_name}: SSH HOST KEY CHANGED for {spec.address}:{spec.port} "
                f"(got {exc.key.get_name()} {exc.key.fingerprint}); someone may be intercepting "
                f"the connection, or the host was reinstalled. Fix {known} by hand."
            ) from exc
        except HostKeyError:
            client.close()
            raise
        except paramiko.AuthenticationException as exc:
            client.close()
            raise TransportError(f"{spec.host_name}: SSH authentication failed as {spec.user}: {exc}") from exc
        except (OSError, socket.timeout, paramiko.SSHException, EOFError) as exc:
            client.close()
            raise TransportError(f"{spec.host_name}: {spec.address}:{spec.port} does not speak SSH: {exc or type(exc).__name__}") from exc
        return client

    def _command(self, argv: Sequence[str], stdin: bytes | None, timeout: float | None) -> CommandResult:
        full = with_become(argv, self.spec.become)
        start = time.monotonic()
        try:
            chan = self.connect().get_transport().open_session(timeout=self.spec.timeout_s)
            chan.exec_command(join(full))
            if stdin:
                _send(chan, stdin)
            chan.shutdown_write()
            rc, out, err = _drain(chan, timeout)
        except CommandTimeout:
            raise CommandTimeout(f"{self.host_name}: {argv[0]} timed out after {timeout}s") from None
        except (OSError, socket.timeout, paramiko.SSHException) as exc:
            raise TransportError(f"{self.host_name}: command {argv[0]!r} failed over SSH: {exc}") from exc
        return CommandResult(full, rc, out, err, time.monotonic() - start)

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None


STDIN_CHUNK = 1 << 18


def _send(chan: paramiko.Channel, data: bytes) -> None:
    """Send stdin in chunks: paramiko's sendall re-slices what is left after every packet,
    which is quadratic in the size (a 190 MB wheel took ten minutes instead of seconds)."""
    view = memoryview(data)
    for start in range(0, len(view), STDIN_CHUNK):
        chan.sendall(bytes(view[start:start + STDIN_CHUNK]))


def _drain(chan: paramiko.Channel, timeout: float | None) -> tuple[int, str, str]:
    """Read stdout and stderr together (one blocked stream must not stall the other)."""
    deadline = None if timeout is None else time.monotonic() + timeout
    out, err = bytearray(), bytearray()
    while True:
        while chan.recv_ready():
            out += chan.recv(65536)
        while chan.recv_stderr_ready():
            err += chan.recv_stderr(65536)
        if chan.exit_status_ready() and not chan.recv_ready() and not chan.recv_stderr_ready():
            break
        if deadline is not None and time.monotonic() > deadline:
            chan.close()
            raise CommandTimeout(f"no exit after {timeout}s")
        select.select([chan], [], [], 0.1)
    # Whatever arrived between the last read and the exit status.
    out += _read_rest(chan.recv)
    err += _read_rest(chan.recv_stderr)
    return chan.recv_exit_status(), out.decode("utf-8", "surrogateescape"), err.decode("utf-8", "surrogateescape")


def _read_rest(recv) -> bytes:
    data = bytearray()
    while chunk := recv(65536):
        data += chunk
    return bytes(data)


def _ssh_socket(spec: ConnectionSpec) -> socket.socket:
    """A TCP connection that has sent something: refused, silent and closing ports each get one plain line."""
    where = f"{spec.host_name}: {spec.address}:{spec.port}"
    try:
        sock = socket.create_connection((spec.address, spec.port), timeout=spec.timeout_s)
    except socket.gaierror as exc:
        raise TransportError(f"{spec.host_name}: cannot resolve {spec.address}: {exc.strerror}") from exc
    except ConnectionRefusedError as exc:
        raise TransportError(f"{where}: connection refused (is sshd running, and on this port?)") from exc
    except (socket.timeout, TimeoutError) as exc:
        raise TransportError(f"{where}: no answer within {spec.timeout_s:g}s (host down, or the port is filtered)") from exc
    except (OSError, UnicodeError) as exc:
        raise TransportError(f"{where}: cannot connect: {getattr(exc, 'strerror', None) or exc}") from exc
    try:
        ready, _, _ = select.select([sock], [], [], spec.timeout_s)
        first = sock.recv(1, socket.MSG_PEEK) if ready else None
    except OSError as exc:
        sock.close()
        raise TransportError(f"{where}: connection reset before SSH started: {exc.strerror}") from exc
    if first is None or first == b"":
        sock.close()
        what = f"accepts TCP connections but sent no SSH banner within {spec.timeout_s:g}s" if first is None \
            else "accepted the connection and closed it without speaking SSH"
        raise TransportError(f"{where}: {what} (not an SSH server on this port, or sshd is overloaded)")
    return sock
