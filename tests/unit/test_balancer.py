"""The group balancer as data and as nginx reads it: TLS in front of TLS hosts, their certificates
verified against the deployment's CA; a plain-HTTP balancer in front of keyed hosts refused unless
the inventory allows it; every rendered config passes `nginx -t`."""

from __future__ import annotations

import shlex
import shutil
import subprocess
from importlib import resources
from pathlib import Path

import pytest

from hosttune.config.inventory import load_inventory
from hosttune.deploy.balancer import check_balancers, upstreams, write_upstreams
from hosttune.deploy.errors import DeployError
from hosttune.deploy.host import HostDeploy
from hosttune.deploy.shape import Shape
from hosttune.deploy.units import render_nginx
from hosttune.fleet_runner import Outcome

from deploy_fixtures import group_inventory, tls_pair

needs_nginx = pytest.mark.skipif(shutil.which("nginx") is None or shutil.which("openssl") is None,
                                 reason="needs nginx and openssl (scripts/test.sh installs nginx-light as root)")


def _inventory(tmp_path: Path, deploy: str):
    return load_inventory(group_inventory(tmp_path, deploy))


def _certs(folder: Path) -> tuple[Path, Path, Path]:
    """A CA and a certificate it signed for serve.test: (ca.pem, cert.pem, key.pem)."""
    def run(*argv):
        subprocess.run(argv, check=True, capture_output=True, timeout=60, cwd=folder)

    run("openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
        "-keyout", "ca.key", "-out", "ca.pem", "-days", "1", "-subj", "/CN=test CA")
    run("openssl", "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
        "-keyout", "key.pem", "-out", "req.csr", "-subj", "/CN=serve.test")
    run("openssl", "x509", "-req", "-in", "req.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
        "-out", "cert.pem", "-days", "1")
    return folder / "ca.pem", folder / "cert.pem", folder / "key.pem"


def _fake_certs(folder: Path) -> tuple[Path, Path, Path]:
    """A self-signed certificate (its own CA) and its key, made in-process: (ca.pem, cert.pem, key.pem)."""
    cert, key = tls_pair(folder)
    (folder / "ca.pem").write_bytes(cert.read_bytes())
    return folder / "ca.pem", cert, key


def _tls(ca: Path, cert: Path, key: Path, extra: str = "") -> str:
    return (f"api_key: true\nlb_port: 8443\n{extra}"
            f"nginx: {{port: 9443, tls_cert: {cert}, tls_key: {key}, tls_ca: {ca}, tls_name: serve.test}}\n")


def _deployed(inv) -> list[HostDeploy]:
    return [HostDeploy(h, Outcome.DEPLOYED, "r", "r", shape=Shape("custom", "/m", "1", 1, 8000)) for h in inv.hosts]


def test_a_tls_balancer_verifies_the_hosts_against_the_deployments_ca(tmp_path):
    ca, cert, key = _fake_certs(tmp_path)
    inv = _inventory(tmp_path, _tls(ca, cert, key))
    check_balancers(inv)
    (upstream,) = upstreams(inv, _deployed(inv))
    assert upstream.backends == ("10.0.0.1:9443", "10.0.0.2:9443") and upstream.backend_scheme == "https"
    conf = render_nginx(upstream).decode()
    for line in ("listen 8443 ssl;", f"ssl_certificate {cert};", f"ssl_certificate_key {key};",
                 "proxy_pass https://hosttune_prod;", "proxy_ssl_verify on;", f"proxy_ssl_trusted_certificate {ca};",
                 "proxy_ssl_name serve.test;", "proxy_ssl_server_name on;", "the balancer over group prod's custom hosts"):
        assert line in conf, line


def test_only_the_hosts_serving_after_the_deploy_are_balanced(tmp_path):
    inv = _inventory(tmp_path, "port: 8100\n")
    first = _deployed(inv)[0]
    (upstream,) = upstreams(inv, [first, HostDeploy(inv.hosts[1], Outcome.FAILED, "r", None)])
    assert upstream.backends == ("10.0.0.1:8000",) and upstream.listen == 80 and upstream.backend_ca is None


@pytest.mark.parametrize("deploy, message", [
    ("api_key: true\n", "would carry the API key of gpu-a, gpu-b in plain HTTP"),
    ("nginx: {tls_cert: CERT, tls_key: KEY}\n", "give deploy.nginx.tls_ca (the CA that signed them) and tls_name"),
])
def test_an_unsafe_balancer_is_refused_before_any_host_changes(tmp_path, deploy, message):
    ca, cert, key = _fake_certs(tmp_path)
    inv = _inventory(tmp_path, deploy.replace("CERT", str(cert)).replace("KEY", str(key)))
    with pytest.raises(DeployError, match=message.replace("(", r"\(").replace(")", r"\)")):
        check_balancers(inv)



