"""Deploy as data: settings precedence, placement and preflight, release operations, host state and
gate parsing, fleet units, and the failure and multi-node flows over a scripted transport."""

from __future__ import annotations

import json
import time
from dataclasses import replace

import pytest
from typer.testing import CliRunner

from hosttune.cli import app
from hosttune.deploy import host as dhost
from hosttune.deploy import groups, multinode, ray_start, rollout
from hosttune.deploy.errors import DeployError
from hosttune.deploy.gate import parse_gate
from hosttune.deploy.placement import place, preflight
from hosttune.actions.base import Command, FileWrite, Remove, Symlink
from hosttune.deploy.plan import Role, activate_ops, install_ops, is_unchanged, make_release
from hosttune.deploy.recap import render
from hosttune.fleet_runner import Outcome, exit_code
from hosttune.deploy.release import release_name, wheel_path
from hosttune.deploy.settings import Overrides, flag_argv, parse_sets, resolve
from hosttune.deploy.shape import declared
from hosttune.deploy.state import HostState, UnitFile, parse_state
from hosttune.deploy.units import RAY_UNIT, SERVE_UNIT
from hosttune.errors import TransportError
from hosttune.probes.facts import Facts
from hosttune.presets import load_preset
from hosttune.transport.base import CommandResult

from deploy_fixtures import INVENTORY, ScriptedTransport, a100_facts, fake_entry, fleet_of, h200_facts, inventory

runner = CliRunner()


# -- settings ---------------------------------------------------------------------------------


def test_parse_sets_reads_yaml_scalars():
    o = parse_sets(["max-num-seqs=64", "enable-prefix-caching=false", "--served-model-name=m", "x=null",
                    "env.HF_HOME=/cache", "env.DROP=null", "ratio=0.9", "text=a=b"])
    assert o.flags == {"max-num-seqs": 64, "enable-prefix-caching": False, "served-model-name": "m", "x": None,
                       "ratio": 0.9, "text": "a=b"}
    assert o.env == {"HF_HOME": "/cache", "DROP": None}
    # text YAML would cut or fold as a plain scalar is the value as given: a '#' starts no comment on a command line
    assert parse_sets(["env.FOO=a #b", "served-model-name=x # y", "env.Q='a #b'"]) == \
        Overrides({"served-model-name": "x # y"}, {"FOO": "a #b", "Q": "a #b"})
    for bad in ("novalue", "bad flag=1", "env.1X=2"):
        with pytest.raises(DeployError):
            parse_sets([bad])


def test_precedence_preset_group_host_set(tmp_path):
    inv = inventory(tmp_path)
    gpu_a, gpu_b = inv.hosts[0], inv.hosts[1]
    preset = load_preset("vllm")
    a = resolve(gpu_a, preset, "/m", None, parse_sets(["max-num-seqs=64"]))
    b = resolve(gpu_b, preset, "/m", 9000, parse_sets(["env.NCCL_DEBUG=null"]))
    assert a.flags["gpu-memory-utilization"] == 0.95  # group
    assert a.flags["max-model-len"] == 32768 and b.flags["max-model-len"] == 8192  # host / preset
    assert a.flags["max-num-seqs"] == 64 and b.flags["max-num-seqs"] == 128  # --set / group
    assert (a.port, b.port) == (8100, 9000)  # inventory / --port
    assert a.env["NCCL_DEBUG"] == "WARN" and "NCCL_DEBUG" not in b.env
    assert a.lb_port == 8080 and not a.multinode and inv.hosts[2].deploy["multinode"] is True


def test_bad_deploy_vars_name_the_inventory_line(tmp_path):
    host = inventory(tmp_path).hosts[0]
    for bad, message in (({"portt": 1}, "deploy.portt: unknown key"), ({"vllm": [1]}, "deploy.vllm must be a mapping"),
                         ({"port": "x"}, "deploy.port must be"), ({"vllm": {"x": "a\tb"}}, "control character"),
                         ({"port": 70000}, r"deploy.port must be a port number between 1 and 65535 \(got 70000\)"),
                         ({"lb_port": 0}, r"deploy.lb_port must be a port number between 1 and 65535 \(got 0\)"),
                         ({"health_timeout": 0}, r"deploy.health_timeout must be at least 1 second \(got 0\)"),
                         ({"gate_timeout": 0.5}, r"deploy.gate_timeout must be at least 1 second \(got 0.5\)"),
                         ({"env": {"CUDA_VISIBLE_DEVICES": "1"}},
                          "deploy.env.CUDA_VISIBLE_DEVICES: hosttune sets it from the deployment's GPUs; give --gpus")):
        with pytest.raises(DeployError, match=message) as info:
            resolve(replace(host, deploy=bad), load_preset("vllm"), "/m", None, parse_sets([]))
        assert "inventory.yaml:" in str(info.value)
    with pytest.raises(DeployError, match=r"inventory.yaml:\d+: deploy.port must be a port number between 1 and 65535"):
        declared(replace(host, deploy={"port": 70000}))  # the shape, which the run's port comes from
    with pytest.raises(DeployError, match="^--set env.CUDA_VISIBLE_DEVICES: hosttune sets it"):
        resolve(host, load_preset("vllm"), "/m", None, parse_sets(["env.CUDA_VISIBLE_DEVICES=0"]))
    # the order the indices of --gpus are read in: another one gives each replica GPUs other than the placed ones
    with pytest.raises(DeployError, match="^--set env.CUDA_DEVICE_ORDER: hosttune sets it to PCI_BUS_ID, the order "
                                          "nvidia-smi numbers the GPUs in, which --gpus and the placement use; drop it"):
        resolve(host, load_preset("vllm"), "/m", None, parse_sets(["env.CUDA_DEVICE_ORDER=FASTEST_FIRST"]))



@pytest.mark.parametrize("engine, flag, option", [("custom", "port", "--port"), ("custom", "model", "--model"),
                                                  ("sglang", "model-path", "--model"),
                                                  ("vllm", "tensor-parallel-size", "--tensor-parallel"),
                                                  # the same flags by their other names
                                                  ("vllm", "model", "--model"), ("sglang", "model", "--model"),
                                                  ("sglang", "tensor-parallel-size", "--tensor-parallel")])
def test_flags_hosttune_sets_from_the_shape_are_refused_with_the_option_that_sets_them(tmp_path, engine, flag, option):
    host = inventory(tmp_path).hosts[0]
    with pytest.raises(DeployError, match=f"^--set {flag}: hosttune sets --{flag} from the deployment's shape; give "
                                          f"{option} "):
        resolve(host, load_preset(engine), "/m", None, parse_sets([f"{flag}=2"]))
    with pytest.raises(DeployError, match=f"inventory.yaml:\\d+: deploy.{engine}.{flag}: hosttune sets"):
        resolve(replace(host, deploy={engine: {flag: 2}}), load_preset(engine), "/m", None, parse_sets([]))


@pytest.mark.parametrize("engine, flag", [("vllm", "pipeline-parallel-size"), ("vllm", "data-parallel-size"),
                                          ("sglang", "pp-size"), ("sglang", "pipeline-parallel-size"),
                                          ("sglang", "dp-size"), ("sglang", "data-parallel-size")])
def test_flags_that_would_give_a_replica_more_gpus_than_placed_are_refused(tmp_path, engine, flag):
    """Each replica gets CUDA_VISIBLE_DEVICES of its TP GPUs: pipeline or data parallel inside it would ask for more."""
    host = inventory(tmp_path).hosts[0]
    with pytest.raises(DeployError, match=f"^--set {flag}=2: a replica runs on the --tensor-parallel GPUs hosttune "
                                          f"places it on, and --{flag} 2 would need 2 times as many; give "
                                          "--tensor-parallel and --replicas"):
        resolve(host, load_preset(engine), "/m", None, parse_sets([f"{flag}=2"]))
    with pytest.raises(DeployError, match=f"inventory.yaml:\\d+: deploy.{engine}.{flag}=2: a replica runs"):
        resolve(replace(host, deploy={engine: {flag: 2}}), load_preset(engine), "/m", None, parse_sets([]))
    assert resolve(host, load_preset(engine), "/m", None, parse_sets([f"{flag}=1"])).flags[flag] == 1


def test_flag_argv_true_false_null():
    flags = {"a": True, "b": False, "c": None, "d": 3, "e": "{port}"}
    assert flag_argv(flags, {"port": 1}, "no-{flag}") == ["--a", "--no-b", "--d", "3", "--e", "1"]
    assert flag_argv(flags, {"port": 1}, None) == ["--a", "--d", "3", "--e", "1"]


# -- placement and preflight ------------------------------------------------------------------


def test_gpu_selection_is_checked_against_the_host():
    facts = a100_facts()
    assert place("all", facts, "h").gpus == (0, 1, 2, 3)
    with pytest.raises(DeployError, match="asks for GPU 4,5, but the host has GPUs 0-3"):
        place("0,4-5", facts, "h")
    with pytest.raises(DeployError, match="write GPU indices"):
        place("zero", facts, "h")


def test_preflight_refuses_a_host_without_systemd():
    facts = h200_facts()
    with pytest.raises(DeployError) as info:
        preflight(facts, "h200-local", place("0", facts, "h200-local"), "cuda")
    assert "h200-local: PID 1 is 'process_api', not systemd" in str(info.value)


