"""A deploy's preconditions over a scripted host: met, met by an added install, or one line and nothing sent."""

from __future__ import annotations

from dataclasses import replace

import pytest

from hosttune.actions.needs import NeedModel, NeedPort
from hosttune.deploy import host as dhost
from hosttune.deploy import rollout
from hosttune.deploy.model import parse_model
from hosttune.deploy.preconditions import NOT_NGINX, OWNERS, serve_needs
from hosttune.deploy.recap import render
from hosttune.deploy.release import wheel_path
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


def replicas_job(tmp_path, port):
    """Four replicas of the bundled engine on gpu-a's GPUs 0-3, nginx on `port`, replicas on the 4 ports after it."""
    from hosttune.deploy.settings import parse_sets

    host = next(h for h in inventory(tmp_path).hosts if h.name == "gpu-a")
    fake_entry(tmp_path / "wh", "custom")
    request = rollout.DeployRequest("custom", "/m", tmp_path / "wh", "0-3", port=port, replicas="4",
                                    overrides=parse_sets(["device=cuda"]))
    return rollout.make_job(host, a100_facts(), request, model=parse_model("/m", CONFIG))


def four_live_replicas(log, port=8100):
    """A host serving four replicas of the live release, on the ports after `port` (nginx on `port`, as the
    host's hosttune-local.conf says)."""
    running = "".join(f"instance:hosttune-engine@{i}.service active\n" for i in range(4))
    t = ScriptedTransport("gpu-a", log, state=f"current:/opt/hosttune/releases/custom-old\n{running}nginx:/usr/sbin/nginx\n"
                                              f"nginx-listen:{port}\n")
    t.needs = {f"port:{port}": "listen:nginx.service",
               **{f"port:{port + 1 + i}": f"listen:hosttune-engine@{i}.service" for i in range(4)}}
    return t


def test_nginx_moved_onto_a_live_replicas_port_is_refused_before_anything_is_sent(tmp_path):
    """nginx takes its port at the switch, before the roll restarts any replica: one still holds 8102 then."""
    log: list = []
    outcome = dhost.deploy_one(four_live_replicas(log), replicas_job(tmp_path, 8102))
    assert outcome.state == "failed" and sent(log) == [] and exit_code([outcome]) == 2
    assert outcome.error == ("nothing changed: gpu-a: port 8102, where the host's nginx would listen, is held by live "
                             "replica 1 (hosttune-engine@1.service) until the roll restarts it, after the port is "
                             "needed; keep --port 8100, or give one whose ports miss the live replicas' 8101-8104")
    planned = dhost.deploy_one(four_live_replicas([]), replicas_job(tmp_path / "dry", 8102), dry_run=True)
    assert planned.state == "failed" and any(c.startswith("fails: port 8102, where the host's nginx") for c in planned.checks)


def test_a_replica_moved_onto_a_port_a_later_replica_still_holds_is_refused(tmp_path):
    """--port 8101: nginx on 8101 is replica 0's (live), and replica 0 restarts on 8102, replica 1's until its turn."""
    outcome = dhost.deploy_one(four_live_replicas([]), replicas_job(tmp_path, 8101), dry_run=True)
    assert outcome.error.startswith("nothing changed: gpu-a: port 8101, where the host's nginx would listen, is held "
                                    "by live replica 0 (hosttune-engine@0.service)")
    t = four_live_replicas([])
    t.needs["port:8101"] = ""  # even were nginx's port free: replica 0 onto 8102 before replica 1 has let go of it
    outcome = dhost.deploy_one(t, replicas_job(tmp_path / "b", 8101), dry_run=True)
    assert outcome.error.startswith("nothing changed: gpu-a: port 8102, where replica 0 would listen, is held by live "
                                    "replica 1 (hosttune-engine@1.service)")


@pytest.mark.parametrize("port", [8099, 8096])
def test_moving_the_port_down_onto_the_port_of_the_deployments_nginx_is_planned(tmp_path, port):
    """--port 8099: nginx moves to 8099 at the switch and lets go of 8100, where replica 0 restarts later in the
    roll; the host's nginx there is this deployment's, as its hosttune-local.conf says."""
    outcome = dhost.deploy_one(four_live_replicas([]), replicas_job(tmp_path, port), dry_run=True)
    assert outcome.state == "planned", outcome.error
    assert "holds: port 8100 held by nginx.service (this deployment's)" in outcome.checks


def test_a_replica_moved_onto_the_port_of_an_nginx_not_the_deployments_is_refused(tmp_path):
    """An nginx on 8100 that the host's hosttune-local.conf does not name is someone else's: it keeps the port."""
    t = four_live_replicas([])
    t.state = t.state.replace("nginx-listen:8100\n", "nginx-listen:80\n")
    outcome = dhost.deploy_one(t, replicas_job(tmp_path, 8099), dry_run=True)
    assert outcome.error == "nothing changed: gpu-a: port 8100 is in use by nginx.service; choose another port or stop it"