def test_a_nginx_dir_that_cannot_be_written_is_refused_before_any_host_changes(tmp_path):
    inv = _inventory(tmp_path, "port: 8100\n")
    (tmp_path / "file").write_text("")
    with pytest.raises(DeployError) as refused:
        check_balancers(inv, tmp_path / "file" / "nginx")
    assert str(refused.value) == (f"--nginx-dir {tmp_path}/file/nginx: {tmp_path}/file is not a folder this user can "
                                  "write; pass one where the group balancers can be written")
    check_balancers(inv, tmp_path / "new" / "nginx")  # made when the balancers are written
    assert not (tmp_path / "new").exists()

def test_a_plain_balancer_in_front_of_keyed_hosts_when_the_inventory_allows_it(tmp_path):
    inv = _inventory(tmp_path, "api_key: true\nlb_plain_http: true\n")
    check_balancers(inv)
    (upstream,) = upstreams(inv, _deployed(inv))
    assert "proxy_pass http://hosttune_prod;" in render_nginx(upstream).decode()


def _nginx_t(tmp_path: Path, conf: bytes) -> subprocess.CompletedProcess:
    (tmp_path / "group.conf").write_bytes(conf)
    (tmp_path / "nginx.conf").write_text(
        f"pid {tmp_path}/nginx.pid;\nerror_log {tmp_path}/error.log;\nevents {{}}\n"
        f"http {{\n    access_log off;\n    include {tmp_path}/group.conf;\n}}\n")
    return subprocess.run(["nginx", "-t", "-p", str(tmp_path), "-c", str(tmp_path / "nginx.conf")],
                          capture_output=True, text=True, timeout=60)


@needs_nginx
@pytest.mark.parametrize("tls", [True, False])
def test_nginx_accepts_the_rendered_balancer(tmp_path, tls):
    deploy = _tls(*_certs(tmp_path)) if tls else "api_key: true\nlb_plain_http: true\n"
    inv = _inventory(tmp_path, deploy)
    (upstream,) = upstreams(inv, _deployed(inv))
    result = _nginx_t(tmp_path, render_nginx(upstream))
    assert result.returncode == 0, result.stderr
    assert "test is successful" in result.stderr
    broken = render_nginx(upstream).replace(b"proxy_ssl_verify on;" if tls else b"least_conn;", b"least_conn")
    assert _nginx_t(tmp_path, broken).returncode != 0


def test_a_group_whose_hosts_route_by_prefix_routes_across_them_too(tmp_path):
    inv = _inventory(tmp_path, "router: true\nlb_port: 8080\n")
    (upstream,) = upstreams(inv, _deployed(inv))
    assert upstream.backends == ("127.0.0.1:9080",) and upstream.tries == 1
    assert upstream.direct_backends == ("10.0.0.1:8000", "10.0.0.2:8000")  # tokenizing goes to a host itself
    written = write_upstreams([upstream], tmp_path / "out")
    assert [p.name for p in written] == ["hosttune-prod.conf", "hosttune-router-prod.service", "prefix_router.py",
                                         "prefix_table.py"]
    unit = written[1].read_text()
    argv = shlex.split(unit.split("ExecStart=")[1].split("\n")[0])
    assert argv[:5] == ["/opt/hosttune/router/bin/python", "/opt/hosttune/router/prefix_router.py", "--worker-urls",
                        "http://10.0.0.1:8000", "http://10.0.0.2:8000"]
    flags = dict(zip(argv[5::2], argv[6::2]))
    assert flags["--host"] == "127.0.0.1" and flags["--port"] == "9080" and flags["--policy"] == "prefix_affinity"
    assert flags["--prometheus-port"] == "9081" and flags["--health-check-endpoint"] == "/health"
    assert ("pip install 'aiohttp>=3.9' && cp prefix_router.py prefix_table.py /opt/hosttune/router/" in unit)
    assert written[2].read_text() == resources.files("hosttune.deploy").joinpath("prefix_router.py").read_text()
    conf = written[0].read_text()
    assert "location ~ ^/(add_worker|remove_worker|list_workers" in conf and "return 404;" in conf


@pytest.mark.parametrize("deploy, option", [("router: true\nlb_port: 64535\n", None), ("lb_port: 65000\n", True)])
def test_a_group_router_past_the_last_port_is_refused_before_any_host_changes(tmp_path, deploy, option):
    """The group's router listens on lb_port + 1000 and its /metrics one above, on the balancing machine."""
    inv = _inventory(tmp_path, deploy)
    lb_port = int(deploy.split("lb_port: ")[1].split("\n")[0])
    with pytest.raises(DeployError, match=f"deploy.lb_port {lb_port}: group prod's prefix router would listen on "
                                          f"{lb_port + 1000} and {lb_port + 1001}, past 65535; give a lb_port of 64534 "
                                          "or less, or --no-router"):
        check_balancers(inv, None, option)
    check_balancers(inv, None, False)  # least_conn: nginx alone, on lb_port
    check_balancers(_inventory(tmp_path, "router: true\nlb_port: 64534\n"))