def test_preflight_needs_numactl_for_numa_binding_and_a_gpu_unless_cpu():
    facts = replace(a100_facts(), numactl=None)
    with pytest.raises(DeployError, match="numactl is missing"):
        preflight(facts, "h", place("2-3", facts, "h"), "cuda")
    no_gpu = Facts(pid1="systemd", python_version="3.11.2")
    with pytest.raises(DeployError, match="no NVIDIA GPU found"):
        preflight(no_gpu, "h", place("0", no_gpu, "h"), None)
    preflight(no_gpu, "h", place("0", no_gpu, "h"), "cpu")


def test_preflight_refuses_gpus_in_mig_mode():
    """CUDA runs on a MIG-enabled GPU's instances only, not on the whole GPU the placement gave the engine."""
    facts = a100_facts()
    gpus = tuple(replace(g, mig_enabled=g.index == 1) for g in facts.gpu.gpus)
    facts = replace(facts, gpu=replace(facts.gpu, gpus=gpus))
    with pytest.raises(DeployError, match="^h: GPU 1 is in MIG mode, and hosttune deploy runs engines on whole GPUs; "
                                          r"turn MIG off \(the profile's gpu.mig: false, hosttune apply\) or leave "
                                          "GPU 1 out of --gpus$"):
        preflight(facts, "h", place("0-1", facts, "h"), "cuda")
    preflight(facts, "h", place("2-3", facts, "h"), "cuda")
    preflight(facts, "h", place("0-1", facts, "h"), "cpu")  # a CPU engine uses none of them


# -- release operations -----------------------------------------------------------------------


def release_for(tmp_path, engine="vllm", role=Role(), deps=False):
    inv = inventory(tmp_path)
    preset = load_preset(engine)
    settings = resolve(inv.hosts[0], preset, "/m", None, parse_sets([]))
    entry = fake_entry(tmp_path / "wh", engine)
    if deps:
        entry = replace(entry, wheels=entry.wheels + (replace(entry.wheels[0], name="torch-1-cp310.whl", kind="dep", sha256="f" * 64),))
    return make_release(preset, settings, place("0-1", a100_facts(), "h"), entry, role), entry


def test_install_uploads_what_is_missing_and_builds_the_venv(tmp_path):
    release, entry = release_for(tmp_path, deps=True)
    engine_wheel, dep = release.wheels
    have = HostState(None, None, False, {wheel_path(dep): dep.sha256})
    ops = install_ops(release, entry, have)
    assert ops[0] == FileWrite(wheel_path(engine_wheel), source=entry.file(engine_wheel))
    assert not any(isinstance(op, FileWrite) and op.path == wheel_path(dep) for op in ops)
    venv = f"/opt/hosttune/releases/{release.id}"
    argvs = [op.argv for op in ops if isinstance(op, Command)]
    assert argvs[0] == ("rm", "-rf", "--", venv) and argvs[1] == ("python3", "-m", "venv", venv)
    tmp = f"{venv}/.pip-tmp"
    assert argvs[2] == ("mkdir", "-p", "--", tmp) and argvs[4] == ("rm", "-rf", "--", tmp)
    assert argvs[3][:4] == ("env", f"TMPDIR={tmp}", f"{venv}/bin/pip", "install")
    assert "--no-index" in argvs[3] and "--no-deps" in argvs[3] and "--no-cache-dir" in argvs[3]
    assert argvs[5][1] == "check"
    assert isinstance(ops[-1], FileWrite) and ops[-1].path == f"{venv}/.hosttune/release.json"  # written last
    assert install_ops(release, entry, HostState(None, None, True, {wheel_path(w): w.sha256 for w in release.wheels})) == []


def test_same_wheel_set_is_cloned_not_reinstalled(tmp_path):
    from hosttune.deploy.plan import wheel_set

    release, entry = release_for(tmp_path, deps=True)
    donor = "/opt/hosttune/releases/vllm-donor"
    state = HostState(None, None, False, {wheel_path(w): w.sha256 for w in release.wheels},
                      installed={donor: wheel_set(release, "python3"), "/opt/hosttune/releases/x": "other"})
    ops = install_ops(release, entry, state)
    (clone,) = [op for op in ops if isinstance(op, Command)]
    assert clone.argv[:2] == ("sh", "-c") and clone.argv[3:] == ("sh", release.dir, donor)
    assert [op.path.rsplit("/", 1)[-1] for op in ops if isinstance(op, FileWrite) and op.source is None] == [SERVE_UNIT, "wheelset", "release.json"]
    other_python = install_ops(release, entry, state, python="python3.12")
    assert any(isinstance(op, Command) and op.argv[1:3] == ("-m", "venv") for op in other_python)


def test_install_without_dependency_wheels_uses_the_index(tmp_path):
    release, entry = release_for(tmp_path)
    (pip,) = [op.argv for op in install_ops(release, entry, HostState(None, None, False)) if isinstance(op, Command) and "install" in op.argv]
    assert "--no-index" not in pip and pip[-1] == wheel_path(release.wheels[0])


def test_activate_links_previous_removes_stale_units_and_restarts_in_order(tmp_path):
    release, _ = release_for(tmp_path, role=Role("head", 2, "10.0.0.1", "10.0.0.1"))
    old = "/opt/hosttune/releases/vllm-old"
    ops = activate_ops(release, HostState(old, None, True, {}, {"hosttune-extra.service": UnitFile("hosttune-extra.service", "x", "active")}))
    assert ops[0] == Command(("systemctl", "disable", "--now", "hosttune-extra.service"))
    assert ops[1] == Remove("/etc/systemd/system/hosttune-extra.service")
    assert Symlink("/opt/hosttune/previous", old) in ops and Symlink("/opt/hosttune/current", release.dir) in ops
    restarts = [op.argv[2] for op in ops if isinstance(op, Command) and op.argv[1] == "restart"]
    assert restarts == [RAY_UNIT, SERVE_UNIT]
    head_first = activate_ops(release, HostState(None, None, True), start=(RAY_UNIT,))
    assert [op.argv[2] for op in head_first if isinstance(op, Command) and op.argv[1] == "restart"] == [RAY_UNIT]
    assert not any(isinstance(op, Symlink) and op.path.endswith("previous") for op in head_first)


def test_unchanged_means_same_release_same_units_all_active(tmp_path):
    import hashlib

    release, _ = release_for(tmp_path)
    sha = hashlib.sha256(release.units[SERVE_UNIT]).hexdigest()
    live = HostState(release.dir, None, True, {}, {SERVE_UNIT: UnitFile(SERVE_UNIT, sha, "active")})
    assert is_unchanged(release, live)
    assert not is_unchanged(release, replace(live, units={SERVE_UNIT: UnitFile(SERVE_UNIT, sha, "failed")}))
    assert not is_unchanged(release, replace(live, units={SERVE_UNIT: UnitFile(SERVE_UNIT, "0" * 64, "active")}))
    assert not is_unchanged(release, replace(live, current="/opt/hosttune/releases/other"))


def test_host_state_and_gate_parsers():
    state = parse_state("current:/opt/hosttune/releases/a\nprevious:\ncomplete:b\nwheel:abc /opt/hosttune/wheels/x/y.whl\n"
                        "unit:hosttune-serve.service 0123 active\ninstalled:ws1 /opt/hosttune/releases/a\n")
    assert state.installed == {"/opt/hosttune/releases/a": "ws1"}
    assert state.current == "/opt/hosttune/releases/a" and state.previous is None and state.is_complete
    assert state.wheels == {"/opt/hosttune/wheels/x/y.whl": "abc"}
    assert state.units[SERVE_UNIT] == UnitFile(SERVE_UNIT, "0123", "active")
    ok = parse_gate('noise\n{"ok": true, "phase": "done", "health_s": 3.2, "warmup": {"requests": 3, "s": 1.5}, "gate_s": 0.04, "model": "m"}')
    assert ok.ok and ok.summary() == "healthy after 3.2s, warmup 3 requests in 1.5s, one-token generation in 0.04s"
    bad = parse_gate('{"ok": false, "phase": "health", "error": "not healthy after 60s"}')
    assert not bad.ok and bad.summary() == "gate failed at health: not healthy after 60s"
    assert not parse_gate("Traceback ...").ok


# -- choosing wheels ------------------------------------------------------------------------------


@pytest.mark.parametrize("ref, built", [("HEAD~1", "HEAD_1-0123456789ab"), ("release/v1.2", "release_v1.2-abcdefabcdef")])
def test_deploy_ref_finds_the_build_of_a_ref_whose_name_the_key_spells_differently(tmp_path, ref, built):
    wanted = fake_entry(tmp_path, "custom", archs=(), cuda=None, abi="cp311", ref=built)
    fake_entry(tmp_path, "custom", archs=(), cuda=None, abi="cp311", ref="src.0123456789ab", built_at=time.time() + 60)
    request = rollout.DeployRequest("custom", "/m", tmp_path, ref=ref)
    assert rollout.pick_entry(request, "cp311", (), "h").path == wanted.path


def test_deploy_ref_that_was_never_built_names_what_was(tmp_path):
    fake_entry(tmp_path, "custom", archs=(), cuda=None, abi="cp311", ref="src.0123456789ab")
    with pytest.raises(DeployError) as err:
        rollout.pick_entry(rollout.DeployRequest("custom", "/m", tmp_path, ref="v9"), "cp311", (), "h")
    assert "no custom wheels of --ref v9 in" in str(err.value)
    assert "built: custom-src.0123456789ab-anyarch-anycuda-cp311)" in str(err.value)


