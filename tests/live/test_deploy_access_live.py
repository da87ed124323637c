"""Who may call a deployed engine, on a real systemd host over SSH: deployed without a key, `hosttune
check` reports the open port; deployed again with a generated key and the host's nginx with TLS from a
test CA, the key is in no process's command line, not in the unit file and not in the journal, the
engine listens on 127.0.0.1 only, nginx answers 401 without the key and 200 with it, the `openai`
client reaches it over https trusting the test CA, `hosttune bench --api-key` measures it (the key in
no saved file) and `hosttune check` finds nothing open.

nginx-light comes with the live image, not started and without Debian's default site (image.py).
Uses the deploy live tests' wheelhouse and tiny model (conftest); ~2-3 minutes on a 2-core VM.
"""
from __future__ import annotations

import datetime as dt
import ipaddress
import json
import re
import shutil
import socket
import ssl
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml

from .deploy_setup import MODEL, REPO, free_port
from .test_deploy_live import deploy

pytestmark = [pytest.mark.live, pytest.mark.timeout(1500), pytest.mark.live_seconds(75)]
x509 = pytest.importorskip("cryptography.x509")
from cryptography.hazmat.primitives import hashes, serialization  # noqa: E402
from cryptography.hazmat.primitives.asymmetric import ec  # noqa: E402
from cryptography.x509.oid import NameOID  # noqa: E402

from typer.testing import CliRunner  # noqa: E402

from hosttune.cli import app  # noqa: E402
from hosttune.config.inventory import load_inventory  # noqa: E402
from hosttune.deploy.balancer import check_balancers, upstreams, write_upstreams  # noqa: E402
from hosttune.deploy.host import HostDeploy  # noqa: E402
from hosttune.fleet_runner import Outcome  # noqa: E402

runner = CliRunner()


def _pem_key(key) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())


