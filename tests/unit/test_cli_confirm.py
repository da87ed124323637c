"""The one confirmation grammar of the commands that change hosts (apply, rollback, deploy, deploy
--rollback, remediate, uncordon), through typer's CliRunner: the plan is printed; --dry-run only shows it; --yes acts;
a terminal is asked; without a terminal and without --yes nothing changes (one line, exit 2)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from typer.testing import CliRunner

from hosttune.actions.base import FileWrite, Step
from hosttune.cli import apply as apply_cli
from hosttune.cli import common
from hosttune.cli import deploy as deploy_cli
from hosttune.cli import remediate as remediate_cli
from hosttune.cli.app import app
from hosttune.config.inventory import local_inventory
from hosttune.deploy.host import HostDeploy
from hosttune.execute.rollback import RollbackResult
from hosttune.execute.rollout import HostOutcome
from hosttune.fleet_runner import Outcome
from hosttune.plan.host_plan import HostPlan
from hosttune.remediate.climb import HostRemediation
from hosttune.remediate.cordon import Uncordon
from hosttune.remediate.faults import Fault, FaultKind
from hosttune.remediate.rungs import Rung
from hosttune.remediate.state import Cordon, HostSnapshot
from hosttune.remediate.survey import Survey

runner = CliRunner()
HOST = local_inventory().hosts[0]
REFUSED = "nothing changed: no terminal to confirm on; run again with --yes"


@pytest.fixture
def acted(monkeypatch, request):
    """Fakes behind each command: the plan they read, and a list of what they were asked to change."""
    done: list[str] = []
    plan = HostPlan(HOST, "inference-latency", steps=(Step(("x",), "write the marker", (FileWrite("/etc/x", b"x"),)),))
    monkeypatch.setattr(apply_cli, "plan_fleet", lambda inv, wanted, options, on_host_done=None: [plan])
    monkeypatch.setattr(apply_cli, "profiles", lambda inv: {})

    def apply_plans(plans, wanted, run, options, on_host_done=None):
        done.append("apply")
        return [HostOutcome(p, Outcome.CHANGED) for p in plans]

    def rollback_fleet(inv, run, root, forks, on_host_done=None, dry_run=False, inventory_path=None):
        if not dry_run:
            done.append("rollback")
        return [RollbackResult(HOST, "r1", Outcome.RESTORED if not dry_run else Outcome.PLANNED,
                               ("restore /etc/x from its backup",))]

    def deploy_fleet(inv, request, on_batch=None, canary_check=None, on_host_done=None):
        if not request.dry_run:
            done.append("deploy")
        state = Outcome.PLANNED if request.dry_run else Outcome.DEPLOYED
        outcomes = [HostDeploy(HOST, state, "custom-1", None, ops=("start hosttune-serve.service",))]
        if on_batch and not request.dry_run:
            on_batch(outcomes)
        return outcomes

    def deploy_rollback(inv, timeouts, forks, on_host_done=None, dry_run=False):
        if not dry_run:
            done.append("deploy --rollback")
        return [HostDeploy(HOST, Outcome.PLANNED if dry_run else Outcome.ROLLED_BACK, "custom-0", "custom-1",
                           ops=("make custom-0 live again in place of custom-1 (the service)",))]

    monkeypatch.setattr(apply_cli, "apply_plans", apply_plans)
    monkeypatch.setattr(apply_cli, "rollback_fleet", rollback_fleet)
    monkeypatch.setattr(deploy_cli, "deploy_fleet", deploy_fleet)
    monkeypatch.setattr(deploy_cli, "rollback_fleet", deploy_rollback)
    command = request.node.callspec.params.get("name") if hasattr(request.node, "callspec") else None
    remediations(monkeypatch, done, cordoned=command == "uncordon")
    return done


DOWN = Fault(FaultKind.UNIT_DOWN, "serve.units", (Rung.RESTART,), "hosttune-engine@0.service is failed",
             unit="hosttune-engine@0.service")


def remediations(monkeypatch, done: list[str], cordoned: bool) -> None:
    """remediate finds a failed replica unit on the host; uncordon finds the host cordoned."""
    snapshot = HostSnapshot(cordon=Cordon(0.0, "GPU0 fell off the bus", "r0")) if cordoned else HostSnapshot()
    survey = Survey(HOST, "inference-latency", faults=(DOWN,), snapshot=snapshot)

    def remediate_fleet(due, ctx, forks, on_host_done=None):
        done.append("remediate")
        return [HostRemediation(s) for s in due]

    def uncordon_host(survey, run):
        done.append("uncordon")
        return Uncordon(survey, True, run)

    monkeypatch.setattr(remediate_cli, "survey_fleet", lambda inv, wanted, policy, forks, on_host_done=None: [survey])
    monkeypatch.setattr(remediate_cli, "state_fleet", lambda inv, forks: [survey])
    monkeypatch.setattr(remediate_cli, "remediate_fleet", remediate_fleet)
    monkeypatch.setattr(remediate_cli, "uncordon_host", uncordon_host)


COMMANDS = {
    "apply": (["apply"], "write the marker"),
    "rollback": (["rollback"], "restore /etc/x from its backup"),
    "deploy": (["deploy", "--engine", "custom", "--model", "/m"], "start hosttune-serve.service"),
    "deploy --rollback": (["deploy", "--rollback"], "make custom-0 live again in place of custom-1"),
    "remediate": (["remediate"], "hosttune-engine@0.service is failed"),
    "uncordon": (["uncordon"], "GPU0 fell off the bus"),
}


@pytest.mark.parametrize("name", COMMANDS)
def test_without_a_terminal_and_without_yes_nothing_changes(acted, name):
    argv, plan_line = COMMANDS[name]
    result = runner.invoke(app, argv)
    assert result.exit_code == 2 and acted == []
    assert plan_line in result.stdout  # the plan was shown
    assert REFUSED in result.stderr and len(result.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("name", COMMANDS)
def test_dry_run_only_shows_the_plan(acted, name):
    argv, plan_line = COMMANDS[name]
    result = runner.invoke(app, [*argv, "--dry-run"])
    assert acted == [] and plan_line in result.stdout, result.output
    # apply's and remediate's bits are check's: 1, the drift or fault the plan would fix is left
    assert result.exit_code == (1 if name in ("apply", "remediate") else 0)


@pytest.mark.parametrize("name", COMMANDS)
def test_yes_shows_the_plan_then_acts(acted, name):
    argv, plan_line = COMMANDS[name]
    result = runner.invoke(app, [*argv, "--yes"])
    assert result.exit_code == 0, result.output
    assert acted == [name] and plan_line in result.stdout


@pytest.mark.parametrize("name", COMMANDS)
@pytest.mark.parametrize("answer, changes", [("y\n", True), ("n\n", False)])
def test_a_terminal_is_asked(acted, monkeypatch, name, answer, changes):
    monkeypatch.setattr(common, "is_terminal", lambda: True)
    argv, _ = COMMANDS[name]
    result = runner.invoke(app, argv, input=answer)
    assert "[y/N]" in result.stderr
    assert (acted == [name]) is changes and result.exit_code == (0 if changes else 2)


@pytest.fixture
def takes_away(monkeypatch, acted):
    """deploy's plan removes one of the host's two replicas."""
    plain = deploy_cli.deploy_fleet

    def deploy_fleet(inv, request, **kwargs):
        return [replace(o, removals=("removes 1 of the 2 replicas",)) for o in plain(inv, request, **kwargs)]

    monkeypatch.setattr(deploy_cli, "deploy_fleet", deploy_fleet)
    return acted


def test_a_deploy_that_takes_something_away_needs_yes_even_on_a_terminal(takes_away, monkeypatch):
    acted = takes_away
    monkeypatch.setattr(common, "is_terminal", lambda: True)
    result = runner.invoke(app, COMMANDS["deploy"][0], input="y\n")
    assert "! removes 1 of the 2 replicas" in result.stdout
    assert result.exit_code == 2 and acted == [] and "[y/N]" not in result.stderr
    assert ("nothing changed: the plan takes replicas, the nginx front or the API key away from localhost (marked !); "
            "run again with --yes") in result.stderr


def test_with_serial_each_batch_is_one_line_and_the_recap_comes_once(acted):
    result = runner.invoke(app, [*COMMANDS["deploy"][0], "--serial", "1", "--yes"])
    assert result.exit_code == 0, result.output
    assert "batch done: localhost deployed" in result.stderr
    recap = [line for line in result.output.splitlines() if line.startswith("localhost") and "deployed" in line]
    assert len(recap) == 1, result.output


def test_with_yes_a_deploy_that_takes_something_away_says_so_and_goes_ahead(takes_away):
    result = runner.invoke(app, [*COMMANDS["deploy"][0], "--yes"])
    assert result.exit_code == 0 and takes_away == ["deploy"]
    assert "plan: deploy to 1 of 1 host; 1 of them lose what is marked !" in result.stdout


def test_a_plan_with_nothing_to_do_changes_nothing_and_asks_nothing(acted, monkeypatch):
    monkeypatch.setattr(apply_cli, "plan_fleet", lambda inv, wanted, options, on_host_done=None: [HostPlan(HOST, "p")])
    monkeypatch.setattr(deploy_cli, "deploy_fleet", lambda inv, request, **kwargs: [
        HostDeploy(HOST, Outcome.UNCHANGED, "custom-1", "custom-1")])
    for argv in (["apply"], COMMANDS["deploy"][0]):
        result = runner.invoke(app, argv)
        assert result.exit_code == 0 and acted == [], result.output
        assert "nothing changed" not in result.stderr and "[y/N]" not in result.stderr


EMPTY_ROOT = ("--root '' names no directory: give the folder the image is mounted at, or leave --root out to change "
              "the running system")


@pytest.mark.parametrize("argv, message", [
    (["apply", "--root", "", "--yes"], EMPTY_ROOT),
    (["apply", "--root", " ", "--reboot", "--yes"], EMPTY_ROOT.replace("''", "' '")),
    (["rollback", "--root", "", "--yes"], EMPTY_ROOT),
    (["rollback", "--run", "", "--yes"], "--run '' names no run: give a run apply's recap printed, or leave --run out "
                                         "for each host's latest"),
])
def test_an_empty_root_or_run_is_an_error_not_the_running_system_or_the_latest_run(acted, argv, message):
    """`--root "$IMAGE"` or `--run "$RUN"` with the variable unset must not change the live hosts or undo their latest run."""
    result = runner.invoke(app, argv)
    assert result.exit_code == 2 and acted == [] and result.stdout == ""
    assert result.stderr.strip() == f"hosttune: {message}"


@pytest.mark.parametrize("name", ["apply", "remediate"])
def test_with_json_a_terminal_is_asked_about_the_plan_it_was_shown(acted, monkeypatch, name):
    monkeypatch.setattr(common, "is_terminal", lambda: True)
    argv, plan_line = COMMANDS[name]
    result = runner.invoke(app, [*argv, "--format", "json"], input="n\n")
    assert "[y/N]" in result.stderr and result.exit_code == 2 and acted == []
    shown, _ = json.JSONDecoder().raw_decode(result.stdout)  # (the runner echoes the answer after it)
    assert plan_line in result.stdout and shown["dry_run"] is True, result.output
    done = runner.invoke(app, [*argv, "--format", "json", "--yes"])
    assert json.loads(done.stdout)["dry_run"] is False  # with --yes, the recap alone


def test_reboot_with_an_image_is_an_error_and_root_slash_is_the_running_system(acted, monkeypatch):
    """An image has no boot to wait for; `--root /` is this system, whose --reboot must not be dropped."""
    seen = []
    monkeypatch.setattr(apply_cli, "plan_fleet", lambda inv, wanted, options, on_host_done=None: seen.append(options) or [])
    result = runner.invoke(app, ["apply", "--root", "/srv/img", "--reboot", "--yes"])
    assert result.exit_code == 2 and acted == [] and not seen
    assert result.stderr.strip() == ("hosttune: --reboot reboots running hosts, and --root /srv/img is an image: "
                                     "leave one of them out")
    runner.invoke(app, ["apply", "--root", "/", "--reboot", "--dry-run"])
    assert seen and seen[0].root is None and seen[0].reboot
