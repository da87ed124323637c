"""A deploy's preconditions over a scripted host: met, met by an added install, or one line and nothing sent."""

from __future__ import annotations

import pytest

from hosttune.actions.needs import NeedModel, NeedPort
from hosttune.deploy import host as dhost
from hosttune.deploy import rollout
from hosttune.deploy.model import parse_model
from hosttune.deploy.preconditions import NOT_NGINX, OWNERS, serve_needs
from hosttune.deploy.recap import render
from hosttune.deploy.state import HostState
from hosttune.fleet_runner import exit_code

from deploy_fixtures import ScriptedTransport, a100_facts, fake_entry, inventory

CONFIG = ('dir:\nconfig-begin:\n{"architectures": ["LlamaForCausalLM"], "num_attention_heads": 8}\nconfig-end:\n'
          'weights:1000 model.safetensors\n')


def job_for(tmp_path, model_text=CONFIG, engine="vllm"):
    host = next(h for h in inventory(tmp_path).hosts if h.name == "gpu-a")
    fake_entry(tmp_path / "wh", engine)
    request = rollout.DeployRequest(engine, "/m", tmp_path / "wh", "0-1", tensor_parallel=2)
    return rollout.make_job(host, a100_facts(), request, model=parse_model("/m", model_text))


def sent(log) -> list[tuple]:
    """What changed the host: uploads, links, systemctl, commands; reads of state and needs aside."""
    reads = ("# hosttune preconditions", "# hosttune deploy")
    return [a for _, a in log if not (a[:2] == ("sh", "-c") and any(r in a[2] for r in reads)) and a[0] != "cat"
            and a[:2] != ("python3", "-c")]


def test_the_units_need_their_model_and_ports(tmp_path):
    job = job_for(tmp_path)
    port = job.settings.port
    assert serve_needs(job, HostState(None, None, False)) == (NeedModel("/m", "vllm"), NeedPort(port, NOT_NGINX))
    replicas_now = HostState(None, None, False, instances={"hosttune-engine@0.service": "active"})
    assert serve_needs(job, replicas_now)[1] == NeedPort(port, OWNERS)  # their local nginx, which one service stops


def test_an_nginx_of_someone_else_on_the_port_of_one_service_is_refused(tmp_path):
    job = job_for(tmp_path)
    t = ScriptedTransport("gpu-a", [])
    t.needs = {f"port:{job.settings.port}": "listen:nginx.service"}
    outcome = dhost.deploy_one(t, job, dry_run=True)
    assert outcome.error == (f"nothing changed: gpu-a: port {job.settings.port} is in use by nginx.service; choose "
                             "another port or stop it")


def test_a_dry_run_shows_what_was_checked_and_sends_nothing(tmp_path):
    log: list = []
    job = job_for(tmp_path)
    outcome = dhost.deploy_one(ScriptedTransport("gpu-a", log), job, dry_run=True)
    assert outcome.state == "planned", outcome.error
    assert job.python == "python3.10"  # the inventory pins it
    assert "holds: python3.10 can make a virtualenv (python -m venv)" in outcome.checks
    assert "holds: model /m loadable by vllm (config.json and weights)" in outcome.checks
    assert f"holds: port {job.settings.port} free" in outcome.checks
    assert any(c.startswith("holds: ") and "to write on / (102.4 GB free)" in c for c in outcome.checks)
    assert "checked on the host before anything is sent:" in render([outcome])
    assert sent(log) == []


def test_a_python_without_venv_gets_python3_venv_installed_first(tmp_path):
    log: list = []
    t = ScriptedTransport("gpu-a", log)
    t.needs = {"venv:python3.10": "fail:ModuleNotFoundError: No module named 'ensurepip'"}
    outcome = dhost.deploy_one(t, job_for(tmp_path), dry_run=True)
    assert outcome.state == "planned", outcome.error
    assert outcome.ops[:2] == ("$ apt-get update -q", "$ env DEBIAN_FRONTEND=noninteractive apt-get install -y -q "
                               "--no-install-recommends python3.10-venv")
    assert outcome.ops[2].startswith("upload ")  # before any wheel is uploaded
    assert any(c.startswith("added: install python3.10-venv: python3.10 cannot make a virtualenv") for c in outcome.checks)


