"""Deploy's keys and front as data: a key per group (generated once, or from a file), the key file's
operations, units that name the key file but never hold the key, SGLang's launcher keeping the key out of
its command line, the engine on 127.0.0.1 behind the host's nginx, and nginx configs that `nginx -t` takes."""

from __future__ import annotations

import hashlib
import json
import re
import os
import ssl
import shutil
import stat
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from hosttune.fleet_runner import Outcome
from hosttune.deploy import rollout
from hosttune.deploy.access import Access, Front, _LAUNCHER, access_for, launched_with_key
from hosttune.deploy.errors import DeployError
from hosttune.deploy.host import HostDeploy, deploy_one
from hosttune.deploy.rollback import rollback_one
from hosttune.deploy.front import NGINX_CONF, front_ops, front_upstream, key_ops, tls_ops
from hosttune.actions.base import Command, FileWrite, describe
from hosttune.deploy.recap import render
from hosttune.deploy.settings import ServeSettings
from hosttune.deploy.shape import Shape
from hosttune.deploy.rolling import indices
from hosttune.deploy.units import REPLICA_TEMPLATE, Upstream, render_nginx, replica_unit
from hosttune.config.inventory import load_inventory
from hosttune.presets import load_preset

from deploy_fixtures import ScriptedTransport, a100_facts, fake_entry, group_inventory, tls_pair

KEY = "ht-inventory-key-3b8f0e6a91d2c457"


def _hosts(tmp_path: Path, deploy: str):
    return load_inventory(group_inventory(tmp_path, deploy)).hosts


def test_a_generated_key_is_made_once_per_group_mode_0600_and_reused(tmp_path):
    a, b = _hosts(tmp_path, "api_key: true\n")
    keys = tmp_path / "keys"
    first = access_for(a, keys)
    assert first.key.startswith("ht-") and len(first.key) > 40
    assert access_for(b, keys).key == first.key == access_for(a, keys).key
    assert stat.S_IMODE((keys / "prod.key").stat().st_mode) == 0o600
    assert stat.S_IMODE(keys.stat().st_mode) == 0o700
    assert first.env_file == "/etc/hosttune/keys/prod.env" and first.key not in repr(first)


def test_a_key_file_relative_to_the_inventory(tmp_path):
    (tmp_path / "secrets").mkdir()
    (tmp_path / "secrets" / "prod.key").write_text(f"# prod's key\n{KEY}\n")
    (a, _) = _hosts(tmp_path, "api_key_file: secrets/prod.key\n")
    assert access_for(a, tmp_path / "unused").key == KEY
    assert not (tmp_path / "unused").exists()


@pytest.mark.parametrize("content,message", [
    ("short\n", "at least 16"), ("two words key-0123456789\n", "without spaces"), (f"{KEY}\n{KEY}x\n", "one line")])
def test_a_bad_key_file_is_one_clear_error(tmp_path, content, message):
    (tmp_path / "k").write_text(content)
    (a, _) = _hosts(tmp_path, "api_key_file: k\n")
    with pytest.raises(DeployError, match=message):
        access_for(a, tmp_path)


def test_a_key_file_that_cannot_be_read_names_the_inventory_line_and_the_path_it_tried(tmp_path):
    (a, _) = _hosts(tmp_path, "api_key_file: keys/missing.key\n")
    with pytest.raises(DeployError) as err:
        access_for(a, tmp_path)
    assert re.fullmatch(rf"{re.escape(str(tmp_path))}/\S+\.yaml:\d+: deploy\.api_key_file: cannot read the API key "
                        rf"file {re.escape(str(tmp_path / 'keys/missing.key'))}: No such file or directory", str(err.value))


def _bad_tls(tmp_path: Path, case: str) -> str:
    cert, key = tls_pair(tmp_path / "good")
    other_cert, other_key = tls_pair(tmp_path / "other")
    (tmp_path / "junk.pem").write_text("not a certificate\n")
    locked = tmp_path / "locked.pem"
    from cryptography.hazmat.primitives import serialization
    locked.write_bytes(serialization.load_pem_private_key(key.read_bytes(), None).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.BestAvailableEncryption(b"pw")))
    return {"cert junk": f"tls_cert: {tmp_path / 'junk.pem'}, tls_key: {key}",
            "key junk": f"tls_cert: {cert}, tls_key: {tmp_path / 'junk.pem'}",
            "key of another": f"tls_cert: {cert}, tls_key: {other_key}",
            "key encrypted": f"tls_cert: {cert}, tls_key: {locked}",
            "cert a folder": f"tls_cert: {tmp_path}, tls_key: {key}",
            "ca junk": f"tls_cert: {cert}, tls_key: {key}, tls_ca: {tmp_path / 'junk.pem'}",
            }[case]


def test_an_expired_certificate_is_refused_before_anything_is_sent(tmp_path):
    cert, key = tls_pair(tmp_path, days=-0.5)
    (a, _) = _hosts(tmp_path, f"nginx: {{tls_cert: {cert}, tls_key: {key}}}\n")
    with pytest.raises(DeployError) as err:
        access_for(a, tmp_path)
    assert re.fullmatch(rf"\S+\.yaml:\d+: deploy\.nginx\.tls_cert: {re.escape(str(cert))} expired on "
                        r"\d{4}-\d\d-\d\d \d\d:\d\d UTC; renew it", str(err.value)), str(err.value)


@pytest.mark.parametrize("case, message", [
    ("cert junk", "deploy.nginx.tls_cert: {tmp}/junk.pem holds no PEM certificate"),
    ("key junk", "deploy.nginx.tls_key: {tmp}/junk.pem is not a PEM private key"),
    ("key of another", "deploy.nginx.tls_key: {tmp}/other/key.pem is not the private key of {tmp}/good/cert.pem"),
    ("key encrypted", "deploy.nginx.tls_key: {tmp}/locked.pem is encrypted; nginx reads an unencrypted key"),
    ("cert a folder", "deploy.nginx.tls_cert: {tmp} is not a file"),
    ("ca junk", "deploy.nginx.tls_ca: {tmp}/junk.pem holds no PEM certificate"),
])
def test_tls_files_nginx_could_not_load_are_refused_before_anything_is_sent(tmp_path, case, message):
    (a, _) = _hosts(tmp_path, f"nginx: {{{_bad_tls(tmp_path, case)}}}\n")
    with pytest.raises(DeployError) as err:
        access_for(a, tmp_path)
    assert re.fullmatch(r"\S+\.yaml:\d+: " + re.escape(message.format(tmp=tmp_path)), str(err.value)), str(err.value)


def _signed_pair(folder: Path, ca_name: str = "test CA") -> tuple[Path, Path, Path]:
    """A CA, and a certificate for serve.test it signed with its key: (ca.pem, cert.pem, key.pem) in `folder`."""
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.timezone.utc)

    def cert(subject: str, key, issuer: str, signer, extensions):
        builder = (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
                   .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, issuer)])).public_key(key.public_key())
                   .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(days=1))
                   .not_valid_after(now + datetime.timedelta(days=1)))
        for extension in extensions:
            builder = builder.add_extension(extension, critical=False)
        return builder.sign(signer, hashes.SHA256()).public_bytes(serialization.Encoding.PEM)

    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "ca.pem").write_bytes(cert(ca_name, ca_key, ca_name, ca_key, [x509.BasicConstraints(True, None)]))
    (folder / "cert.pem").write_bytes(cert("serve.test", key, ca_name, ca_key,
                                           [x509.SubjectAlternativeName([x509.DNSName("serve.test")])]))
    (folder / "key.pem").write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                       serialization.NoEncryption()))
    return folder / "ca.pem", folder / "cert.pem", folder / "key.pem"


