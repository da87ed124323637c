"""Hosts that refuse, stay silent or close the connection: one plain line each, nothing on stderr."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
from dataclasses import replace
from pathlib import Path

import paramiko
import pytest

from hosttune.errors import TransportError
from hosttune.transport.base import ConnectionSpec
from hosttune.transport.ssh import SshTransport

ROOT = Path(__file__).resolve().parents[2]


def _server(mode: str) -> int:
    """A TCP port that never speaks SSH: `silent` accepts and waits, `close` hangs up, `http` answers HTTP."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    kept = []

    def serve():
        while True:
            conn, _ = srv.accept()
            kept.append(conn)
            if mode == "http":
                conn.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n")
            if mode in ("close", "http"):
                conn.close()

    threading.Thread(target=serve, daemon=True).start()
    return srv.getsockname()[1]


def _refused_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


@pytest.fixture(scope="module")
def ports():
    return {"silent": _server("silent"), "close": _server("close"), "http": _server("http"), "refused": _refused_port()}


@pytest.mark.parametrize("mode, message", [
    ("silent", "accepts TCP connections but sent no SSH banner within 1s"),
    ("close", "closed it without speaking SSH"),
    ("http", "does not speak SSH"),
    ("refused", "connection refused"),
])
def test_transport_error_says_what_the_port_did(ports, tmp_path, mode, message):
    spec = ConnectionSpec("h", "ssh", "127.0.0.1", ports[mode], known_hosts=str(tmp_path / "kh"), timeout_s=1.0)
    with pytest.raises(TransportError, match=message):
        SshTransport(spec).connect()


def test_a_missing_or_public_key_file_is_named_as_such_not_as_a_host_that_does_not_speak_ssh(ports, tmp_path):
    public = _ed25519(tmp_path, "id").with_suffix(".pub")
    for key, message in ((tmp_path / "none", f"h: ssh.key {tmp_path / 'none'}: No such file or directory; give the "),
                         (tmp_path, f"h: ssh.key {tmp_path}: Is a directory; give the "),
                         (public, f"h: ssh.key {public} is not a private key file (a .pub file?)")):
        spec = ConnectionSpec("h", "ssh", "127.0.0.1", ports["http"], key=str(key), known_hosts=str(tmp_path / "kh"),
                              timeout_s=1.0)
        with pytest.raises(TransportError) as exc:
            SshTransport(spec).connect()
        assert str(exc.value).startswith(message)


def test_a_new_host_key_that_cannot_be_recorded_says_so_not_that_the_host_does_not_speak_ssh(tmp_path):
    from hosttune.errors import HostKeyError
    from hosttune.transport.ssh import _HostKeyPolicy

    key = paramiko.Ed25519Key.from_private_key_file(str(_ed25519(tmp_path, "host")))
    (tmp_path / "file").write_text("")
    known = tmp_path / "file" / "known_hosts"  # its folder is a file
    spec = ConnectionSpec("h", "ssh", "10.0.0.1", 22, known_hosts=str(known), accept_new_host_keys=True)
    with pytest.raises(HostKeyError, match=f"^h: cannot record the new host key of 10.0.0.1 in {known}: "):
        _HostKeyPolicy(spec, str(known)).missing_host_key(None, "10.0.0.1", key)
    ok = tmp_path / "new" / "known_hosts"
    _HostKeyPolicy(replace(spec, known_hosts=str(ok)), str(ok)).missing_host_key(None, "10.0.0.1", key)
    assert ok.read_text().startswith("10.0.0.1 ssh-ed25519 ")


def test_check_prints_one_line_per_host_and_nothing_on_stderr(ports, tmp_path):
    inv = tmp_path / "inv.yaml"
    inv.write_text("hosts:\n" + "".join(
        f"  {mode}:\n    address: 127.0.0.1\n    ssh: {{port: {port}, timeout: 1, known_hosts: kh}}\n"
        for mode, port in ports.items()))
    proc = subprocess.run([sys.executable, "-m", "hosttune", "check", "-i", str(inv)], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=60)
    assert proc.returncode == 4, proc.stdout + proc.stderr
    assert proc.stderr == ""
    for mode in ports:
        lines = [line for line in proc.stdout.splitlines() if line.startswith(f"  {mode}: ")]
        assert len(lines) == 1, proc.stdout


def test_known_hosts_entries_are_found_by_plain_and_hashed_name_and_parsed_once(tmp_path):
    import paramiko
    from paramiko.hostkeys import HostKeys

    from hosttune.transport.ssh import _known_entries, _load_host_keys

    _known_entries.cache_clear()
    keys = [paramiko.Ed25519Key.from_private_key_file(str(_ed25519(tmp_path, n))) for n in ("a", "b", "c")]
    hashed = HostKeys.hash_host("[10.0.0.3]:2222")
    path = tmp_path / "known_hosts"
    path.write_text(f"# comment\n10.0.0.1 {keys[0].get_name()} {keys[0].get_base64()}\n"
                    f"[10.0.0.2]:2222,other {keys[1].get_name()} {keys[1].get_base64()}\n"
                    f"{hashed} {keys[2].get_name()} {keys[2].get_base64()}\nnot a key line\n")
    for (address, port), key in zip((("10.0.0.1", 22), ("10.0.0.2", 2222), ("10.0.0.3", 2222)), keys):
        client = paramiko.SSHClient()
        _load_host_keys(client, str(path), address, port)
        name = address if port == 22 else f"[{address}]:{port}"
        assert client.get_host_keys().lookup(name)[key.get_name()] == key
        assert client.get_host_keys().lookup("10.0.0.9") is None
    assert _known_entries.cache_info().misses == 1 and _known_entries.cache_info().hits == 2


def _ed25519(tmp_path, name):
    import subprocess

    path = tmp_path / name
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)
    return path