def make_test_ca(folder: Path) -> tuple[Path, Path, Path]:
    """A CA, and a certificate it signed for 127.0.0.1 and localhost: (ca.pem, server.pem, server.key)."""
    now = dt.datetime.now(dt.timezone.utc)
    ca_key, server_key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "hosttune live test CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number()).not_valid_before(now - dt.timedelta(minutes=5))
          .not_valid_after(now + dt.timedelta(hours=2))
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True, content_commitment=False,
                                       key_encipherment=False, data_encipherment=False, key_agreement=False,
                                       encipher_only=False, decipher_only=False), critical=True)
          .sign(ca_key, hashes.SHA256()))
    server = (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")]))
              .issuer_name(ca_name).public_key(server_key.public_key()).serial_number(x509.random_serial_number())
              .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(hours=2))
              .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost"),
                                                          x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
              .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
              .sign(ca_key, hashes.SHA256()))
    paths = folder / "ca.pem", folder / "server.pem", folder / "server.key"
    paths[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(server.public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(_pem_key(server_key))
    return paths


def get(url: str, key: str | None, ca: Path) -> int:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    context = ssl.create_default_context(cafile=str(ca))
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=30, context=context) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def check_finding(inventory: Path) -> dict:
    result = runner.invoke(app, ["check", "-i", str(inventory), "--format", "json"])
    (host,) = json.loads(result.stdout)["hosts"]
    return next(f for f in host["findings"] if f["check_id"] == "serve.api_key")


def listen_addresses(host, port: int) -> set[str]:
    out = host.exec(["ss", "-ltnH", f"sport = :{port}"]).stdout
    return {line.split()[3].rsplit(":", 1)[0] for line in out.splitlines() if line.strip()}


def test_keyed_deploy_behind_nginx_with_tls(live_fleet, fresh_hosts, tmp_path, wheelhouse, tiny_model, capsys):
    (host,) = fresh_hosts(["keyed1"])
    shutil.copytree(tiny_model, host.path(MODEL))
    known = live_fleet.write_known_hosts(tmp_path / "known_hosts", [host])
    port, front = free_port(), free_port()

    # 1. no key, the engine on every interface: check reports it
    plain = live_fleet.write_inventory(tmp_path / "plain.yaml", known, [host], user="deploy", become=True)
    result, _ = deploy(plain, wheelhouse, port)
    assert result.exit_code == 0, result.output
    finding = check_finding(plain)
    assert finding["status"] == "drift" and f"engine port {port} answers /v1/models to anyone" in finding["detail"]

    # 2. a generated key for the group, nginx with TLS in front
    ca, cert, cert_key = make_test_ca(tmp_path)
    keys_dir = tmp_path / "keys"
    deploy_vars = {"api_key": True, "nginx": {"port": front, "tls_cert": str(cert), "tls_key": str(cert_key)}}
    keyed = live_fleet.write_inventory(tmp_path / "keyed.yaml", known, [host], user="deploy", become=True,
                                       host_vars={host.name: {"deploy": deploy_vars}})
    result, seconds = deploy(keyed, wheelhouse, port, "--keys-dir", str(keys_dir))
    assert result.exit_code == 0, result.output
    assert "deployed" in result.stdout.splitlines()[0] and "one-token generation" in result.stdout  # the gate sent the key
    key = (keys_dir / "live.key").read_text().strip()
    assert key.startswith("ht-") and oct((keys_dir / "live.key").stat().st_mode & 0o777) == "0o600"
    assert key not in result.output

    # the key: a root-only file, in no command line, unit, systemd property or journal line
    assert host.exec("stat -c '%U %G %a' /etc/hosttune/keys /etc/hosttune/keys/live.env").stdout.split() == \
        ["root", "root", "700", "root", "root", "600"]
    assert host.exec("cat /etc/hosttune/keys/live.env").stdout == f"HOSTTUNE_ENGINE_API_KEY={key}\n"
    assert key not in host.exec("ps -eo args").stdout
    assert key not in subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout  # this machine's view
    unit = host.path("/etc/systemd/system/hosttune-serve.service").read_text()
    assert "EnvironmentFile=/etc/hosttune/keys/live.env" in unit and key not in unit
    assert "--host 127.0.0.1" in unit
    assert key not in host.exec("systemctl show hosttune-serve.service").stdout
    assert key not in host.exec("journalctl --no-pager --output cat").stdout
    assert key not in host.exec("grep -rs -- . /opt/hosttune/current/.hosttune/ || true").stdout

    # the engine on loopback only; nginx alone on the network
    assert listen_addresses(host, port) == {"127.0.0.1"}
    assert listen_addresses(host, front) <= {"0.0.0.0", "*", "[::]"}
    base = f"https://127.0.0.1:{front}"
    assert get(base + "/v1/models", None, ca) == 401
    assert get(base + "/v1/models", "ht-wrong-key-0000000000000000", ca) == 401
    assert get(base + "/v1/models", key, ca) == 200
    assert get(base + "/health", None, ca) == 200  # load balancers' probes stay open

    import openai

    client = openai.OpenAI(base_url=base + "/v1", api_key=key, max_retries=0, timeout=60,
                           http_client=openai.DefaultHttpxClient(verify=ssl.create_default_context(cafile=str(ca))))
    out = client.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=4, temperature=0)
    assert out.usage.completion_tokens >= 1
    stream = list(client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}],
                                                 max_tokens=4, stream=True))
    assert stream[-1].choices[0].finish_reason in ("length", "stop")
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=base + "/v1", api_key="ht-wrong-key-0000000000000000", max_retries=0,
                      http_client=openai.DefaultHttpxClient(verify=ssl.create_default_context(cafile=str(ca)))).models.list()

    # bench measures the keyed deployment through nginx; the key is in nothing it saved
    out_dir = tmp_path / "bench"
    bench = subprocess.run(
        [sys.executable, "-m", "hosttune", "bench", "--url", base, "--api-key", key, "--users", "2", "--requests", "6",
         "--warmup", "0s", "--prompts", "16", "--max-tokens", "4", "--timeout", "120s", "--max-client-lag", "1s",
         "--cacert", str(ca), "--out", str(out_dir)],
        capture_output=True, text=True, timeout=600, cwd=REPO)
    assert bench.returncode == 0, bench.stdout + bench.stderr
    doc = json.loads((out_dir / "results.json").read_text())
    assert doc["runs"][0]["summary"]["num_ok"] == 6
    assert all(key not in p.read_text() for p in out_dir.glob("*.*") if p.suffix in (".json", ".md"))
    assert key not in bench.stdout + bench.stderr

    balanced_through_tls(tmp_path, known, host, front, key, ca, cert, cert_key)

    # check: nothing answers without the key beyond loopback any more
    finding = check_finding(keyed)
    assert finding["status"] == "ok", finding
    assert re.search(rf"nginx port {front} \(https\) on \S+: answers 401 without a key", finding["active"]), finding
    with capsys.disabled():
        print(f"\n  keyed deploy behind nginx with TLS: {seconds:.1f}s")