def test_pick_entry_fits_python_and_gpu(tmp_path):
    wh = tmp_path / "wh"
    fake_entry(wh, archs=("9.0",), built_at=3)
    fit = fake_entry(wh, archs=("8.0", "9.0"), ref="v0.10.0-aaaaaaaaaaaa", built_at=2)
    fake_entry(wh, archs=("8.0",), abi="cp312", built_at=4)
    request = rollout.DeployRequest("vllm", "/m", wh)
    assert rollout.pick_entry(request, "cp310", ("8.0",), "h").path == fit.path
    assert rollout.pick_entry(replace(request, ref="v0.10.0"), "cp310", ("9.0",), "h").path == fit.path
    with pytest.raises(DeployError, match="no vllm wheels .* fit this host .*GPUs 7.5.*hosttune build --engine vllm"):
        rollout.pick_entry(request, "cp310", ("7.5",), "h")


def test_pick_entry_fits_the_cuda_the_hosts_driver_runs(tmp_path):
    """Wheels compiled with CUDA 13's toolkit do not load on a driver of CUDA 12; 12.x wheels run on a 12.y or 13
    driver (the driver is backward compatible, and within a major version so is the toolkit)."""
    wh = tmp_path / "wh"
    cuda12 = fake_entry(wh, archs=("8.0",), cuda="12.8", built_at=1)
    cuda13 = fake_entry(wh, archs=("8.0",), cuda="13.0", ref="v0.11.0-bbbbbbbbbbbb", built_at=2)  # the newest
    request = rollout.DeployRequest("vllm", "/m", wh)
    assert rollout.pick_entry(request, "cp310", ("8.0",), "h", cuda="12.2").path == cuda12.path
    assert rollout.pick_entry(request, "cp310", ("8.0",), "h", cuda="13.0").path == cuda13.path
    assert rollout.pick_entry(request, "cp310", ("8.0",), "h", cuda=None).path == cuda13.path  # unknown: not judged
    with pytest.raises(DeployError, match=r"no vllm wheels .* fit this host \(Python cp310, GPUs 8.0, a driver of "
                                          r"CUDA 11.8; built: "):
        rollout.pick_entry(request, "cp310", ("8.0",), "h", cuda="11.8")


def test_multinode_groups_roll_as_one_unit(tmp_path):
    inv = inventory(tmp_path)
    assert [[h.name for h in u] for u in groups.rollout_units(inv, "vllm")] == [["gpu-a"], ["gpu-b"], ["node-0", "node-1", "node-2"]]
    assert len(groups.rollout_units(inv, "sglang")) == 5  # multi-node is vLLM's (Ray)


# -- flows over a scripted transport ---------------------------------------------------------------


def job_for(tmp_path, host_name="gpu-a", role=Role()):
    inv = inventory(tmp_path)
    host = next(h for h in inv.hosts if h.name == host_name)
    fake_entry(tmp_path / "wh")
    return rollout.make_job(host, a100_facts(), rollout.DeployRequest("vllm", "/m", tmp_path / "wh", "0-1", tensor_parallel=2), role)


def test_failed_gate_shows_the_journal_and_restores_the_previous_release(tmp_path):
    job = job_for(tmp_path)
    old = "/opt/hosttune/releases/vllm-old"
    log: list = []
    t = ScriptedTransport("gpu-a", log, gate_ok=False, state=f"current:{old}\n")
    t.files[f"{old}/.hosttune/release.json"] = json.dumps(
        {"engine": "vllm", "entry": "e", "offline": False, "units": [SERVE_UNIT], "settings": {"port": 8100}}).encode()
    t.files[f"{old}/.hosttune/{SERVE_UNIT}"] = b"[Service]\nExecStart=/old\n"
    outcome = dhost.deploy_one(t, job)
    assert outcome.state == "failed" and outcome.restored == "vllm-old" and outcome.serving is None  # its gate fails too here
    assert outcome.journal == "engine: model not found" and "gate failed at health: boom" in outcome.error
    links = [a for _, a in log if a[:2] == ("sh", "-c") and a[4] == "link"]
    assert [a[5:7] for a in links] == [("/opt/hosttune/previous", old), ("/opt/hosttune/current", job.release.dir),
                                       ("/opt/hosttune/current", old)]
    removed = [a[5] for _, a in log if a[:2] == ("sh", "-c") and a[4] == "remove"]
    assert removed == ["/opt/hosttune/previous"]  # there was none before this deploy
    text = render([outcome])
    assert "journal of the service" in text and "previous release vllm-old put back but NOT serving" in text
    assert exit_code([outcome]) == 2


MODEL = 'dir:\nconfig-begin:\n{"num_attention_heads": 8}\nconfig-end:\nweights:1000 model.safetensors\n'


def ray_group(tmp_path, monkeypatch, log: list) -> tuple[list, dict]:
    """The inventory's ray group over scripted hosts that hold the model folder /m."""
    hosts = [h for h in inventory(tmp_path).hosts if h.group == "ray"]
    fake_entry(tmp_path / "wh")
    transports = {h.name: ScriptedTransport(h.name, log, ray_nodes=3) for h in hosts}
    for t in transports.values():
        t.models["/m"] = MODEL
    monkeypatch.setattr(multinode, "open_transport", lambda spec, **kw: transports[spec.host_name])
    monkeypatch.setattr(multinode, "gather", lambda t, **_: type("Run", (), {"facts": a100_facts()})())
    return hosts, transports


def test_multinode_starts_ray_head_then_workers_then_the_server(tmp_path, monkeypatch):
    log: list = []
    hosts, _ = ray_group(tmp_path, monkeypatch, log)
    request = rollout.DeployRequest("vllm", "/m", tmp_path / "wh", "0-3")
    outcomes = multinode.deploy_group(hosts, request, rollout.make_job)
    assert [o.state for o in outcomes] == ["deployed"] * 3
    events = [(h, a[2] if a[1] == "restart" else "ray status") for h, a in log
              if a[:2] == ("systemctl", "restart") or a[0].endswith("/bin/ray")]
    assert events[0] == ("node-0", RAY_UNIT) and events[1] == ("node-0", "ray status")
    assert sorted(events[2:4]) == [("node-1", RAY_UNIT), ("node-2", RAY_UNIT)]
    assert events[4:] == [("node-0", "ray status"), ("node-0", SERVE_UNIT)]
    gate_at = max(i for i, (h, a) in enumerate(log) if a[:2] == ("python3", "-c"))
    assert log[gate_at][0] == "node-0" and gate_at > max(i for i, (h, a) in enumerate(log) if a[-1:] == (SERVE_UNIT,))
    assert ray_start.parse_ray_nodes("Active:\n 1 node_ab12\n 1 node_cd34\nPending:\n 1 node_ef56\n") == 2


def test_a_multinode_group_removes_each_hosts_releases_past_those_kept_once_it_serves(tmp_path, monkeypatch):
    log: list = []
    hosts, transports = ray_group(tmp_path, monkeypatch, log)
    root = "/opt/hosttune/releases"
    for t in transports.values():
        t.state = f"current:{root}/vllm-0\n" + "".join(f"release:{1000 + i} {root}/vllm-{i}\n" for i in range(4))
    request = rollout.DeployRequest("vllm", "/m", tmp_path / "wh", "0-3", keep_releases=3)
    planned = multinode.deploy_group(hosts, replace(request, dry_run=True), rollout.make_job)
    assert {o.ops[-1] for o in planned} == {f"[remove old releases] $ rm -rf -- {root}/vllm-1 {root}/vllm-2"}
    outcomes = multinode.deploy_group(hosts, request, rollout.make_job)
    assert [o.state for o in outcomes] == ["deployed"] * 3
    removed = [h for h, a in log if a == ("rm", "-rf", "--", f"{root}/vllm-1", f"{root}/vllm-2")]
    gate_at = max(i for i, (h, a) in enumerate(log) if a[:2] == ("python3", "-c"))
    assert sorted(removed) == ["node-0", "node-1", "node-2"] and log.index(("node-0", ("rm", "-rf", "--", f"{root}/vllm-1", f"{root}/vllm-2"))) > gate_at


def test_a_multinode_group_stops_before_anything_is_sent_when_one_host_cannot_meet_its_preconditions(tmp_path, monkeypatch):
    log: list = []
    hosts, transports = ray_group(tmp_path, monkeypatch, log)
    transports["node-2"].needs = {"venv:python3.10": "fail:No module named 'ensurepip'", "pkg:python3.10-venv": ""}
    outcomes = multinode.deploy_group(hosts, rollout.DeployRequest("vllm", "/m", tmp_path / "wh", "0-3"), rollout.make_job)
    assert [o.state for o in outcomes] == ["failed"] * 3
    assert outcomes[0].error.startswith("nothing changed on group ray: node-2: python3.10 cannot make a virtualenv")
    assert not [a for _, a in log if a[:2] == ("sh", "-c") and a[4:5] == ("write",) or a[0] == "systemctl"]