def test_a_ca_and_name_the_hosts_certificate_passes_are_taken(tmp_path):
    ca, cert, key = _signed_pair(tmp_path / "signed")
    for name in ("serve.test", "SERVE.test"):
        (a, _) = _hosts(tmp_path, f"nginx: {{tls_cert: {cert}, tls_key: {key}, tls_ca: {ca}, tls_name: {name}}}\n")
        assert access_for(a, tmp_path).front.tls.ca == ca
    self_signed, own_key = tls_pair(tmp_path / "own")  # its own CA, as nginx trusts it
    (a, _) = _hosts(tmp_path, f"nginx: {{tls_cert: {self_signed}, tls_key: {own_key}, tls_ca: {self_signed}}}\n")
    assert access_for(a, tmp_path).front.tls.ca == self_signed


@pytest.mark.parametrize("case, message", [
    ("another ca", "deploy.nginx.tls_ca: {ca2} did not sign {cert} (nor a certificate of its chain), so the group "
                   "balancer would refuse every host (and the canary bench every canary)"),
    ("another name", "deploy.nginx.tls_name: {cert} is not for 'api.test' (it names serve.test), so the group "
                     "balancer would refuse every host"),
])
def test_a_ca_or_name_the_hosts_certificate_fails_is_refused_before_anything_is_sent(tmp_path, case, message):
    """The balancer verifies each host's certificate against tls_ca for tls_name (proxy_ssl_verify)."""
    ca, cert, key = _signed_pair(tmp_path / "signed")
    ca2, _, _ = _signed_pair(tmp_path / "other", ca_name="test CA")  # the same name, another key
    ca_used, name = (ca2, "serve.test") if case == "another ca" else (ca, "api.test")
    (a, _) = _hosts(tmp_path, f"nginx: {{tls_cert: {cert}, tls_key: {key}, tls_ca: {ca_used}, tls_name: {name}}}\n")
    with pytest.raises(DeployError) as err:
        access_for(a, tmp_path)
    assert re.fullmatch(r"\S+\.yaml:\d+: " + re.escape(message.format(ca2=ca2, cert=cert)), str(err.value)), str(err.value)


def test_no_key_by_default_and_bad_values_are_refused(tmp_path):
    (a, _) = _hosts(tmp_path, "port: 8000\n")
    assert access_for(a, tmp_path) == Access("prod")
    for deploy, message in (("api_key: yes-please\n", "true or false"), ("nginx: {tls_cert: c.pem}\n", "both"),
                            ("nginx: {port: 0}\n", "port number"), ("nginx: {listen: 80}\n", "takes port"),
                            ("api_key_file: missing.key\n", "cannot read")):
        (a, _) = _hosts(tmp_path, deploy)
        with pytest.raises(DeployError, match=message):
            access_for(a, tmp_path)


def test_key_file_operations_write_the_engines_variable_root_only(tmp_path):
    access = Access("prod", KEY)
    ops = key_ops(access, load_preset("vllm"))
    write = ops[0]
    assert isinstance(write, FileWrite) and write.path == "/etc/hosttune/keys/prod.env" and write.mode == 0o600
    assert write.content == f"VLLM_API_KEY={KEY}\n".encode()
    assert [op.argv for op in ops[1:]] == [("chown", "root:root", "--", "/etc/hosttune/keys", write.path),
                                           ("chmod", "0700", "--", "/etc/hosttune/keys"),
                                           ("chmod", "0600", "--", write.path)]
    assert all(KEY not in describe(op) for op in ops)  # what a plan or a failure prints
    assert key_ops(Access("prod"), load_preset("vllm")) == []


def _job(tmp_path, engine: str, deploy: str, gpus: str = "0"):
    (a, _) = _hosts(tmp_path, deploy)
    fake_entry(tmp_path / "wh", engine, archs=("8.0",) if engine != "custom" else ())
    request = rollout.DeployRequest(engine, "/m", tmp_path / "wh", gpus, keys_dir=tmp_path / "keys")
    return rollout.make_job(a, a100_facts(), request)


@pytest.mark.parametrize("engine,variable", [("custom", "HOSTTUNE_ENGINE_API_KEY"), ("vllm", "VLLM_API_KEY"),
                                             ("sglang", "SGLANG_API_KEY")])
def test_units_name_the_key_file_and_never_hold_the_key(tmp_path, engine, variable):
    job = _job(tmp_path, engine, "api_key: true\nnginx: {port: 8080}\n")
    key = job.access.key
    unit = job.release.units["hosttune-serve.service"].decode()
    assert "EnvironmentFile=/etc/hosttune/keys/prod.env\n" in unit and key not in unit
    assert key not in job.release.manifest().decode()
    assert job.release.settings["api_key"] == {"file": "/etc/hosttune/keys/prod.env",
                                               "fingerprint": job.access.fingerprint}
    assert job.settings.flags["host"] == "127.0.0.1"  # behind nginx
    assert key_ops(job.access, job.preset)[0].content == f"{variable}={key}\n".encode()
    if engine == "sglang":
        exec_start = next(line for line in unit.splitlines() if line.startswith("ExecStart="))
        assert "runpy.run_module" in exec_start and "SGLANG_API_KEY api-key sglang.launch_server" in exec_start
        assert "--api-key" not in exec_start


def test_a_new_key_is_a_new_release(tmp_path):
    (tmp_path / "k").write_text(KEY + "\n")
    first = _job(tmp_path / "a", "vllm", f"api_key_file: {tmp_path / 'k'}\n").release.id
    (tmp_path / "k").write_text(KEY + "-rotated\n")
    second = _job(tmp_path / "b", "vllm", f"api_key_file: {tmp_path / 'k'}\n").release.id
    unkeyed = _job(tmp_path / "c", "vllm", "port: 8000\n")
    assert first != second and "api_key" not in unkeyed.release.settings
    assert "EnvironmentFile" not in unkeyed.release.units["hosttune-serve.service"].decode()
    assert unkeyed.settings.flags["host"] == "0.0.0.0"


def test_the_launcher_adds_the_key_to_argv_but_not_to_the_command_line(tmp_path):
    (tmp_path / "fakeengine.py").write_text(
        "import sys\n"
        "print(sys.argv[1:])\n"
        "print(open('/proc/self/cmdline', 'rb').read().replace(b'\\0', b' ').decode())\n")
    argv = launched_with_key((sys.executable, "-m", "fakeengine", "--port", "1"), "SGLANG_API_KEY", "api-key")
    assert argv[:3] == (sys.executable, "-c", _LAUNCHER)
    out = subprocess.run(argv, capture_output=True, text=True, cwd=tmp_path, check=True, timeout=60,
                         env={**os.environ, "SGLANG_API_KEY": KEY, "PYTHONPATH": str(tmp_path)}).stdout
    parsed, cmdline = out.splitlines()
    assert parsed == str(["--port", "1", "--api-key", KEY])
    assert KEY not in cmdline and "fakeengine --port 1" in cmdline
    with pytest.raises(DeployError, match="python -m MODULE"):
        launched_with_key(("/venv/bin/sglang", "serve"), "SGLANG_API_KEY", "api-key")