class Impostor(BaseHTTPRequestHandler):
    """A host answering with a certificate the deployment's CA never signed; it counts what reaches it."""

    requests: list[str] = []

    def do_GET(self):  # noqa: N802 (http.server's name)
        Impostor.requests.append(self.path)
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args):
        pass


def start_impostor(folder: Path, port: int) -> ThreadingHTTPServer:
    folder.mkdir()
    _, cert, key = make_test_ca(folder)  # a certificate for 127.0.0.1 and localhost, from another CA
    server = ThreadingHTTPServer(("127.0.0.1", port), Impostor)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    server.handle_error = lambda request, address: None  # refused handshakes are the point
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def balanced_through_tls(tmp_path: Path, known: Path, host, front: int, key: str, ca: Path, cert: Path, cert_key: Path):
    """The balancer deploy writes for a group of the deployed host and an impostor, run by this machine's nginx."""
    lb_port, fake_port = free_port(), free_port()
    tls = {"tls_cert": str(cert), "tls_key": str(cert_key), "tls_ca": str(ca), "tls_name": "localhost"}
    inventory = tmp_path / "edge.yaml"
    inventory.write_text(yaml.safe_dump({"groups": {"edge": {
        "vars": {"deploy": {"api_key": True, "lb_port": lb_port}},
        "hosts": {host.name: {"address": "127.0.0.1", "deploy": {"nginx": {"port": front, **tls}}},
                  # another machine behind the same loopback address, as the test hosts are (its own SSH port)
                  "impostor": {"address": "127.0.0.1", "ssh": {"port": free_port()},
                               "deploy": {"nginx": {"port": fake_port, **tls}}}}}}}))
    inv = load_inventory(inventory)
    check_balancers(inv)
    (conf,) = write_upstreams(upstreams(inv, [HostDeploy(h, Outcome.DEPLOYED, "r", "r") for h in inv.hosts]),
                              tmp_path / "nginx-edge")
    text = conf.read_text()
    assert f"listen {lb_port} ssl;" in text and "proxy_ssl_verify on;" in text and f"proxy_ssl_trusted_certificate {ca}" in text
    impostor = start_impostor(tmp_path / "other-ca", fake_port)
    main = tmp_path / "nginx-edge" / "nginx.conf"
    main.write_text(f"pid {main.parent}/nginx.pid;\nerror_log {main.parent}/error.log;\nevents {{}}\n"
                    f"http {{\n    access_log off;\n    include {conf};\n}}\n")
    nginx = subprocess.Popen(["nginx", "-p", str(main.parent), "-c", str(main), "-g", "daemon off;"])
    try:
        base = f"https://127.0.0.1:{lb_port}"
        wait_until_listening(lb_port)
        codes = [get(base + "/v1/models", key, ca) for _ in range(6)]
        assert codes == [200] * 6 and get(base + "/v1/models", None, ca) == 401
    finally:
        nginx.terminate()
        nginx.wait(timeout=30)
        impostor.shutdown()
    assert Impostor.requests == []  # the impostor's certificate was refused before any request was sent
    assert "upstream SSL certificate verify error" in (main.parent / "error.log").read_text()


def wait_until_listening(port: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise AssertionError(f"nothing listens on {port} after {timeout:.0f}s")