@pytest.mark.parametrize("host, answer, error", [
    ("node-2", {"model": ""}, "node-2: the model folder /m does not exist on the host"),
    ("node-1", {"model": "dir:\nweights:1000 model.safetensors\n"}, "node-1: the model folder /m has no readable config.json"),
    ("node-0", {"port:8000": "listen:apache2.service"}, "node-0: port 8000 is in use by apache2.service"),
    ("node-0", {"port:6379": "listen:redis-server.service"}, "node-0: port 6379 is in use by redis-server.service"),
])
def test_a_multinode_group_checks_every_hosts_model_and_the_heads_ports_before_anything_is_sent(
        tmp_path, monkeypatch, host, answer, error):
    log: list = []
    hosts, transports = ray_group(tmp_path, monkeypatch, log)
    if "model" in answer:
        transports[host].models["/m"] = answer["model"]
    else:
        transports[host].needs = answer
    for dry_run in (True, False):
        request = rollout.DeployRequest("vllm", "/m", tmp_path / "wh", "0-3", dry_run=dry_run)
        outcomes = multinode.deploy_group(hosts, request, rollout.make_job)
        assert [o.state for o in outcomes] == ["failed"] * 3
        assert outcomes[0].error.startswith(f"nothing changed on group ray: {error}")
    assert not [a for _, a in log if a[:2] == ("sh", "-c") and a[4:5] == ("write",) or a[0] == "systemctl"]


def test_a_multinode_dry_run_shows_each_hosts_checks(tmp_path, monkeypatch):
    hosts, _ = ray_group(tmp_path, monkeypatch, [])
    request = rollout.DeployRequest("vllm", "/m", tmp_path / "wh", "0-3", dry_run=True)
    outcomes = multinode.deploy_group(hosts, request, rollout.make_job)
    assert [o.state for o in outcomes] == ["planned"] * 3
    for o in outcomes:
        assert "holds: model /m loadable by vllm (config.json and weights)" in o.checks
    assert {"holds: port 8000 free", "holds: port 6379 free"} <= set(outcomes[0].checks)
    assert not [c for o in outcomes[1:] for c in o.checks if c.startswith("holds: port")]  # a worker serves no port
    assert "checked on the host before anything is sent:" in render(outcomes)


def test_a_multinode_head_checks_its_flags_after_the_install_before_anything_live_changes(tmp_path, monkeypatch):
    log: list = []
    hosts, transports = ray_group(tmp_path, monkeypatch, log)
    transports["node-0"].unknown_flags = ["--distributed-executor-backend"]
    request = rollout.DeployRequest("vllm", "/m", tmp_path / "wh", "0-3")
    planned = multinode.deploy_group(hosts, replace(request, dry_run=True), rollout.make_job)
    check = next(i for i, op in enumerate(planned[0].ops) if "check the engine's flags" in op)
    assert check == max(i for i, op in enumerate(planned[0].ops) if op.startswith("[install releases]"))
    assert planned[0].ops[check].startswith("[install releases] check the engine's flags against `/opt/hosttune/releases/")
    assert planned[0].ops[-1].startswith("[start the server on the head] gate hosttune-serve.service: /health within ")
    assert planned[0].ops[-1].endswith("on failure the group's units are stopped and disabled (nothing was live before)")
    assert not [op for o in planned[1:] for op in o.ops if "check the engine's flags" in op or " gate " in op]
    outcomes = multinode.deploy_group(hosts, request, rollout.make_job)
    assert [o.state for o in outcomes] == ["failed"] * 3
    assert "does not know --distributed-executor-backend" in outcomes[0].error
    assert not [a for _, a in log if a[0] == "systemctl"]  # installed beside the live release, nothing switched


@pytest.mark.parametrize("shape, error", [
    ({"tensor_parallel": 2}, "node-0: --tensor-parallel 2: a multi-node group runs tensor parallel over "
     "each host's GPUs (--gpus 0-3 gives 4) and pipeline parallel over its hosts; give --gpus of 2 GPUs instead, or "
     "leave --tensor-parallel out"),
    ({"replicas": "2"}, "node-0: --replicas 2: a multi-node group serves one replica over all its hosts; "
     "leave --replicas out"),
    ({"replicas_per_gpu": 2}, "node-0: --replicas-per-gpu 2: a multi-node group serves one replica over "
     "all its hosts; leave --replicas-per-gpu out"),
    ({"gpus": "0-2"}, "node-0: a multi-node group runs tensor parallel over each host's GPUs (--gpus 0-2 "
     "gives 3), and 3 does not divide /m's 8 attention heads (8 KV heads); give each host 1, 2 or 4 GPUs with --gpus"),
])
def test_a_multinode_group_refuses_a_shape_it_would_not_serve(tmp_path, monkeypatch, shape, error):
    log: list = []
    hosts, _ = ray_group(tmp_path, monkeypatch, log)
    request = replace(rollout.DeployRequest("vllm", "/m", tmp_path / "wh", "0-3", dry_run=True), **shape)
    outcomes = multinode.deploy_group(hosts, request, rollout.make_job)
    assert [o.state for o in outcomes] == ["failed"] * 3
    assert outcomes[0].error == f"nothing changed on group ray: {error}"
    request = rollout.DeployRequest("vllm", "/m", tmp_path / "wh", "0-3", tensor_parallel=4, replicas="1", dry_run=True)
    assert [o.state for o in multinode.deploy_group(hosts, request, rollout.make_job)] == ["planned"] * 3  # as it runs


def test_a_multinode_group_that_serves_its_release_already_is_unchanged_and_not_restarted(tmp_path, monkeypatch):
    import hashlib

    from hosttune.deploy.model import parse_model

    log: list = []
    hosts, transports = ray_group(tmp_path, monkeypatch, log)
    request = rollout.DeployRequest("vllm", "/m", tmp_path / "wh", "0-3")
    roles = multinode.roles(hosts)
    for host in hosts:
        release = rollout.make_job(host, a100_facts(), request, roles[host.name], model=parse_model("/m", MODEL)).release
        transports[host.name].state = f"current:{release.dir}\ncomplete:{release.id}\n" + "".join(
            f"unit:{name} {hashlib.sha256(body).hexdigest()} active\n" for name, body in release.units.items())
    for dry_run in (True, False):
        outcomes = multinode.deploy_group(hosts, replace(request, dry_run=dry_run), rollout.make_job)
        assert [o.state for o in outcomes] == ["unchanged"] * 3 and not any(o.ops for o in outcomes)
    assert not [a for _, a in log if a[0] == "systemctl" or a[:2] == ("sh", "-c") and a[4:5] == ("write",)]
    gates = [h for h, a in log if a[:2] == ("python3", "-c") and "UNKNOWN" not in a[2]]
    assert gates == ["node-0"] and outcomes[0].gate.ok  # the real run asks the head's server to answer


def test_a_multinode_group_with_a_cordoned_host_changes_none(tmp_path, monkeypatch):
    log: list = []
    hosts, transports = ray_group(tmp_path, monkeypatch, log)
    transports["node-1"].files["/var/lib/hosttune/cordon.json"] = b'{"at": 1, "reason": "GPU1: Xid 79", "run": "R"}\n'
    for dry_run in (True, False):
        request = rollout.DeployRequest("vllm", "/m", tmp_path / "wh", "0-3", dry_run=dry_run)
        outcomes = multinode.deploy_group(hosts, request, rollout.make_job)
        assert [o.state for o in outcomes] == ["failed"] * 3
        assert outcomes[0].error == ("nothing changed on group ray: node-1 is cordoned (GPU1: Xid 79); hosttune "
                                     "uncordon takes it back")
    assert not [a for _, a in log if a[0] == "systemctl" or a[:2] == ("sh", "-c") and a[4:5] == ("write",)]


def test_a_multinode_group_whose_gpus_a_host_would_cut_quantized_groups_says_so(tmp_path, monkeypatch):
    hosts, transports = ray_group(tmp_path, monkeypatch, [])
    for t in transports.values():  # 128-column groups, 384 MLP columns: 2 ranks would get 1.5 groups each
        t.models["/m"] = MODEL.replace('"num_attention_heads": 8}', '"num_attention_heads": 8, "hidden_size": 1024, '
                                       '"intermediate_size": 384, "quantization_config": {"quant_method": "awq", '
                                       '"group_size": 128}}')
    request = rollout.DeployRequest("vllm", "/m", tmp_path / "wh", "0-1", dry_run=True)
    outcomes = multinode.deploy_group(hosts, request, rollout.make_job)
    assert outcomes[0].error == ("nothing changed on group ray: node-0: a multi-node group runs tensor parallel over each "
                                 "host's GPUs (--gpus 0-1 gives 2), and a 1/2 shard of its 384 input columns (192) is "
                                 "not whole 128-column awq groups; give each host 1 GPU with --gpus")


def test_cli_a_limit_that_splits_a_multinode_group_is_refused_before_any_host_is_read(tmp_path, monkeypatch):
    """The hosts it keeps would become a group of their own (the first one its Ray head), the others left as they were."""
    opened = untouched(monkeypatch)
    monkeypatch.setattr(multinode, "open_transport", rollout.open_transport)
    inventory(tmp_path)
    base = ["deploy", "-i", str(tmp_path / "inventory.yaml"), "--engine", "vllm", "--model", "/m", "--dry-run"]
    result = runner.invoke(app, [*base, "--limit", "node-1,gpu-a"])
    assert result.exit_code == 2 and not opened
    assert result.output == ("hosttune: --limit node-1,gpu-a takes node-1 of the multi-node vLLM group ray, which "
                             "serves as one (node-0, node-1, node-2): limit to all of its hosts or to none\n")
    result = runner.invoke(app, [*base, "--engine", "sglang", "--limit", "node-1", "-w", str(tmp_path / "wh")])
    assert "multi-node" not in result.output  # another engine serves host by host
    opened.clear()
    (tmp_path / "inventory.yaml").write_text(INVENTORY.replace("deploy: {multinode: true}",
                                                               "deploy: {multinode: true, engine: vllm}"))
    result = runner.invoke(app, ["deploy", "-i", str(tmp_path / "inventory.yaml"), "--rollback", "--limit", "node-0",
                                 "--dry-run"])
    assert result.exit_code == 2 and result.output.startswith("hosttune: --limit node-0 takes node-0 of the multi-node "
                                                              "vLLM group ray") and not opened