def test_front_operations_upload_tls_check_nginx_then_reload(tmp_path):
    cert, key = tls_pair(tmp_path)
    (a, _) = _hosts(tmp_path, f"nginx: {{tls_cert: {cert}, tls_key: {key}}}\n")
    access = access_for(a, tmp_path)
    assert access.front.port == 443
    ops = front_ops(access, "custom", (8000,))
    writes = {op.path: op for op in ops if isinstance(op, FileWrite)}
    assert writes["/etc/hosttune/tls/prod.crt"].content == cert.read_bytes() and writes["/etc/hosttune/tls/prod.key"].mode == 0o600
    conf = writes[NGINX_CONF + ".new"].content.decode()
    assert "listen 443 ssl default_server;" in conf and "ssl_certificate /etc/hosttune/tls/prod.crt;" in conf
    assert "server 127.0.0.1:8000 " in conf and "keepalive 64;" in conf and "keepalive_timeout 60s;" in conf
    runs = [op.argv for op in ops if isinstance(op, Command)]
    assert runs[-3][:2] == ("sh", "-c") and runs[-3][-1] == "/etc/nginx/conf.d/hosttune-local.conf"
    assert runs[-2:] == [("systemctl", "enable", "--quiet", "nginx"), ("systemctl", "reload-or-restart", "nginx")]
    assert front_ops(Access("prod"), "custom", (8000,)) == []


def _self_signed(folder: Path) -> tuple[Path, Path]:
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                    "-keyout", str(folder / "key.pem"), "-out", str(folder / "cert.pem"), "-days", "1",
                    "-subj", "/CN=localhost"], check=True, capture_output=True, timeout=60)
    return folder / "cert.pem", folder / "key.pem"