@pytest.mark.parametrize("deploy, option", [("router: true\n", False), ("{}\n", None), ("router: false\n", None)])
def test_a_group_keeps_least_conn_without_the_router(tmp_path, deploy, option):
    inv = _inventory(tmp_path, deploy)
    (upstream,) = upstreams(inv, _deployed(inv), option)
    assert upstream.backends == ("10.0.0.1:8000", "10.0.0.2:8000")
    assert [p.name for p in write_upstreams([upstream], tmp_path / "out")] == ["hosttune-prod.conf"]


def test_a_tls_group_keeps_least_conn_even_with_the_router(tmp_path):
    inv = _inventory(tmp_path, _tls(*_fake_certs(tmp_path), extra="router: true\n"))
    (upstream,) = upstreams(inv, _deployed(inv), True)
    assert upstream.backends == ("10.0.0.1:9443", "10.0.0.2:9443") and upstream.backend_scheme == "https"


@needs_nginx
def test_nginx_accepts_the_balancer_in_front_of_the_group_router(tmp_path):
    inv = _inventory(tmp_path, "router: true\n")
    (upstream,) = upstreams(inv, _deployed(inv))
    result = _nginx_t(tmp_path, render_nginx(upstream))
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("deploy, line", [
    ("port: 8100\n", "balancer: {dir}/hosttune-prod.conf: nginx least_conn over gpu-a, gpu-b (10.0.0.1:8100, "
                     "10.0.0.2:8100) on port 80"),
    ("port: 8100\nreplicas: 2\nrouter: true\n", "balancer: {dir}/hosttune-prod.conf: nginx least_conn over gpu-a, gpu-b "
     "(10.0.0.1:8100, 10.0.0.2:8100) on port 80, through the group's prefix router on 127.0.0.1:1080 "
     "(hosttune-router-prod.service and its scripts beside it)"),
])
def test_a_dry_run_names_the_group_balancer_the_run_would_write_and_writes_none(tmp_path, monkeypatch, deploy, line):
    from typer.testing import CliRunner

    from hosttune.cli import app
    from hosttune.cli import deploy as deploy_cli
    from hosttune.fleet_runner import Outcome

    inventory = group_inventory(tmp_path, deploy)
    inv = load_inventory(inventory)
    monkeypatch.setattr(deploy_cli, "deploy_fleet", lambda inventory, request, **kw: [
        HostDeploy(h, Outcome.PLANNED, "custom-1", None, ops=("start hosttune-serve.service",)) for h in inv.hosts])
    folder = tmp_path / "lb"
    result = CliRunner().invoke(app, ["deploy", "-i", str(inventory), "--engine", "custom", "--model", "/m", "--dry-run",
                                      "--nginx-dir", str(folder)])
    assert result.exit_code == 0, result.output
    assert line.format(dir=folder) in result.output.splitlines() and not folder.exists()


def test_a_balancer_that_cannot_be_written_after_the_deploy_says_what_was_deployed_and_what_is_left(tmp_path, monkeypatch):
    """The hosts serve the new release by then: one line says so and how to write the balancer (deploy again, with
    every host unchanged, writes it), where it was an internal error; no half-written or temporary file is left."""
    from typer.testing import CliRunner

    from hosttune.cli import app
    from hosttune.cli import deploy as deploy_cli

    inventory = group_inventory(tmp_path, "port: 8100\n")
    inv = load_inventory(inventory)
    states = iter([Outcome.PLANNED, Outcome.DEPLOYED, Outcome.UNCHANGED])
    monkeypatch.setattr(deploy_cli, "deploy_fleet", lambda inventory, request, **kw: (lambda state: [
        HostDeploy(h, state, "custom-1", None if state is Outcome.PLANNED else "custom-1") for h in inv.hosts])(
        next(states)))
    folder = tmp_path / "lb"
    (folder / "hosttune-prod.conf").mkdir(parents=True)  # what nginx reads cannot be replaced
    args = ["deploy", "-i", str(inventory), "--engine", "custom", "--model", "/m", "--yes", "--nginx-dir", str(folder)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2
    assert result.output.splitlines()[-1] == (
        f"hosttune: deployed to gpu-a, gpu-b, but the group balancer was not written ({folder}/hosttune-prod.conf: "
        f"Is a directory): it still sends where it did before; once {folder} takes it, deploy again: with every host "
        f"unchanged it writes the balancer alone")
    assert sorted(p.name for p in folder.iterdir()) == ["hosttune-prod.conf"]
    (folder / "hosttune-prod.conf").rmdir()
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "10.0.0.1:8100" in (folder / "hosttune-prod.conf").read_text()