@pytest.mark.parametrize("deploy, named", [("{multinode: true, api_key: true}", "deploy.api_key"),
                                           ("{multinode: true, nginx: {port: 8443}}", "deploy.nginx")])
def test_a_multinode_group_with_a_key_or_a_front_is_refused_before_anything_is_sent(tmp_path, monkeypatch, deploy, named):
    """Its hosts get neither the key file their units read nor the nginx front their loopback engine would need."""
    log: list = []
    (tmp_path / "inventory.yaml").parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / "inventory.yaml").write_text(INVENTORY.replace("deploy: {multinode: true}", f"deploy: {deploy}"))
    from hosttune.config.inventory import load_inventory

    hosts = [h for h in load_inventory(tmp_path / "inventory.yaml").hosts if h.group == "ray"]
    ray_group(tmp_path / "x", monkeypatch, log)  # scripted hosts of the same names, with the model
    request = rollout.DeployRequest("vllm", "/m", tmp_path / "x" / "wh", "0-3", keys_dir=tmp_path / "keys",
                                    dry_run=True)
    outcomes = multinode.deploy_group(hosts, request, rollout.make_job)
    assert [o.state for o in outcomes] == ["failed"] * 3
    assert outcomes[0].error.startswith(
        f"nothing changed on group ray: node-0: {named}: a multi-node vLLM group gets neither the API key file nor the "
        "host's nginx front (its units would not start, or not be reachable); leave it out for group ray")
    assert not [a for _, a in log if a[0] == "systemctl" or a[:2] == ("sh", "-c") and a[4:5] == ("write",)]
    assert not (tmp_path / "keys").exists()  # no key made for a run that cannot use it


def test_a_multinode_group_with_a_host_that_does_not_answer_says_which_and_changes_none(tmp_path, monkeypatch):
    from hosttune.errors import TransportError

    hosts = [h for h in inventory(tmp_path).hosts if h.group == "ray"]
    log: list = []
    transports = {h.name: ScriptedTransport(h.name, log, ray_nodes=3) for h in hosts}

    def gather(transport, **_):
        if transport is transports["node-1"]:
            raise TransportError("node-1: ssh: connect to host node-1 port 22: Connection timed out")
        return type("Run", (), {"facts": a100_facts()})()

    monkeypatch.setattr(multinode, "open_transport", lambda spec, **kw: transports[spec.host_name])
    monkeypatch.setattr(multinode, "gather", gather)
    outcomes = multinode.deploy_group(hosts, rollout.DeployRequest("vllm", "/m", tmp_path / "wh", "0-3"), rollout.make_job)
    assert [o.state for o in outcomes] == ["failed", "unreachable", "failed"]
    assert outcomes[1].error.startswith("node-1: ssh: connect")
    assert outcomes[0].error == "nothing changed on group ray: node-1 did not answer"
    assert not [a for _, a in log if a[0] == "systemctl"]


def test_cli_refuses_a_host_without_systemd(monkeypatch, tmp_path):
    monkeypatch.setattr(rollout, "gather", lambda t, **_: type("Run", (), {"facts": h200_facts()})())
    result = runner.invoke(app, ["deploy", "--engine", "custom", "--gpus", "0", "--model", "/tmp/none", "-w", str(tmp_path)])
    assert result.exit_code == 2
    assert "nothing changed: localhost: PID 1 is 'process_api', not systemd" in result.stdout
    result = runner.invoke(app, ["deploy", "--gpus", "0"])
    assert result.exit_code == 2
    assert "which engine and model to serve? Give --engine and --model, or declare deploy.engine and deploy.model" \
        in result.output



def untouched(monkeypatch) -> list:
    """Hosts the CLI would open; a usage error must open none."""
    opened: list = []
    monkeypatch.setattr(rollout, "open_transport", lambda spec, **kw: opened.append(spec) or ScriptedTransport("x", []))
    return opened


@pytest.mark.parametrize("port", ["0", "70000"])
def test_cli_a_port_out_of_range_is_a_usage_error(monkeypatch, tmp_path, port):
    opened = untouched(monkeypatch)
    result = runner.invoke(app, ["deploy", "--engine", "custom", "--model", "/m", "--port", port, "--dry-run"],
                           env={"COLUMNS": "250"})
    assert result.exit_code == 2 and not opened
    bound = "greater than or equal to 1" if port == "0" else "less than or equal to 65535"
    assert result.stderr == f"hosttune deploy: --port {port}: input should be {bound} (see hosttune deploy --help)\n"


@pytest.mark.parametrize("args, message", [
    (["--canary-slo", "e2e=2s"], "hosttune: --canary-slo e2e=2s measures the canaries: give --canary N too"),
    (["--canary", "1", "--canary-slo", "e2e"], "hosttune: SLO term 'e2e': use ttft=..., tpot=... or e2e=..."),
    (["--canary", "1", "--canary-slo", "e2e=2s", "--canary-duration", "soon"], "hosttune: --canary-duration 'soon': "),
    (["--canary", "1", "--canary-slo", "e2e=2s", "--canary-duration", "0s"],
     "hosttune: --canary-duration 0s: give a positive time, e.g. 1s\n"),  # its own name, not bench's --duration
])
def test_cli_a_canary_slo_is_checked_before_any_plan_even_in_a_dry_run(monkeypatch, tmp_path, args, message):
    opened = untouched(monkeypatch)
    result = runner.invoke(app, ["deploy", "--engine", "custom", "--model", "/m", "--dry-run", *args])
    assert result.exit_code == 2 and result.output.startswith(message) and len(result.output.splitlines()) == 1
    assert not opened


@pytest.mark.parametrize("item, key", [("env.FOO=a\nb", "env.FOO"), ("served-model-name=a\rb", "served-model-name"),
                                       ("env.FOO=a\tb", "env.FOO"), ("env.FOO=a\x1bb", "env.FOO")])
def test_cli_a_set_value_with_a_control_character_is_refused_naming_its_key(monkeypatch, item, key):
    """YAML would fold 'a\nb' to 'a b', and a unit's Environment= or ExecStart= line holds one line of text."""
    opened = untouched(monkeypatch)
    result = runner.invoke(app, ["deploy", "--engine", "custom", "--model", "/m", "--dry-run", "--set", item])
    assert result.exit_code == 2 and not opened and len(result.output.splitlines()) == 1
    assert result.output.startswith(f"hosttune: --set {key}: the value holds a control character")


@pytest.mark.parametrize("args, option", [
    (["--canary", "1", "--canary-rate", "5"], "--canary-rate"),
    (["--canary-duration", "2m"], "--canary-duration"),
])
def test_cli_a_canary_bench_setting_without_the_bench_is_refused_not_ignored(monkeypatch, args, option):
    """The canary bench runs only with --canary-slo: its rate or duration alone would change nothing."""
    opened = untouched(monkeypatch)
    result = runner.invoke(app, ["deploy", "--engine", "custom", "--model", "/m", "--dry-run", *args])
    assert result.exit_code == 2 and not opened and result.output == (
        f"hosttune: {option} sets the canary bench, which only --canary-slo runs: give --canary-slo (and --canary N) "
        f"too, or drop {option}\n")


@pytest.mark.parametrize("model", ["org/m\nx", "/m\rx", "/m\0x"])
def test_cli_a_model_no_unit_file_can_hold_is_refused_before_any_host_is_read(monkeypatch, model):
    """A line break in --model (a Hugging Face id for vLLM is never read on the host) would reach the unit file."""
    opened = untouched(monkeypatch)
    result = runner.invoke(app, ["deploy", "--engine", "vllm", "--model", model, "--dry-run"])
    assert result.exit_code == 2 and not opened and result.output == (
        f"hosttune: --model {model!r}: give the model folder on the hosts (or a model id for vLLM and SGLang), on one "
        f"line\n")


def test_cli_an_empty_gpus_is_an_error_not_every_gpu(monkeypatch):
    opened = untouched(monkeypatch)
    result = runner.invoke(app, ["deploy", "--engine", "custom", "--model", "/m", "--gpus", " ", "--dry-run"])
    assert result.exit_code == 2 and not opened and result.output == (
        "hosttune: --gpus '': give GPU indices such as 0-3 or 0,2, or leave --gpus out for the inventory's gpus\n")


def test_cli_a_failure_budget_without_batches_is_refused_not_ignored(monkeypatch):
    opened = untouched(monkeypatch)
    result = runner.invoke(app, ["deploy", "--engine", "custom", "--model", "/m", "--max-fail-percent", "10", "--dry-run"])
    assert result.exit_code == 2 and not opened and result.output == (
        "hosttune: --max-fail-percent stops starting batches once too many hosts failed, and without --serial every "
        "host is in one batch: give --serial N too\n")