@pytest.mark.skipif(shutil.which("nginx") is None or shutil.which("openssl") is None, reason="needs nginx and openssl")
@pytest.mark.parametrize("tls", [False, True])
def test_nginx_accepts_the_rendered_front(tmp_path, tls):
    cert, key = _self_signed(tmp_path) if tls else (None, None)
    upstream = Upstream("prod", "custom", ("127.0.0.1:8000",), 8443 if tls else 8080,
                        tls_cert=str(cert) if tls else None, tls_key=str(key) if tls else None, default_server=True)
    (tmp_path / "front.conf").write_bytes(render_nginx(upstream))
    (tmp_path / "nginx.conf").write_text(
        f"pid {tmp_path}/nginx.pid;\nerror_log {tmp_path}/error.log;\nevents {{}}\n"
        f"http {{\n    access_log off;\n    include {tmp_path}/front.conf;\n}}\n")
    result = subprocess.run(["nginx", "-t", "-p", str(tmp_path), "-c", str(tmp_path / "nginx.conf")],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("engine, live, fallback", [
    ("custom", "", "the service is stopped and disabled"),
    ("vllm", "current:/opt/hosttune/releases/vllm-0123456789ab\n", "the release live before comes back")])
def test_a_dry_run_of_one_service_shows_the_flag_check_and_the_gate_where_the_run_does_them(tmp_path, engine, live,
                                                                                             fallback):
    job = _job(tmp_path, engine, "nginx: {port: 8080}\n")
    t = ScriptedTransport("gpu-a", [], state="nginx:/usr/sbin/nginx\n" + live)
    before = _job(tmp_path / "before", engine, "port: 8000\n").release
    t.files[f"/opt/hosttune/releases/vllm-0123456789ab/.hosttune/release.json"] = before.manifest()
    t.files.update({f"/opt/hosttune/releases/vllm-0123456789ab/.hosttune/{n}": body for n, body in before.units.items()})
    outcome = deploy_one(t, job, dry_run=True)
    ops = list(outcome.ops)
    at = {what: next(i for i, op in enumerate(ops) if op.startswith(what)) for what in
          ("$ systemd-analyze verify", "check the engine's flags", "$ systemctl restart hosttune-serve.service",
           "gate hosttune-serve.service", f"write {NGINX_CONF}.new")}
    assert list(at.values()) == sorted(at.values()), ops  # after the install, before the switch; the front last
    assert ops[at["gate hosttune-serve.service"]] == (
        "gate hosttune-serve.service: /health within 600 s, 3 warmup requests, a one-token generation within 60 s; "
        f"on failure {fallback}")
    assert ops[at["check the engine's flags"]].endswith("` (before anything live changes)")
    if live:  # its release.json gone: a failed gate cannot put it back, and the plan says so
        t.files.clear()
        unreadable = deploy_one(t, job, dry_run=True)
        assert any(line.endswith("on failure the release live before cannot come back, its release.json unreadable")
                   for line in unreadable.ops), unreadable.ops


@pytest.mark.parametrize("engine, deploy, gpus, message", [
    ("vllm", "port: 8080\nnginx: {port: 8080}\n", "0",
     "port 8080 would be taken twice: by the engine and by the host's nginx (deploy.nginx.port)"),
    ("custom", "port: 8080\nreplicas: 2\nnginx: {port: 8081}\n", "0-1",
     "port 8081 would be taken twice: by replica 0 and by the host's nginx (deploy.nginx.port)"),
    ("custom", "port: 8080\nreplicas: 2\nrouter: true\nnginx: {port: 8084}\n", "0-1",
     "port 8084 would be taken twice: by the host's nginx (deploy.nginx.port) and by the prefix router's /metrics"),
])
def test_a_front_on_a_port_the_engine_or_its_replicas_take_is_refused_before_anything_is_sent(tmp_path, engine, deploy,
                                                                                               gpus, message):
    with pytest.raises(DeployError) as err:
        _job(tmp_path, engine, deploy, gpus=gpus)
    assert str(err.value) == f"gpu-a: {message}; give deploy.nginx.port or --port another port"


def test_a_front_on_its_own_port_is_planned(tmp_path):
    job = _job(tmp_path, "custom", "port: 8080\nreplicas: 2\nrouter: true\nnginx: {port: 8443}\n", gpus="0-1")
    assert job.access.front.port == 8443 and len(job.layout.replicas) == 2


@pytest.mark.parametrize("deploy, sets, gpus, where", [
    ("nginx: {port: 8080}\nvllm: {host: 0.0.0.0}\n", (), "0", "deploy.vllm.host"),
    ("nginx: {port: 8080}\n", ("host=0.0.0.0",), "0", "--set host"),
    ("replicas: 2\n", ("host=10.0.0.1",), "0-1", "--set host"),
])
def test_an_engine_host_flag_behind_the_hosts_nginx_is_refused_not_overridden(tmp_path, deploy, sets, gpus, where):
    from hosttune.deploy.settings import parse_sets

    (a, _) = _hosts(tmp_path, deploy)
    fake_entry(tmp_path / "wh", "vllm")
    request = rollout.DeployRequest("vllm", "/m", tmp_path / "wh", gpus, keys_dir=tmp_path / "keys",
                                    overrides=parse_sets(list(sets)))
    with pytest.raises(DeployError) as err:
        rollout.make_job(a, a100_facts(), request)
    assert where in str(err.value) and str(err.value).endswith(
        "behind the host's nginx (deploy.nginx, or several replicas) the engine listens on 127.0.0.1 only, so "
        "callers cannot go around the front: drop it")
    (a, _) = _hosts(tmp_path / "ok", deploy.replace("0.0.0.0", "127.0.0.1"))
    assert rollout.make_job(a, a100_facts(), replace(request, overrides=parse_sets(["host=127.0.0.1"]))).settings


def test_the_front_upstream_is_the_hosts_replicas_on_loopback():
    up = front_upstream(Access("prod", None, Front(80)), "vllm", (8000, 8001))
    assert up.backends == ("127.0.0.1:8000", "127.0.0.1:8001") and up.listen == 80 and up.tls_cert is None


def _tls_files(tmp_path: Path) -> str:
    cert, key = tls_pair(tmp_path)
    return f"nginx: {{tls_cert: {cert}, tls_key: {key}}}\n"


def test_keyed_replicas_read_the_key_file_behind_the_hosts_one_tls_front(tmp_path):
    job = _job(tmp_path, "sglang", "api_key: true\n" + _tls_files(tmp_path), gpus="0-1")
    release, key = job.release, job.access.key
    assert len(release.replicas) == 2 and release.key_file == "/etc/hosttune/keys/prod.env"
    unit = release.units[REPLICA_TEMPLATE].decode()
    assert (f"EnvironmentFile={release.dir}/.hosttune/replica-%i.env\n"
            "EnvironmentFile=/etc/hosttune/keys/prod.env\n") in unit
    exec_start = next(line for line in unit.splitlines() if line.startswith("ExecStart="))
    assert "SGLANG_API_KEY api-key sglang.launch_server" in exec_start and "--host 127.0.0.1" in exec_start
    everything = b"".join([*release.units.values(), *release.meta.values(), *release.files.values(), release.manifest()])
    assert key.encode() not in everything
    assert json.loads(release.meta["replicas.json"])["key_file"] == release.key_file  # the probe sends it
    assert [p for p in release.files if p.startswith("/etc/nginx/")] == [NGINX_CONF]  # one nginx per host
    conf = release.files[NGINX_CONF].decode()
    for line in ("listen 443 ssl default_server;", "ssl_certificate /etc/hosttune/tls/prod.crt;",
                 "include /etc/hosttune/nginx/local-servers.conf;", "keepalive 64;", "non_idempotent;"):
        assert line in conf


def test_a_keyed_replica_deploy_writes_key_and_tls_before_the_roll_and_gates_with_the_key(tmp_path):
    job = _job(tmp_path, "custom", "api_key: true\n" + _tls_files(tmp_path), gpus="0-1")
    log: list = []
    outcome = deploy_one(ScriptedTransport("gpu-a", log, state="nginx:/usr/sbin/nginx\n"), job)
    assert outcome.state == "deployed", outcome.error
    first_lb = next(i for i, (_, a) in enumerate(log) if a[0] == "python3" and a[1].endswith("replica_lb.py"))
    written = [a[5] for _, a in log[:first_lb] if a[:2] == ("sh", "-c") and a[4] == "write"]
    assert [p for p in written if p.startswith("/etc/hosttune/")][:3] == [
        "/etc/hosttune/keys/prod.env", "/etc/hosttune/tls/prod.crt", "/etc/hosttune/tls/prod.key"]
    gates = [json.loads(a[3]) for _, a in log if a[:2] == ("python3", "-c") and "UNKNOWN" not in a[2]]
    assert [(g["port"], g["key_file"]) for g in gates] == [(8001, "/etc/hosttune/keys/prod.env"),
                                                          (8002, "/etc/hosttune/keys/prod.env")]
    assert all(job.access.key not in " ".join(a) for _, a in log)  # the key only in the key file's content


def test_a_deploy_that_drops_the_front_of_one_service_removes_it_once_the_new_release_serves(tmp_path):
    """The plan says it removes the host's nginx front (shape.Guard.removals): the run removes hosttune-local.conf and
    reloads nginx after the new release's gate, where it left nginx on the old port in front of the engine."""
    job = _job(tmp_path, "custom", "port: 8000\n")  # the inventory's nginx front is gone
    assert job.access.front is None
    state = ("current:/opt/hosttune/releases/custom-old\nunit:hosttune-serve.service abc active\n"
             "nginx:/usr/sbin/nginx\nnginx-listen:8080\n")  # the live release behind a front on 8080
    planned = deploy_one(ScriptedTransport("gpu-a", [], state=state), job, dry_run=True)
    assert planned.state == "planned", planned.error
    assert planned.ops[-2:] == (f"remove {NGINX_CONF}", "$ systemctl try-reload-or-restart nginx.service")
    log: list = []
    outcome = deploy_one(ScriptedTransport("gpu-a", log, state=state), job)
    assert outcome.state == "deployed", outcome.error
    argvs = [a for _, a in log]
    gate = next(i for i, a in enumerate(argvs) if a[:2] == ("python3", "-c") and "UNKNOWN" not in a[2])
    removed = next(i for i, a in enumerate(argvs) if a[:2] == ("sh", "-c") and a[4] == "remove" and a[5] == NGINX_CONF)
    assert gate < removed and argvs[-1] == ("systemctl", "try-reload-or-restart", "nginx.service")
    without = deploy_one(ScriptedTransport("gpu-a", [], state=state.replace("nginx-listen:8080\n", "")), job, dry_run=True)
    assert not any(NGINX_CONF in line for line in without.ops)  # no front of this deployment's there: nothing to remove


def test_rolling_back_from_replicas_to_a_fronted_service_puts_its_front_back(tmp_path):
    previous = _job(tmp_path, "custom", "api_key: true\nnginx: {port: 8080}\n").release
    (host, _) = _hosts(tmp_path, "api_key: true\nnginx: {port: 8080}\n")
    state = (f"current:/opt/hosttune/releases/custom-replicas\nprevious:{previous.dir}\n"
             "instance:hosttune-engine@0.service active\ninstance:hosttune-engine@1.service active\n")
    log: list = []
    t = ScriptedTransport("gpu-a", log, state=state)
    t.files[f"{previous.dir}/.hosttune/release.json"] = previous.manifest()
    for name, body in previous.units.items():
        t.files[f"{previous.dir}/.hosttune/{name}"] = body
    outcome = rollback_one(t, host, ServeSettings("", "", 1, {}, {}))
    assert outcome.state == "rolled-back", outcome.error
    argvs = [a for _, a in log]
    gate = next(json.loads(a[3]) for a in argvs if a[:2] == ("python3", "-c") and "UNKNOWN" not in a[2])
    assert gate["key_file"] == "/etc/hosttune/keys/prod.env" and gate["port"] == 8000
    removed = next(i for i, a in enumerate(argvs) if a[:2] == ("sh", "-c") and a[4] == "remove" and a[5] == NGINX_CONF)
    written = next(i for i, a in enumerate(argvs) if a[:2] == ("sh", "-c") and a[4] == "write" and a[5] == NGINX_CONF + ".new")
    assert removed < written and argvs[-1] == ("systemctl", "reload-or-restart", "nginx")


def _rollback_host(tmp_path, previous, deploy: str, state: str):
    """A host where `previous` is the release before the live one; its inventory's deploy: vars are `deploy`."""
    (host, _) = _hosts(tmp_path / "now", deploy)
    log: list = []
    t = ScriptedTransport("gpu-a", log, state=f"current:/opt/hosttune/releases/custom-now\nprevious:{previous.dir}\n{state}")
    t.files[f"{previous.dir}/.hosttune/release.json"] = previous.manifest()
    for name, body in previous.units.items():
        t.files[f"{previous.dir}/.hosttune/{name}"] = body
    return host, t, log


def test_rolling_back_to_a_fronted_service_from_one_without_its_front_puts_the_front_back(tmp_path):
    """The release left took the front away (a deploy without nginx:): the one rolled back to listens on the loopback
    behind it, so its front comes back once it passed its gate, where it served the loopback alone."""
    previous = _job(tmp_path, "custom", "api_key: true\nnginx: {port: 8080}\n").release
    host, t, log = _rollback_host(tmp_path, previous, "api_key: true\nnginx: {port: 8080}\n",
                                  "unit:hosttune-serve.service abc active\nnginx:/usr/sbin/nginx\n")
    planned = rollback_one(t, host, ServeSettings("", "", 1, {}, {}), dry_run=True)
    assert any(line == f"write {NGINX_CONF}.new" or line.startswith(f"write {NGINX_CONF}.new ") for line in planned.ops)
    outcome = rollback_one(t, host, ServeSettings("", "", 1, {}, {}))
    assert outcome.state == "rolled-back", outcome.error
    argvs = [a for _, a in log]
    gate = next(i for i, a in enumerate(argvs) if a[:2] == ("python3", "-c") and "UNKNOWN" not in a[2])
    written = next(i for i, a in enumerate(argvs) if a[:2] == ("sh", "-c") and a[4] == "write" and a[5] == NGINX_CONF + ".new")
    assert gate < written and argvs[-1] == ("systemctl", "reload-or-restart", "nginx")


def test_rolling_back_to_a_fronted_service_whose_front_the_inventory_no_longer_has_is_refused(tmp_path):
    previous = _job(tmp_path, "custom", "nginx: {port: 8080}\n").release
    host, t, log = _rollback_host(tmp_path, previous, "port: 8000\n", "unit:hosttune-serve.service abc active\n")
    with pytest.raises(DeployError, match=r"^gpu-a: release custom-\w+ served behind the host's nginx front on port 8080, "
                                          r"which the inventory's deploy.nginx no longer gives; give it back to roll "
                                          r"back to it$"):
        rollback_one(t, host, ServeSettings("", "", 1, {}, {}), dry_run=True)
    with pytest.raises(DeployError):
        rollback_one(t, host, ServeSettings("", "", 1, {}, {}))
    assert not [a for _, a in log if a[:2] == ("sh", "-c") and a[3:4] == ("hosttune",) and a[4] in ("write", "link", "remove")]


def test_rolling_back_to_a_service_without_a_front_from_a_fronted_one_removes_the_front(tmp_path):
    previous = _job(tmp_path, "custom", "port: 8000\n").release
    host, t, log = _rollback_host(tmp_path, previous, "port: 8000\n", "unit:hosttune-serve.service abc active\n"
                                  "nginx:/usr/sbin/nginx\nnginx-listen:8080\n")
    outcome = rollback_one(t, host, ServeSettings("", "", 1, {}, {}))
    assert outcome.state == "rolled-back", outcome.error
    argvs = [a for _, a in log]
    assert any(a[:2] == ("sh", "-c") and a[4] == "remove" and a[5] == NGINX_CONF for a in argvs)
    assert argvs[-1] == ("systemctl", "try-reload-or-restart", "nginx.service")


class GatesFail(ScriptedTransport):
    """Every gate of a release other than `good` fails."""

    good = current = ""

    def _command(self, argv, stdin, timeout):
        argv = tuple(argv)
        if argv[:2] == ("sh", "-c") and len(argv) > 6 and argv[4] == "link" and argv[5] == "/opt/hosttune/current":
            self.current = argv[6]
        if argv[:2] == ("python3", "-c") and "UNKNOWN" not in argv[2]:
            self.gate_ok = self.current == self.good
        return super()._command(argv, stdin, timeout)


def test_a_fronted_service_put_back_without_the_front_the_inventory_dropped_says_so(tmp_path):
    """Replicas without nginx: over a service behind a front on 8080 fail their gate: the service comes back, but the
    replicas' switch took its front, which the inventory no longer gives: the outcome says it answers on the
    loopback alone, where it read as put back and serving as before."""
    previous = _job(tmp_path / "was", "custom", "port: 8000\nnginx: {port: 8080}\n").release
    job = _job(tmp_path, "custom", "port: 8000\nreplicas: 2\n", gpus="0-1")
    assert job.access.front is None and len(job.release.replicas) == 2
    t = GatesFail("gpu-a", [], state=f"current:{previous.dir}\nunit:hosttune-serve.service abc active\n"
                                     "nginx:/usr/sbin/nginx\nnginx-listen:8080\n")
    t.good = previous.dir
    t.files[f"{previous.dir}/.hosttune/release.json"] = previous.manifest()
    for name, body in previous.units.items():
        t.files[f"{previous.dir}/.hosttune/{name}"] = body
    outcome = deploy_one(t, job)
    assert outcome.state == "failed" and outcome.restored == previous.id and outcome.serving == previous.id
    assert outcome.error.endswith(f"; {previous.id} came back without its nginx front on port 8080, which the "
                                  f"inventory's deploy.nginx gives no more: it answers on the loopback alone")


class FirstGateFails(ScriptedTransport):
    """The first gate fails (the release rolled back to does not come up), every later one passes."""

    def _command(self, argv, stdin, timeout):
        result = super()._command(argv, stdin, timeout)
        if tuple(argv[:2]) == ("python3", "-c") and "UNKNOWN" not in argv[2]:
            self.gate_ok = True
        return result


def test_a_rollback_whose_release_fails_its_gate_puts_back_the_release_it_left(tmp_path):
    older = _job(tmp_path / "p", "vllm", "port: 8000\n").release
    live = _job(tmp_path / "c", "vllm", "port: 8000\nvllm: {max-num-seqs: 8}\n").release
    (host, _) = _hosts(tmp_path, "port: 8000\n")
    log: list = []
    t = FirstGateFails("gpu-a", log, gate_ok=False, state=f"current:{live.dir}\nprevious:{older.dir}\n")
    for release in (older, live):
        t.files[f"{release.dir}/.hosttune/release.json"] = release.manifest()
        t.files.update({f"{release.dir}/.hosttune/{name}": body for name, body in release.units.items()})
    outcome = rollback_one(t, host, ServeSettings("", "", 1, {}, {}))
    assert outcome.state == "failed" and outcome.serving == live.id and outcome.restored == live.id, outcome
    assert outcome.error.startswith("gate failed at health: boom") and outcome.journal
    links = {a[5]: a[6] for _, a in log if a[:2] == ("sh", "-c") and a[4] == "link"}  # the last link of each
    assert links == {"/opt/hosttune/current": live.dir, "/opt/hosttune/previous": older.dir}
    assert f"previous release {live.id} put back and serving" in render([outcome])


def test_a_rollback_dry_run_says_how_the_release_is_gated_and_what_a_failed_gate_brings_back(tmp_path):
    older = _job(tmp_path / "p", "vllm", "port: 8000\n").release
    live = _job(tmp_path / "c", "vllm", "port: 8000\nvllm: {max-num-seqs: 8}\n").release
    (host, _) = _hosts(tmp_path, "port: 8000\n")
    t = ScriptedTransport("gpu-a", [], state=f"current:{live.dir}\nprevious:{older.dir}\n")
    for release in (older, live):
        t.files[f"{release.dir}/.hosttune/release.json"] = release.manifest()
        t.files.update({f"{release.dir}/.hosttune/{name}": body for name, body in release.units.items()})
    outcome = rollback_one(t, host, ServeSettings("", "", 1, {}, {}, health_timeout_s=240), dry_run=True)
    assert outcome.ops == (f"make {older.id} live again in place of {live.id} (the service)",
                           "gate hosttune-serve.service: /health within 240 s, 0 warmup requests, a one-token generation "
                           f"within 60 s; on failure {live.id} comes back")
    del t.files[f"{live.dir}/.hosttune/release.json"]  # what a failed gate would bring back cannot be read
    unreadable = rollback_one(t, host, ServeSettings("", "", 1, {}, {}, health_timeout_s=240), dry_run=True)
    assert unreadable.ops[-1].endswith(f"; on failure {live.id} cannot come back, its release.json unreadable")


def test_the_canary_bench_calls_a_host_as_its_callers_do_with_the_key_through_its_front(tmp_path):
    from hosttune.deploy.canary import target

    (tmp_path / "prod.key").write_text(KEY + "\n")
    ca = tmp_path / "ca.pem"
    ca.write_text("CERT")
    tls = _tls_files(tmp_path).replace("}\n", f", tls_ca: {ca}, tls_name: serve.test}}\n")
    request = rollout.DeployRequest("vllm", "/m", tmp_path, canary=1)
    (fronted, _) = _hosts(tmp_path / "a", f"api_key_file: {tmp_path / 'prod.key'}\n" + tls)
    with pytest.raises(DeployError, match=f"deploy.nginx.tls_ca: {ca} holds no PEM certificate"):
        target(HostDeploy(fronted, Outcome.DEPLOYED, "r", "r"), request)  # "CERT": the CA file is what is trusted
    from hosttune.deploy.canary import CanaryBench, slo_check
    why = slo_check(CanaryBench("e2e=2s"), request)([HostDeploy(fronted, Outcome.DEPLOYED, "r", "r")])
    assert why.startswith("the canary gpu-a cannot be benchmarked: ") and why.endswith(f"{ca} holds no PEM certificate")
    ca.write_bytes((tmp_path / "cert.pem").read_bytes())
    fronted_target = target(HostDeploy(fronted, Outcome.DEPLOYED, "r", "r"), request)
    assert fronted_target.url == "https://10.0.0.1:443" and fronted_target.headers == (("Authorization", f"Bearer {KEY}"),)
    assert fronted_target.tls.verify_mode == ssl.CERT_REQUIRED and not fronted_target.tls.check_hostname  # tls_name
    (plain, _) = _hosts(tmp_path / "b", "port: 8100\n")
    assert target(HostDeploy(plain, Outcome.DEPLOYED, "r", "r"), request) == type(fronted_target)("http://10.0.0.1:8100")


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs openssl")
def test_a_canary_behind_a_tls_front_is_benchmarked_over_https_against_the_deployments_ca(tmp_path):
    from dataclasses import replace

    from hosttune.deploy.canary import CanaryBench, slo_check
    from scripted_server.launch import running

    cert, key = _self_signed(tmp_path)
    with running("--ttft", "0.01", "--itl", "0.001", "--tls-cert", str(cert), "--tls-key", str(key), lifetime=60) as url:
        port = int(url.rsplit(":", 1)[1])
        (host, _) = _hosts(tmp_path, f"nginx: {{port: {port}, tls_cert: {cert}, tls_key: {key}, tls_ca: {cert}}}\n")
        host = replace(host, connection=replace(host.connection, address="localhost"))
        check = slo_check(CanaryBench("ttft=500ms", rate=10, duration="1s", max_tokens="4"),
                          rollout.DeployRequest("custom", "/m", tmp_path, canary=1))
        assert check([HostDeploy(host, Outcome.DEPLOYED, "r", "r")]) is None
    closed = replace(host, deploy={})  # its front is gone: nothing answers the canary's port
    missed = check([HostDeploy(closed, Outcome.DEPLOYED, "r", "r", shape=Shape("custom", "/m", port=port))])
    assert missed.startswith(f"the canary gpu-a cannot be benchmarked: cannot reach http://localhost:{port}")


def test_a_dry_run_makes_no_key_and_an_unwritable_keys_dir_is_one_line(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from hosttune.cli import app

    inventory = group_inventory(tmp_path, "api_key: true\nlb_plain_http: true\n")
    fake_entry(tmp_path / "wh", "vllm")
    monkeypatch.setattr(rollout, "open_transport", lambda spec, **kw: ScriptedTransport(spec.host_name, []))
    monkeypatch.setattr(rollout, "gather", lambda t, **_: type("Run", (), {"facts": a100_facts()})())
    argv = ["deploy", "-i", str(inventory), "--engine", "vllm", "--model", "Qwen/Qwen2.5-7B", "--gpus", "0",
            "-w", str(tmp_path / "wh"),
            "--keys-dir", str(tmp_path / "keys"), "--dry-run"]
    result = CliRunner().invoke(app, argv)
    assert result.exit_code == 0 and "plan: deploy to 2 of 2 hosts" in result.output, result.output
    assert not (tmp_path / "keys").exists()  # made by the first real deploy, not by its plan
    (tmp_path / "file").write_text("")
    (a, _) = _hosts(tmp_path, "api_key: true\n")
    with pytest.raises(DeployError) as refused:
        access_for(a, tmp_path / "file")
    assert str(refused.value) == (f"cannot make the API key file {tmp_path}/file/prod.key ({tmp_path}/file: File exists); "
                                  "pass --keys-dir a folder you can write")


REPLICAS_LIVE = ("current:/opt/hosttune/releases/custom-0123456789ab\ninstance:hosttune-engine@0.service active\n"
                 "instance:hosttune-engine@1.service active\n")


@pytest.mark.parametrize("engine, deploy, gpus, live", [
    ("vllm", "api_key: true\nnginx: {port: 8080}\n", "0", ""),
    ("custom", "api_key: true\n", "0-1", ""),
    ("vllm", "nginx: {port: 8080}\n", "0", REPLICAS_LIVE),  # two replicas live become one service
])
def test_the_run_carries_out_exactly_the_operations_its_dry_run_printed(tmp_path, engine, deploy, gpus, live):
    job = _job(tmp_path, engine, deploy, gpus=gpus)
    state = "nginx:/usr/sbin/nginx\n" + live
    planned = deploy_one(ScriptedTransport("gpu-a", [], state=state), job, dry_run=True)
    done: list = []
    outcome = deploy_one(ScriptedTransport("gpu-a", [], state=state), job, on_op=done.append)
    assert outcome.state == "deployed", outcome.error
    shown = [line for line in planned.ops if not line.startswith(("gate ", "check the engine's flags"))]
    assert [describe(op) for op in done] == shown


def test_rolling_back_a_host_never_deployed_is_nothing_to_do_not_a_failure(tmp_path):
    """A new host of the fleet has nothing to roll back: `deploy --rollback` must not fail the run for it."""
    from hosttune.fleet_runner import exit_code

    (host, _) = _hosts(tmp_path, "port: 8000\n")
    outcome = rollback_one(ScriptedTransport("gpu-a", [], state=""), host, ServeSettings("", "", 1, {}, {}), dry_run=True)
    assert outcome.state == "nothing" and exit_code([outcome]) == 0
    assert outcome.error == "gpu-a: nothing deployed by hosttune here, so nothing to roll back"
    with pytest.raises(DeployError, match=r"^gpu-a: no previous release to go back to \(custom-1 is live\)$"):
        rollback_one(ScriptedTransport("gpu-a", [], state="current:/opt/hosttune/releases/custom-1\n"), host,
                     ServeSettings("", "", 1, {}, {}), dry_run=True)


def _live(job, files: dict[str, bytes]) -> str:
    """The host's state with the job's release live and serving, and these files there."""
    sha = lambda body: hashlib.sha256(body).hexdigest()  # noqa: E731
    return (f"current:{job.release.dir}\ncomplete:yes\nnginx:/usr/sbin/nginx\nnginx-listen:8080\n"
            + "".join(f"unit:{name} {sha(body)} active\n" for name, body in job.release.units.items())
            + "".join(f"wheel:{sha(body)} {path}\n" for path, body in files.items())
            + "".join(f"instance:{replica_unit(i)} active\n" for i in indices(job.release)))


@pytest.mark.parametrize("engine, deploy, gpus", [("vllm", "nginx: {port: 8080}\n", "0"),  # its nginx front again
                                                  ("custom", "nginx: {port: 8080, tls_cert: C, tls_key: K}\n", "0-1")])
def test_an_unchanged_release_plans_the_front_refresh_its_run_does_and_none_where_the_host_has_it(tmp_path, engine,
                                                                                                deploy, gpus):
    """The run of an unchanged release wrote its front (or its replicas' TLS files) again and reloaded nginx, which its
    dry run never showed; now both do it only where the host's files differ, and the plan says so."""
    cert, key = tls_pair(tmp_path)
    job = _job(tmp_path, engine, deploy.replace("C", str(cert)).replace("K", str(key)), gpus=gpus)
    wanted = {op.path.removesuffix(".new"): op.content for op in
              (tls_ops(job.access) if job.release.replicas else front_ops(job.access, "vllm", (job.settings.port,)))
              if isinstance(op, FileWrite)}
    for files in ({path: b"old" for path in wanted}, wanted):
        state = _live(job, {**job.release.files, **files})
        planned = deploy_one(ScriptedTransport("gpu-a", [], state=state), job, dry_run=True)
        done: list = []
        outcome = deploy_one(ScriptedTransport("gpu-a", [], state=state), job, on_op=done.append)
        assert planned.state == outcome.state == "unchanged", outcome.error
        assert list(planned.ops) == [describe(op) for op in done]
        assert bool(done) == (files is not wanted) and (not done or done[-1].argv[:2] == ("systemctl", "reload-or-restart"))


def test_a_plan_of_unchanged_hosts_whose_front_differs_runs_its_refresh(tmp_path, monkeypatch):
    """Every host unchanged, one of them with its front to write again: the plan counts it and the run does it, where
    nothing ran at all (its plan said nothing of it either)."""
    from typer.testing import CliRunner

    from hosttune.cli import app
    from hosttune.cli import deploy as deploy_cli

    inventory = group_inventory(tmp_path, "port: 8100\n")
    inv = load_inventory(inventory)
    runs: list = []

    def fleet(inventory, request, **kw):
        runs.append(request.dry_run)
        return [HostDeploy(h, Outcome.UNCHANGED, "custom-1", "custom-1", ops=("$ systemctl reload-or-restart nginx",)
                           if h.name == "gpu-a" else ()) for h in inventory.hosts]

    monkeypatch.setattr(deploy_cli, "deploy_fleet", fleet)
    args = ["deploy", "-i", str(inventory), "--engine", "custom", "--model", "/m", "--nginx-dir", str(tmp_path / "lb")]
    result = CliRunner().invoke(app, [*args, "--dry-run"])
    assert result.exit_code == 0 and runs == [True], result.output
    assert "plan: deploy to 0 of 2 hosts; refresh the nginx front of 1 unchanged host" in result.output.splitlines()
    result = CliRunner().invoke(app, [*args, "--yes"])
    assert result.exit_code == 0 and runs == [True, True, False], result.output
    monkeypatch.setattr(deploy_cli, "deploy_fleet", lambda inventory, request, **kw: (runs.append(request.dry_run), [
        HostDeploy(h, Outcome.UNCHANGED, "custom-1", "custom-1") for h in inventory.hosts])[1])
    runs.clear()
    assert CliRunner().invoke(app, [*args, "--yes"]).exit_code == 0 and runs == [True]  # nothing to do: nothing runs


def test_an_unchanged_service_whose_host_keeps_a_stale_front_plans_its_removal_as_a_change_marked_bang(tmp_path,
                                                                                                        monkeypatch):
    """A front left from an earlier deploy (hosttune-local.conf over one service whose release has none) is removed by
    the run of an otherwise unchanged release: the plan marks it ! and counts it as taken away, so it needs --yes, where
    it read as a refresh of the front."""
    from typer.testing import CliRunner

    from hosttune.cli import app
    from hosttune.cli import deploy as deploy_cli
    from hosttune.deploy.recap import plan_line

    job = _job(tmp_path, "vllm", "port: 8000\n")
    assert job.access.front is None
    planned = deploy_one(ScriptedTransport("gpu-a", [], state=_live(job, job.release.files)), job, dry_run=True)
    assert planned.state == "unchanged" and planned.ops[0] == f"remove {NGINX_CONF}", planned
    assert planned.removals == ("removes the host's nginx front on port 8080",)
    assert "       ! removes the host's nginx front on port 8080" in render([planned]).splitlines()
    assert plan_line([planned]) == "plan: deploy to 0 of 1 host; remove the nginx front left on 1 unchanged host (!)"
    monkeypatch.setattr(deploy_cli, "deploy_fleet", lambda inventory, request, **kw: [
        replace(planned, host=h) for h in inventory.hosts])
    monkeypatch.setattr("hosttune.cli.common.is_terminal", lambda: True)  # an answer on a terminal is not enough
    args = ["deploy", "-i", str(group_inventory(tmp_path / "cli", "port: 8000\n")), "--limit", "gpu-a", "--engine",
            "vllm", "--model", "/m", "--nginx-dir", str(tmp_path / "lb")]
    result = CliRunner().invoke(app, args, input="y\n")
    assert result.exit_code == 2 and "marked !" in result.output, result.output


def _edited(settings: dict) -> bytes:
    """A release.json as hosttune writes it, but for these settings (an edit by hand)."""
    doc = {"engine": "custom", "entry": "e", "offline": True, "units": [], "settings": settings}
    return json.dumps(doc).encode()


@pytest.mark.parametrize("manifest", [b'{"id": "custom-old", "engi', b'{"id": "custom-old"}', b"[]",
                                      _edited({"port": "eighty"}), _edited({"replicas": [{"index": 0}]}),
                                      _edited({"api_key": "k"})])
def test_rolling_back_to_a_release_whose_release_json_is_not_hosttunes_is_one_line(tmp_path, manifest):
    """A release.json cut short, or edited, is one line naming the file: the host failed, where a ValueError or
    KeyError escaped as a bug."""
    previous = _job(tmp_path, "custom", "port: 8000\n").release
    host, t, log = _rollback_host(tmp_path, previous, "port: 8000\n", "unit:hosttune-serve.service abc active\n")
    t.files[f"{previous.dir}/.hosttune/release.json"] = manifest
    with pytest.raises(DeployError, match=rf"^gpu-a: release {previous.id}'s {previous.dir}/.hosttune/release.json is "
                                          r"not a release.json hosttune wrote \(\w+: .*\)$"):
        rollback_one(t, host, ServeSettings("", "", 1, {}, {}), dry_run=True)


@pytest.mark.parametrize("engine, deploy, gpus", [("vllm", "port: 8000\n", "0"), ("custom", "port: 8000\n", "0-1")])
def test_a_deploy_removes_the_releases_past_those_kept_once_the_new_one_serves(tmp_path, engine, deploy, gpus):
    """Every deploy left one more virtualenv under /opt/hosttune/releases. Once the new release serves, all but the
    --keep-releases newest go, as the plan says: never the new one, nor the one --rollback goes back to (live before,
    however old); a deploy that failed its gate removes nothing."""
    from hosttune.deploy.state import parse_state

    job = replace(_job(tmp_path, engine, deploy, gpus=gpus), keep_releases=3)
    root = "/opt/hosttune/releases"
    state = (f"current:{root}/{engine}-0\nprevious:{root}/{engine}-1\nnginx:/usr/sbin/nginx\n"
             + "".join(f"release:{1000 + i} {root}/{engine}-{i}\n" for i in range(6)))  # -0 the oldest
    assert parse_state(state).releases[f"{root}/{engine}-5"] == 1005
    rm = ("rm", "-rf", "--", *(f"{root}/{engine}-{i}" for i in (1, 2, 3, 4)))  # kept: the new one, -0 and -5
    planned = deploy_one(ScriptedTransport("gpu-a", [], state=state), job, dry_run=True)
    assert planned.ops[-1] == f"[remove old releases] $ {' '.join(rm)}", planned.ops  # only once it serves
    log: list = []
    outcome = deploy_one(ScriptedTransport("gpu-a", log, state=state), job)
    assert outcome.state == "deployed", outcome.error
    argvs = [a for _, a in log]
    gates = [i for i, a in enumerate(argvs) if a[:2] == ("python3", "-c") and "UNKNOWN" not in a[2]]
    assert argvs[-1] == rm and gates[-1] < len(argvs) - 1
    log.clear()
    failed = deploy_one(ScriptedTransport("gpu-a", log, state=state, gate_ok=False), job)
    assert failed.state == "failed" and rm not in [a for _, a in log]


def test_a_rollback_that_takes_the_api_key_away_marks_it_and_needs_yes(tmp_path, monkeypatch):
    """Going back to a release without the key the live one has exposes the engine: the rollback's plan marks it ! and
    a terminal's answer is not enough, as for a deploy that drops the key, where it rolled back on a plain y."""
    from typer.testing import CliRunner

    from hosttune.cli import app
    from hosttune.cli import deploy as deploy_cli

    older = _job(tmp_path / "p", "vllm", "port: 8000\n").release
    live = _job(tmp_path / "c", "vllm", "port: 8000\napi_key: true\n").release
    (host, _) = _hosts(tmp_path, "port: 8000\n")
    t = ScriptedTransport("gpu-a", [], state=f"current:{live.dir}\nprevious:{older.dir}\n")
    for release in (older, live):
        t.files[f"{release.dir}/.hosttune/release.json"] = release.manifest()
        t.files.update({f"{release.dir}/.hosttune/{name}": body for name, body in release.units.items()})
    planned = rollback_one(t, host, ServeSettings("", "", 1, {}, {}), dry_run=True)
    assert planned.removals == ("removes the API key: the engine will answer anyone who reaches it",)
    assert "       ! removes the API key: the engine will answer anyone who reaches it" in render([planned]).splitlines()
    runs: list = []
    monkeypatch.setattr(deploy_cli, "rollback_fleet", lambda inv, *a, dry_run=False, **kw: (runs.append(dry_run), [
        replace(planned, host=h) for h in inv.hosts])[1])
    monkeypatch.setattr("hosttune.cli.common.is_terminal", lambda: True)
    inventory = group_inventory(tmp_path / "cli", "port: 8000\n")
    result = CliRunner().invoke(app, ["deploy", "--rollback", "-i", str(inventory), "--limit", "gpu-a"], input="y\n")
    assert result.exit_code == 2 and "marked !" in result.output and runs == [True], result.output


def test_a_rollback_target_whose_folder_is_gone_takes_no_place_among_the_releases_kept():
    """`current` names a folder someone removed: keeping two releases keeps the new one and the newest other, where
    the missing one counted as kept and every other folder went."""
    from hosttune.deploy.prune import pruned
    from hosttune.deploy.release import Release
    from hosttune.deploy.state import HostState

    root = "/opt/hosttune/releases"
    new = Release("custom-new", "custom", "e", (), True, {}, {})
    state = HostState(f"{root}/custom-gone", None, False, releases={f"{root}/custom-{i}": 1000 + i for i in range(3)})
    assert pruned(state, new, 2) == [f"{root}/custom-0", f"{root}/custom-1"]
    there = HostState(f"{root}/custom-0", None, False, releases=state.releases)
    assert pruned(there, new, 2) == [f"{root}/custom-1", f"{root}/custom-2"]  # the rollback target stays, however old


def test_a_deploy_removes_the_wheel_sets_no_kept_release_uses_with_the_old_releases(tmp_path):
    """Every distinct build uploaded stayed under /opt/hosttune/wheels forever, torch-sized ones included. Once the
    new release serves, the sets no release kept names in its release.json go with the old folders, as the plan
    says; a set the new, the live or the rollback release uses stays, and a kept release whose release.json names
    none leaves every set (which it needs is unknown)."""
    job = replace(_job(tmp_path, "custom", "port: 8000\n", gpus="0-1"), keep_releases=3)
    root, wheels = "/opt/hosttune/releases", "/opt/hosttune/wheels"
    mine = {w.sha256[:16] for w in job.release.wheels}
    sets = {i: f"{i:x}" * 16 for i in range(6)}  # release custom-i was installed from wheel set i
    state = (f"current:{root}/custom-0\nprevious:{root}/custom-1\nnginx:/usr/sbin/nginx\n"
             + "".join(f"release:{1000 + i} {root}/custom-{i}\nuses:{root}/custom-{i} {sets[i]}{'0' * 48} \n"
                       for i in range(6))
             + "".join(f"wheelset:{wheels}/{name}\n" for name in [*sets.values(), *mine, "0123456789abcdeg"]))
    gone = ("rm", "-rf", "--", *(f"{wheels}/{sets[i]}" for i in (1, 2, 3, 4)))  # kept: -0 (live), -5, the new one
    planned = deploy_one(ScriptedTransport("gpu-a", [], state=state), job, dry_run=True)
    assert planned.ops[-2:] == (  # after the gate, and said to run only once the new release serves
        f"[remove old releases] $ rm -rf -- {' '.join(f'{root}/custom-{i}' for i in (1, 2, 3, 4))}",
        f"[remove old releases] $ {' '.join(gone)}"), planned.ops
    log: list = []
    assert deploy_one(ScriptedTransport("gpu-a", log, state=state), job).state == "deployed"
    assert [a for _, a in log][-1] == gone
    unknown = state.replace(f"uses:{root}/custom-5 {sets[5]}{'0' * 48} \n", f"uses:{root}/custom-5 \n")
    planned = deploy_one(ScriptedTransport("gpu-a", [], state=unknown), job, dry_run=True)
    assert not [op for op in planned.ops if f"$ rm -rf -- {wheels}/" in op]


def test_the_state_read_names_each_wheel_set_and_the_wheels_each_release_json_names(tmp_path):
    """state.sh, run over a folder laid out as /opt/hosttune: the wheel sets there, and each complete release's
    wheels as its release.json names them (prune's evidence of what a kept release needs)."""
    import subprocess

    from hosttune.deploy.state import parse_state
    from hosttune.transport.base import bundled_script

    release = _job(tmp_path, "custom", "port: 8000\n", gpus="0-1").release
    base = tmp_path / "opt"
    meta = base / "releases" / release.id / ".hosttune"
    meta.mkdir(parents=True)
    (meta / "release.json").write_bytes(release.manifest())
    (base / "releases" / "custom-half").mkdir()  # an install that did not finish: no release.json
    for w in release.wheels:
        (base / "wheels" / w.sha256[:16]).mkdir(parents=True)
    script = bundled_script("hosttune.deploy", "state.sh").replace("root=/opt/hosttune", f"root={base}")
    out = subprocess.run(["sh", "-c", script, "hosttune", "x"], capture_output=True, text=True, check=True).stdout
    state = parse_state(out)
    assert state.wheel_sets == tuple(sorted(f"{base}/wheels/{w.sha256[:16]}" for w in release.wheels))
    assert state.uses == {f"{base}/releases/{release.id}": tuple(sorted(w.sha256 for w in release.wheels))}