@pytest.mark.parametrize("needs, model_text, error", [
    ({"venv:python3.10": "fail:No module named 'ensurepip'", "pkg:python3.10-venv": ""}, CONFIG,
     "python3.10 cannot make a virtualenv (No module named 'ensurepip') and python3.10-venv is not in the host's package lists"),
    ({}, "dir:\n", "the model folder /m has no readable config.json"),
    ({"port:{port}": "listen:apache2.service"}, CONFIG, "port {port} is in use by apache2.service"),
    ({}, CONFIG.replace("weights:1000 model.safetensors", "weights:1000 model-00001-of-00002.safetensors\nindex-begin:\n"
                        '{"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}'
                        "\nindex-end:"),
     "the model folder /m lacks 1 of the 2 shards model.safetensors.index.json lists (model-00002-of-00002.safetensors)"),
])
def test_an_unmet_precondition_is_one_line_and_nothing_is_sent(tmp_path, needs, model_text, error):
    job = job_for(tmp_path, model_text)
    log: list = []
    t = ScriptedTransport("gpu-a", log, state="current:/opt/hosttune/releases/vllm-old\n")
    t.needs = {k.format(port=job.settings.port): v for k, v in needs.items()}
    outcome = dhost.deploy_one(t, job)
    assert outcome.state == "failed" and outcome.serving == "vllm-old"
    assert outcome.error.startswith(f"nothing changed: gpu-a: {error.format(port=job.settings.port)}")
    assert "\n" not in outcome.error and sent(log) == [] and exit_code([outcome]) == 2


def test_a_front_on_a_host_without_nginx_is_refused_in_one_line(tmp_path):
    from dataclasses import replace

    from hosttune.deploy.access import Access, Front

    job = job_for(tmp_path)
    job = replace(job, access=Access(job.host.group, front=Front(8443)))
    log: list = []
    t = ScriptedTransport("gpu-a", log)
    t.needs = {"mcmd:nginx": ""}
    outcome = dhost.deploy_one(t, job)
    assert outcome.state == "failed" and sent(log) == []
    assert outcome.error.startswith("nothing changed: gpu-a: nginx not found on the host, needed for: $ sh -c 'set -u …")
    assert "\n" not in outcome.error


def test_too_little_space_for_the_wheels_and_the_virtualenv_is_refused(tmp_path):
    log: list = []
    t = ScriptedTransport("gpu-a", log)
    job = job_for(tmp_path)
    t.needs = {f"space:{p}": "free-kb:0 /opt" for p in
               [f"/opt/hosttune/wheels/{w.sha256[:16]}/{w.name}" for w in job.release.wheels] + [job.release.dir]}
    outcome = dhost.deploy_one(t, job)
    assert outcome.state == "failed" and "to write on /opt (0 bytes free): not enough for" in outcome.error
    assert sent(log) == []


@pytest.mark.parametrize("files, refused", [
    ("/etc/nginx/sites-enabled/default", True),  # Debian's stock site: listen 80 default_server
    ("/etc/nginx/conf.d/hosttune-local.conf", False),  # this deployment's own front
    ("/etc/nginx/conf.d/old.conf.disabled", False),  # conf.d holds *.conf for nginx; the rest is not read
])
def test_another_default_server_on_the_fronts_port_is_refused_before_anything_is_sent(tmp_path, files, refused):
    """nginx -t refuses a second default_server on a port: the front (default_server) would fail once live."""
    from dataclasses import replace as replaced

    from hosttune.deploy.access import Access, Front

    job = job_for(tmp_path)
    job = replaced(job, access=Access(job.host.group, front=Front(80)))
    log: list = []
    t = ScriptedTransport("gpu-a", log, state="nginx:/usr/sbin/nginx\n")
    t.nginx_defaults = f"default-server:80 {files}\n"
    outcome = dhost.deploy_one(t, job, dry_run=True)
    if refused:
        assert outcome.state == "failed" and sent(log) == []
        assert outcome.error == ("nothing changed: gpu-a: port 80, where the host's nginx front would listen as its "
                                 "default server, has one already in /etc/nginx/sites-enabled/default, and nginx "
                                 "refuses two; disable that site or give deploy.nginx a port of its own")
    else:
        assert outcome.state == "planned", outcome.error
    reads = [a for _, a in log if a[:2] == ("sh", "-c") and "default_server" in a[2]]
    assert [a[4:] for a in reads] == [("80",)]