@pytest.mark.parametrize("gpus", ["0-x", "3-1", ",,", "gpu0"])
def test_cli_a_gpus_list_that_does_not_parse_is_refused_before_any_host_is_read(monkeypatch, gpus):
    opened = untouched(monkeypatch)  # on a CPU deployment (device=cpu) no host would ever parse it
    result = runner.invoke(app, ["deploy", "--engine", "custom", "--model", "/m", "--gpus", gpus, "--set", "device=cpu",
                                 "--dry-run"])
    assert result.exit_code == 2 and not opened
    assert result.output.startswith(f"hosttune: --gpus {gpus!r}: ") and len(result.output.splitlines()) == 1


def test_cli_a_canary_slo_without_the_bench_extra_is_refused_before_any_plan(monkeypatch):
    from hosttune.bench import extra

    opened = untouched(monkeypatch)
    monkeypatch.setattr(extra, "find_spec", lambda name: None if name == "aiohttp" else object())
    result = runner.invoke(app, ["deploy", "--engine", "custom", "--model", "/m", "--canary", "1", "--canary-slo", "e2e=2s"])
    assert result.exit_code == 2 and not opened
    assert result.output == "hosttune: hosttune bench needs aiohttp: pip install 'hosttune[bench]'\n"


def test_cli_rollback_refuses_options_it_would_ignore(monkeypatch, tmp_path):
    opened = untouched(monkeypatch)
    result = runner.invoke(app, ["deploy", "--rollback", "--serial", "1", "--replicas", "2", "--set", "a=b", "--dry-run"])
    assert result.exit_code == 2 and not opened
    assert result.output == ("hosttune: --rollback makes each host's previous release live again, as it was and on every "
                             "host at once; it takes no --replicas, --serial, --set: drop them\n")
    result = runner.invoke(app, ["deploy", "--rollback", "--dry-run", "--warmup", "1", "-w", str(tmp_path)])
    assert "it takes no" not in result.output and opened  # its own options, and the local folders, are taken


def test_the_bundled_engine_needs_an_absolute_model_folder(tmp_path):
    fake_entry(tmp_path / "wh", "custom", archs=())
    host = inventory(tmp_path).hosts[0]
    with pytest.raises(DeployError, match="gpu-a: the bundled engine serves a model folder: give --model its absolute "
                                          "path on the host \\(got 'models/qwen'\\)"):
        rollout.make_job(host, a100_facts(), rollout.DeployRequest("custom", "models/qwen", tmp_path / "wh", "0"))


def test_session_affinity_and_the_prefix_router_together_are_refused(tmp_path):
    fake_entry(tmp_path / "wh", "custom", archs=())
    host = inventory(tmp_path).hosts[0]
    request = rollout.DeployRequest("custom", "/m", tmp_path / "wh", "0-1", session_affinity=True, router=True)
    with pytest.raises(DeployError, match="gpu-a: session affinity and the prefix router each choose the replica"):
        rollout.make_job(host, a100_facts(), request)
    assert rollout.make_job(host, a100_facts(), replace(request, session_affinity=False)).settings.router


def test_the_recap_marks_what_was_taken_away_only_where_it_was_or_will_be(tmp_path):
    host = inventory(tmp_path).hosts[0]
    gone = ("removes 2 of the 4 replicas",)
    for state, shown in ((Outcome.PLANNED, True), (Outcome.DEPLOYED, True), (Outcome.FAILED, False)):
        outcome = dhost.HostDeploy(host, state, "custom-new", "custom-old", error="gate failed at health: boom",
                                   restored="custom-old" if state is Outcome.FAILED else None, removals=gone)
        assert ("! removes 2 of the 4 replicas" in render([outcome])) is shown, state


def test_a_multinode_group_deployed_with_another_engine_serves_host_by_host(tmp_path, monkeypatch):
    inv = inventory(tmp_path)
    ray = type(inv)(tuple(h for h in inv.hosts if h.group == "ray"), "x")
    fake_entry(tmp_path / "wh", "sglang")
    monkeypatch.setattr(rollout, "open_transport", lambda spec, **kw: ScriptedTransport(spec.host_name, []))
    monkeypatch.setattr(rollout, "gather", lambda t, **_: type("Run", (), {"facts": a100_facts()})())
    request = rollout.DeployRequest("sglang", "Qwen/Qwen2.5-7B", tmp_path / "wh", "0", dry_run=True)
    outcomes = rollout.deploy_fleet(ray, request)
    assert [o.state for o in outcomes] == [Outcome.PLANNED] * 3, [o.error for o in outcomes]
    assert all("hosttune-serve.service" in "\n".join(o.ops) and "ray" not in "\n".join(o.ops) for o in outcomes)
    assert groups.rollout_units(ray, "vllm") == [list(ray.hosts)]

def test_batches_stop_once_the_failure_budget_is_spent(tmp_path, monkeypatch):
    inv = fleet_of(tmp_path, 4)
    ran: list[str] = []

    def single(host, request):
        ran.append(host.name)
        return dhost.HostDeploy(host, Outcome.FAILED if host.name == "h1" else Outcome.DEPLOYED, "r", "r")

    monkeypatch.setattr(rollout, "_single", single)
    request = rollout.DeployRequest("sglang", "/m", tmp_path, serial=1, max_fail_percent=60)
    assert [o.state for o in rollout.deploy_fleet(inv, request)] == ["deployed", "failed", "deployed", "deployed"]
    ran.clear()
    outcomes = rollout.deploy_fleet(inv, replace(request, max_fail_percent=40))  # 1 of 2 failed: 50% > 40%
    assert ran == ["h0", "h1"] and [o.state for o in outcomes] == ["deployed", "failed", "skipped", "skipped"]
    assert "more than 40% of hosts failed" in outcomes[2].error


def test_build_arch_auto_probes_the_fleet(tmp_path, monkeypatch):
    from hosttune.build import builder
    from hosttune.build.errors import BuildError
    from hosttune.probes.facts import GpuFacts, GpuInfo

    h100 = Facts(gpu=GpuFacts(gpus=(GpuInfo(0, "H100", "0000:01:00.0", compute_cap="9.0"),)))
    caps = {"gpu-a": a100_facts(), "gpu-b": h100}
    inv = inventory(tmp_path).limit("a100")
    monkeypatch.setattr(builder, "probe", lambda host: (caps[host.name], None))
    assert builder.fleet_archs(inv) == ("8.0", "9.0")
    monkeypatch.setattr(builder, "probe", lambda host: (Facts(), None))
    with pytest.raises(BuildError, match="no host .* reported a GPU"):
        builder.fleet_archs(inv)

    def unreachable(host):
        raise TransportError(f"{host.name}: 10.0.0.11:22: connection refused (is sshd running, and on this port?)")

    monkeypatch.setattr(builder, "probe", unreachable)
    with pytest.raises(BuildError) as refused:
        builder.fleet_archs(inv)
    assert str(refused.value) == ("--arch auto: cannot read the GPUs of gpu-a (gpu-a: 10.0.0.11:22: connection refused (is "
                                  "sshd running, and on this port?)); pass the archs with --arch, or --limit the hosts "
                                  "that answer")


def test_a_failed_install_changes_nothing_live(tmp_path):
    job = job_for(tmp_path)
    log: list = []

    class FailingPip(ScriptedTransport):
        def _command(self, argv, stdin, timeout):
            result = super()._command(argv, stdin, timeout)
            if "install" in argv and any(a.endswith("/bin/pip") for a in argv):  # `env TMPDIR=... pip` from an index
                return CommandResult(tuple(argv), 1, "", "ERROR: No matching distribution found for torch", 0.0)
            return result

    t = FailingPip("gpu-a", log, state="current:/opt/hosttune/releases/vllm-old\n")
    outcome = dhost.deploy_one(t, job)
    assert outcome.state == "failed" and outcome.serving == "vllm-old" and "No matching distribution" in outcome.error
    assert not any(a[:1] == ("systemctl",) or (a[:2] == ("sh", "-c") and a[4] == "link") for _, a in log)
    assert "nothing live changed (the live release is still vllm-old)" in render([outcome])


def test_help_says_where_each_default_comes_from():
    deploy_help = " ".join(runner.invoke(app, ["deploy", "--help"], env={"COLUMNS": "250"}).output.split())
    for text in ("(default: the inventory's deploy.warmup, else 3)", "(default: the inventory's deploy.health_timeout, else 600)",
                 "(default: the inventory's deploy.gate_timeout, else 60)", "failed (default: no limit; needs --serial)",
                 "made by the first deploy, not by --dry-run", "hosttune-GROUP.conf for nginx", "With --canary: a hosttune bench"):
        assert text in deploy_help, text
    build_help = " ".join(runner.invoke(app, ["build", "--help"], env={"COLUMNS": "250"}).output.split())
    assert "custom is pure Python: Triton compiles on the host" in build_help
    assert "or the cached entry a build would reuse" in build_help and "(with --deps)" in build_help


@pytest.mark.parametrize("serial, canary, budget, slo, line", [
    (None, 0, None, None, None),  # all at once: nothing more to say than the plan line
    (9, 0, 10.0, None, None),  # one batch holds them all: all at once too
    (2, 0, None, None, "rollout: a, b then c, d then e (batches of 2)"),
    (2, 0, 10.0, None, "rollout: a, b then c, d then e (batches of 2); no batch starts once more than 10% of the hosts "
                       "tried failed"),
    (None, 1, None, None, "rollout: the canary a first; b, c, d, e only once it is deployed"),
    (None, 1, None, "e2e=2s", "rollout: the canary a first; b, c, d, e only once it is deployed and meets --canary-slo "
                              "e2e=2s"),
    (2, 2, None, "e2e=2s", "rollout: the canaries a, b first; c, d then e (batches of 2) only once they are deployed "
                           "and meet --canary-slo e2e=2s"),
    (None, 5, None, None, "rollout: the canaries a, b, c, d, e first"),
])
def test_the_plan_says_in_what_order_the_hosts_roll(serial, canary, budget, slo, line):
    from hosttune.deploy.recap import rollout_line

    assert rollout_line([["a"], ["b"], ["c"], ["d"], ["e"]], serial, canary, budget, slo) == line