def test_moving_the_port_down_onto_replicas_that_moved_already_is_planned(tmp_path):
    """--port 8098: replicas 2 and 3 restart on 8101 and 8102, let go of by replicas 0 and 1 earlier in the roll."""
    t = four_live_replicas([])
    outcome = dhost.deploy_one(t, replicas_job(tmp_path, 8098), dry_run=True)
    assert outcome.state == "planned", outcome.error
    assert "holds: port 8101 held by hosttune-engine@0.service (this deployment's)" in outcome.checks


def test_space_for_an_install_from_the_index_counts_the_dependencies_pip_fetches(tmp_path):
    """No deps/ in the wheelhouse: pip fetches torch and its CUDA libraries, gigabytes beside a wheel of kilobytes."""
    job = job_for(tmp_path)
    t = ScriptedTransport("gpu-a", [])
    paths = [job.release.dir] + [wheel_path(w) for w in job.release.wheels]
    t.needs = {f"space:{p}": "free-kb:10000000 /opt" for p in paths}  # 10 GB free
    outcome = dhost.deploy_one(t, job, dry_run=True)
    assert outcome.state == "failed" and "to write on /opt (10.2 GB free): not enough for" in outcome.error
    estimate = ("14.0 GB of it an estimate of vllm's dependencies (torch and its CUDA libraries), which pip fetches "
                "from the package index into the virtualenv: the wheelhouse has no deps/ "
                "(hosttune build --deps puts them there, counted exactly); pip keeps no cache and its temporary files "
                "in the virtualenv (--no-cache-dir, TMPDIR), not in ~/.cache/pip or /tmp, which may be other filesystems")
    assert outcome.error.endswith(estimate) and "\n" not in outcome.error
    planned = dhost.deploy_one(ScriptedTransport("gpu-a", []), job, dry_run=True)
    (space,) = [c for c in planned.checks if "to write on /" in c]
    assert space.startswith("holds: 14.0 GB to write on / (102.4 GB free); ") and space.endswith(estimate)


def test_space_for_an_install_from_the_wheelhouse_counts_its_wheels(tmp_path):
    """With deps/ every wheel is in the wheelhouse: pip installs those alone (--no-index), counted from their sizes."""
    job = job_for(tmp_path)
    deps = replace(job.release, offline=True, index_deps=0)
    planned = dhost.deploy_one(ScriptedTransport("gpu-a", []), replace(job, release=deps), dry_run=True)
    (space,) = [c for c in planned.checks if "to write on /" in c]
    assert space.startswith("holds: ") and "estimate" not in space and " kB to write on / " in space


def _pip_install_in_the_virtualenv(job) -> tuple[tuple, str]:
    """The deploy's pip install (run with TMPDIR in the virtualenv and no cache, the folder made before it and
    removed after) and the dry run's space line."""
    log: list = []
    outcome = dhost.deploy_one(ScriptedTransport("gpu-a", log), job)
    assert outcome.state != "failed", outcome.error
    venv, tmp = job.release.dir, f"{job.release.dir}/.pip-tmp"
    commands = sent(log)
    (install,) = [a for a in commands if f"{venv}/bin/pip" in a and "install" in a]
    assert install[:3] == ("env", f"TMPDIR={tmp}", f"{venv}/bin/pip") and "--no-cache-dir" in install
    assert commands.index(("mkdir", "-p", "--", tmp)) < commands.index(install) < commands.index(("rm", "-rf", "--", tmp))
    (space,) = [c for c in dhost.deploy_one(ScriptedTransport("gpu-a", []), job, dry_run=True).checks if "to write on /" in c]
    return install, space


def test_an_install_from_the_wheelhouse_writes_only_where_the_space_check_looks(tmp_path):
    """With deps/ pip unpacks and installs the wheelhouse's wheels: its temporary files are in the virtualenv and it
    keeps no cache, as from the index, so the space checked on the virtualenv's filesystem is where pip writes."""
    job = job_for(tmp_path)
    job = replace(job, release=replace(job.release, offline=True, index_deps=0))
    install, space = _pip_install_in_the_virtualenv(job)
    assert "--no-index" in install and "--no-deps" in install
    assert "estimate" not in space and space.endswith(
        "pip keeps no cache and its temporary files in the virtualenv (--no-cache-dir, TMPDIR), not in ~/.cache/pip "
        "or /tmp, which may be other filesystems")


def test_every_engine_estimates_the_dependencies_pip_fetches_from_the_index():
    from hosttune.presets import ENGINES, load_preset

    assert {e: load_preset(e).build.index_deps_gb for e in ENGINES} == {"custom": 12, "vllm": 14, "sglang": 16}


def test_an_install_from_the_index_writes_only_where_the_space_check_looks(tmp_path):
    """pip's cache (~/.cache/pip) and temporary files (/tmp, TMPDIR) may be on other filesystems than the
    virtualenv's: pip runs without its cache and with its temporary files in the virtualenv, and the plan says so."""
    _, space = _pip_install_in_the_virtualenv(job_for(tmp_path))
    assert ("pip keeps no cache and its temporary files in the virtualenv (--no-cache-dir, TMPDIR), not in "
            "~/.cache/pip or /tmp, which may be other filesystems") in space