def test_a_plan_with_no_host_ready_says_no_rollout_order():
    """--canary or --serial when every host's plan failed: no order to tell, not an empty 'rollout:' line."""
    from hosttune.deploy.recap import rollout_line

    assert rollout_line([], None, 3, None, None) is None and rollout_line([], 2, 0, 10.0, None) is None


def test_cli_a_dry_run_with_canaries_and_batches_prints_the_rollout_order(monkeypatch):
    from hosttune.cli import deploy as deploy_cli
    from hosttune.config.inventory import local_inventory

    host = local_inventory().hosts[0]
    monkeypatch.setattr(deploy_cli, "deploy_fleet", lambda inv, request, **kw: [
        dhost.HostDeploy(host, Outcome.PLANNED, "custom-1", None, ops=("start hosttune-serve.service",))])
    result = runner.invoke(app, ["deploy", "--engine", "custom", "--model", "/m", "--dry-run", "--canary", "1",
                                 "--serial", "1"])
    assert result.exit_code == 0, result.output
    assert result.output.splitlines()[-2:] == ["rollout: the canary localhost first", "plan: deploy to 1 of 1 host"]


def test_deploy_probes_each_host_within_the_inventorys_probe_timeout(tmp_path, monkeypatch):
    """A host whose probe takes 200 s (probe_timeout: 240) is probed by deploy as by check, single or in a group."""
    inv = inventory(tmp_path)
    slow = type(inv)(tuple(replace(h, probe_timeout_s=240.0) for h in inv.hosts), "x")
    seen: dict[str, float] = {}

    def gather(transport, *a, timeout=None, **kw):
        seen[transport.host_name] = timeout
        return type("Run", (), {"facts": a100_facts()})()

    for module in (rollout, multinode):
        monkeypatch.setattr(module, "open_transport", lambda spec, **kw: ScriptedTransport(spec.host_name, []))
        monkeypatch.setattr(module, "gather", gather)
    fake_entry(tmp_path / "wh")
    rollout.deploy_fleet(slow, rollout.DeployRequest("vllm", "/m", tmp_path / "wh", "0-3", dry_run=True))
    assert seen == {h.name: 240.0 for h in slow.hosts}


def test_rolling_back_a_ray_worker_plans_no_gate_the_run_never_runs(tmp_path):
    """A Ray worker's release has no server: its rollback restarts Ray and gates nothing (the head's server is the
    group's), and its plan says so, where it promised a gate of hosttune-serve.service on the worker."""
    from hosttune.deploy.rollback import rollback_one
    from hosttune.deploy.settings import ServeSettings

    worker, _ = release_for(tmp_path, role=Role("worker", 2, "10.0.1.11", "10.0.1.10"))
    assert set(worker.units) == {RAY_UNIT}
    log: list = []
    t = ScriptedTransport("node-1", log, state=f"current:/opt/hosttune/releases/vllm-now\nprevious:{worker.dir}\n")
    t.files[f"{worker.dir}/.hosttune/release.json"] = worker.manifest()
    t.files.update({f"{worker.dir}/.hosttune/{name}": body for name, body in worker.units.items()})
    host = next(h for h in inventory(tmp_path).hosts if h.name == "node-1")
    planned = rollback_one(t, host, ServeSettings("", "", 1, {}, {}), dry_run=True)
    assert planned.ops == (f"make {worker.id} live again in place of vllm-now (the Ray worker: no gate here, the "
                           "head's server is the group's)",)
    outcome = rollback_one(t, host, ServeSettings("", "", 1, {}, {}))
    assert outcome.state == "rolled-back" and not any(a[:2] == ("python3", "-c") for _, a in log)


@pytest.mark.parametrize("args", [[], ["--limit", "gpu-a"], ["--limit", "gpu-a", "--rollback"]])
def test_a_multinode_key_that_is_not_true_or_false_is_one_line_naming_it(tmp_path, args):
    """deploy.multinode: "false" (quoted) read as true: with --limit the run was refused for taking part of a
    multi-node group that the inventory never declared; now the key itself is named, before any host."""
    from deploy_fixtures import group_inventory

    inventory = group_inventory(tmp_path, 'engine: vllm\nmodel: /m\nmultinode: "false"\n')
    result = CliRunner().invoke(app, ["deploy", "-i", str(inventory), "--dry-run", *args])
    assert result.exit_code == 2, result.output
    assert result.output.strip().endswith("deploy.multinode must be true or false (got 'false')"), result.output


def ray_rollback_group(tmp_path, monkeypatch, log: list, gate_ok=True, alone=False):
    """The ray group over scripted hosts, each live on a release of port 8001 with the group's release of port 8000
    before it as `previous` (node-0 the Ray head of both; alone: releases that serve host by host, no Ray)."""
    from hosttune.deploy import group_rollback

    inv = inventory(tmp_path)
    hosts = [h for h in inv.hosts if h.group == "ray"]
    group_roles, preset, entry = multinode.roles(hosts), load_preset("vllm"), fake_entry(tmp_path / "wh")
    releases = {}
    for h in hosts:
        for port in (8000, 8001):
            settings = resolve(inv.hosts[0], preset, "/m", port, parse_sets([]))
            releases[h.name, port] = make_release(preset, settings, place("0-3", a100_facts(), "h"), entry,
                                                  Role() if alone else group_roles[h.name])
    transports = {}
    for h in hosts:
        older, live = releases[h.name, 8000], releases[h.name, 8001]
        t = ScriptedTransport(h.name, log, gate_ok=gate_ok, state=f"current:{live.dir}\nprevious:{older.dir}\n", ray_nodes=3)
        for release in (older, live):
            t.files[f"{release.dir}/.hosttune/release.json"] = release.manifest()
            t.files.update({f"{release.dir}/.hosttune/{name}": body for name, body in release.units.items()})
        transports[h.name] = t
    for module in (rollout, group_rollback):
        monkeypatch.setattr(module, "open_transport", lambda spec, **kw: transports[spec.host_name])
    return inv.limit("ray"), releases


def _ray_events(log: list) -> list:
    """Each restart, `ray status` on the head and gate, in the order the hosts saw them."""
    return [(h, a[2] if a[1] == "restart" else "ray status" if a[0].endswith("/bin/ray") else "gate") for h, a in log
            if a[:2] == ("systemctl", "restart") or a[0].endswith("/bin/ray")
            or a[:2] == ("python3", "-c") and "UNKNOWN" not in a[2]]


def test_rolling_back_a_multinode_group_starts_the_ray_head_then_the_workers_then_the_server_as_deploy_does(
        tmp_path, monkeypatch):
    """--rollback rolled every host of a multi-node group back on its own and at once: the head restarted Ray and its
    server together and was gated while the workers' Ray restarted, without `ray status`. Now it goes in deploy's order
    and waits, and its plan shows them."""
    from hosttune.deploy.settings import Timeouts

    log: list = []
    inv, releases = ray_rollback_group(tmp_path, monkeypatch, log)
    planned = rollout.rollback_fleet(inv, Timeouts(), dry_run=True)
    assert [o.state for o in planned] == ["planned"] * 3 and not [a for _, a in log if a[0] == "systemctl"]
    head = planned[0].ops
    phases = [op.split("] ")[0] + "]" for op in head]
    assert phases == sorted(phases, key=["[start the Ray head]", "[start the Ray workers]",
                                         "[start the server on the head]"].index)  # in the run's order
    assert head[phases.index("[start the Ray workers]") - 1] == \
        "[start the Ray head] wait until `ray status` on node-0 counts 1 node (at most 300 s)"
    assert head[phases.index("[start the Ray workers]")] == \
        "[start the Ray workers] wait until `ray status` on node-0 counts 3 nodes (at most 300 s)"
    assert head[-1].startswith("[start the server on the head] gate hosttune-serve.service: /health within ")
    assert head[-1].endswith("on failure every host of the group goes back to the release it left")
    assert f"[start the Ray head] $ systemctl restart {RAY_UNIT}" in head
    assert f"[start the Ray workers] $ systemctl restart {RAY_UNIT}" in planned[1].ops
    assert not [op for o in planned[1:] for op in o.ops if "gate" in op or SERVE_UNIT in op]
    log.clear()
    done = rollout.rollback_fleet(inv, Timeouts())
    assert [(o.state, o.serving) for o in done] == [("rolled-back", releases[h.name, 8000].id) for h in inv.hosts]
    events = _ray_events(log)
    assert events[:2] == [("node-0", RAY_UNIT), ("node-0", "ray status")]
    assert sorted(events[2:4]) == [("node-1", RAY_UNIT), ("node-2", RAY_UNIT)]
    assert events[4:] == [("node-0", "ray status"), ("node-0", SERVE_UNIT), ("node-0", "gate")]


def test_cli_a_rollback_limit_that_splits_a_group_whose_releases_are_a_ray_group_is_refused_without_an_engine(
        tmp_path, monkeypatch):
    """The inventory's ray group sets deploy.multinode but no deploy.engine: --rollback --limit node-0,node-1 planned
    a Ray group of two hosts, node-2 left running a worker of the old one. The releases decide: refused in one line
    naming the group and the hosts left out; releases that serve host by host still go back per host."""
    log: list = []
    inv, _ = ray_rollback_group(tmp_path, monkeypatch, log)
    args = ["deploy", "--rollback", "--dry-run", "-i", str(tmp_path / "inventory.yaml"), "--limit", "node-0,node-1"]
    result = runner.invoke(app, args)
    assert result.exit_code == 2 and result.output == (
        "hosttune: --limit node-0,node-1 leaves node-2 out of group ray, whose releases are a multi-node vLLM group "
        "(a Ray head and its workers) that goes back as one: limit to all of its hosts or to none\n"), result.output
    assert not [a for _, a in log if a[0] == "systemctl"]
    log.clear()
    ray_rollback_group(tmp_path / "alone", monkeypatch, log, alone=True)
    result = runner.invoke(app, [*args[:4], str(tmp_path / "alone" / "inventory.yaml"), *args[5:]])
    assert result.exit_code == 0 and "multi-node" not in result.output, result.output
    assert {h for h, _ in log} == {"node-0", "node-1"}


def test_a_multinode_rollback_whose_gate_fails_brings_back_what_it_left_in_the_same_order(tmp_path, monkeypatch):
    from hosttune.deploy.settings import Timeouts

    log: list = []
    inv, releases = ray_rollback_group(tmp_path, monkeypatch, log, gate_ok=False)
    done = rollout.rollback_fleet(inv, Timeouts())
    assert [(o.state, o.restored) for o in done] == [("failed", releases[h.name, 8001].id) for h in inv.hosts]
    assert "gate failed at health: boom" in done[0].error and done[0].journal == "engine: model not found"
    events = _ray_events(log)
    failed = events.index(("node-0", "gate"))
    assert events[failed + 1:failed + 3] == [("node-0", RAY_UNIT), ("node-0", "ray status")]
    assert sorted(events[failed + 3:failed + 5]) == [("node-1", RAY_UNIT), ("node-2", RAY_UNIT)]
    assert events[failed + 5:] == [("node-0", "ray status"), ("node-0", SERVE_UNIT), ("node-0", "gate")]
    last = {h: a[6] for h, a in log if a[:2] == ("sh", "-c") and a[4] == "link" and a[5] == "/opt/hosttune/previous"}
    assert last == {h.name: releases[h.name, 8000].dir for h in inv.hosts}  # `previous` names the one it tried


def test_a_multinode_deploy_whose_gate_fails_puts_the_group_back_in_order_and_gates_it(tmp_path, monkeypatch):
    """A failed group deploy restarted each host's old release at once, workers before their head, gated nothing and
    still said 'put back and serving'; `previous` was left naming the release that came back. Now the group comes
    back in deploy's order, is gated on the head, and serves only if that gate passes."""
    log: list = []
    hosts, transports = ray_group(tmp_path, monkeypatch, log)
    old = _live_on_old_releases(tmp_path, hosts, transports)
    for t in transports.values():
        t.gate_ok = False
    outcomes = multinode.deploy_group(hosts, rollout.DeployRequest("vllm", "/m", tmp_path / "wh", "0-3"), rollout.make_job)
    assert [(o.state, o.restored, o.serving) for o in outcomes] == [("failed", old[h.name].id, None) for h in hosts]
    assert "NOT serving" in render(outcomes)
    events = _ray_events(log)
    failed = events.index(("node-0", "gate"))
    assert events[failed + 1:failed + 3] == [("node-0", RAY_UNIT), ("node-0", "ray status")]
    assert sorted(events[failed + 3:failed + 5]) == [("node-1", RAY_UNIT), ("node-2", RAY_UNIT)]
    assert events[failed + 5:] == [("node-0", "ray status"), ("node-0", SERVE_UNIT), ("node-0", "gate")]
    previous = [(h, a[4]) for h, a in log if a[:2] == ("sh", "-c") and a[4] in ("link", "remove")
                and a[5] == "/opt/hosttune/previous"]
    assert previous[-3:] and all(what == "remove" for _, what in previous[-3:])  # none was named before the deploy


def test_a_failed_multinode_deploy_restarts_a_host_whose_release_did_not_change_rather_than_stopping_it(
        tmp_path, monkeypatch):
    """A worker already live on the release the deploy gives it had its Ray stopped when the head's gate failed, so
    the group put back could not serve; it comes back in the group's order like the others."""
    from hosttune.deploy.model import read_model

    log: list = []
    hosts, transports = ray_group(tmp_path, monkeypatch, log)
    request = rollout.DeployRequest("vllm", "/m", tmp_path / "wh", "0-3")
    group_roles, preset, entry = multinode.roles(hosts), load_preset("vllm"), fake_entry(tmp_path / "old-wh")
    for h in hosts:
        t = transports[h.name]
        if h.name == "node-2":  # live on the very release this deploy gives it
            release = rollout.make_job(h, a100_facts(), request, group_roles[h.name], model=read_model(t, "/m")).release
        else:
            settings = resolve(h, preset, "/m", 8001, parse_sets([]))
            release = make_release(preset, settings, place("0-3", a100_facts(), "h"), entry, group_roles[h.name])
        t.gate_ok = False
        _make_live(t, release)
    planned = multinode.deploy_group(hosts, replace(request, dry_run=True), rollout.make_job)
    assert planned[2].release == release_name(transports["node-2"].state.strip().removeprefix("current:"))
    log.clear()
    multinode.deploy_group(hosts, request, rollout.make_job)
    assert not [a for h, a in log if h == "node-2" and a[:2] == ("systemctl", "disable")]
    failed = _ray_events(log).index(("node-0", "gate"))
    assert ("node-2", RAY_UNIT) in _ray_events(log)[failed:]


def _live_on_old_releases(tmp_path, hosts, transports) -> dict:
    """Each host of the ray group live on a release of the group's (port 8001), its release.json readable."""
    group_roles, preset, entry = multinode.roles(hosts), load_preset("vllm"), fake_entry(tmp_path / "old-wh")
    old = {}
    for h in hosts:
        settings = resolve(h, preset, "/m", 8001, parse_sets([]))
        old[h.name] = make_release(preset, settings, place("0-3", a100_facts(), "h"), entry, group_roles[h.name])
        _make_live(transports[h.name], old[h.name])
    return old


def _make_live(t, release) -> None:
    """The host's current release is `release`, its release.json and units readable."""
    t.state = f"current:{release.dir}\n"
    t.files[f"{release.dir}/.hosttune/release.json"] = release.manifest()
    t.files.update({f"{release.dir}/.hosttune/{n}": body for n, body in release.units.items()})


def test_a_multinode_plan_says_a_hosts_live_release_whose_release_json_is_unreadable_cannot_come_back(
        tmp_path, monkeypatch):
    """One host's live release.json gone: the plan promised every host would go back to the release it had, where a
    failed gate leaves that host's release unread and the group comes back host by host; it says so, as the
    single-host plan does."""
    log: list = []
    hosts, transports = ray_group(tmp_path, monkeypatch, log)
    old = _live_on_old_releases(tmp_path, hosts, transports)
    del transports["node-1"].files[f"{old['node-1'].dir}/.hosttune/release.json"]
    request = rollout.DeployRequest("vllm", "/m", tmp_path / "wh", "0-3", dry_run=True)
    planned = multinode.deploy_group(hosts, request, rollout.make_job)
    assert planned[0].ops[-1].endswith("on failure each host goes back on its own to the release it had, ungated; on "
                                       "node-1 the release live before cannot come back, its release.json unreadable")
    assert not [a for _, a in log if a[0] == "systemctl"]


def test_a_multinode_plan_says_what_a_failed_gate_leads_to_where_a_host_had_nothing_live(tmp_path, monkeypatch):
    """A group's first deploy planned 'every host of the group goes back to the release it had' while a failed gate
    stops the units it started, as the run does; a host with nothing live before is said the same way."""
    log: list = []
    hosts, transports = ray_group(tmp_path, monkeypatch, log)
    request = rollout.DeployRequest("vllm", "/m", tmp_path / "wh", "0-3", dry_run=True)
    first = multinode.deploy_group(hosts, request, rollout.make_job)
    assert first[0].ops[-1].endswith("on failure the group's units are stopped and disabled (nothing was live before)")
    old = _live_on_old_releases(tmp_path, hosts, transports)
    transports["node-2"].state = ""
    some = multinode.deploy_group(hosts, request, rollout.make_job)
    assert some[0].ops[-1].endswith("on failure each host goes back on its own to the release it had, ungated, and "
                                    "node-2, which had none, stops its units")
    transports["node-2"].state = f"current:{old['node-2'].dir}\n"
    every = multinode.deploy_group(hosts, request, rollout.make_job)
    assert every[0].ops[-1].endswith("on failure every host of the group goes back to the release it had")
    log.clear()
    transports["node-0"].state = ""
    for t in transports.values():
        t.gate_ok = False
    done = multinode.deploy_group(hosts, replace(request, dry_run=False), rollout.make_job)
    assert [a for h, a in log if h == "node-0" and a[:3] == ("systemctl", "disable", "--now")]
    assert [o.state for o in done] == ["failed"] * 3
