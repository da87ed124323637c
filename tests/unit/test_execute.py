"""Execute: the host-side file operations, the executor and rollback on a --root directory,
the journal, undo lists as data, and fleet batching. Everything writes under tmp_path only."""

import hashlib
import os
import time
from dataclasses import replace

import pytest

from hosttune.actions.base import Command, CommentOut, FileWrite, KernelWrite, Remove, Step, Symlink
from hosttune.execute import rollout
from hosttune.execute.journal import Journal, JournalStep, OpRecord, journal_path, new_run_id
from hosttune.execute.reboot import parse_boot_marker
from hosttune.execute.remote import hostops, hostops_script, write_file
from hosttune.execute.rollback import pick_journal, rollback_host, undo_list
from hosttune.execute.runner import execute_plan
from hosttune.fleet_runner import Outcome, batches, exit_code, over_budget
from hosttune.probes.facts import Facts
from hosttune.config.inventory import Host
from hosttune.plan.host_plan import HostPlan, PlanOptions, build_plan
from hosttune.plan.state import read_state, requests_for
from hosttune.config.profile import load_profile
from hosttune.transport.base import CommandResult, ConnectionSpec
from hosttune.transport.local import LocalTransport

HOST = Host("h", "g", ConnectionSpec("h"))
LATENCY = load_profile("inference-latency")


@pytest.fixture
def local():
    return LocalTransport()


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# -- hostops.sh ---------------------------------------------------------------------------


def test_write_is_atomic_keeps_owner_and_mode_and_backs_up(local, tmp_path):
    target = tmp_path / "etc/app.conf"
    target.parent.mkdir()
    target.write_bytes(b"old\n")
    target.chmod(0o600)
    backup = tmp_path / "backup/0-0-app.conf"
    result = write_file(local, str(target), b"new\n", 0o644, backup=str(backup), expected=sha(b"old\n"))
    assert result.ok, result.stderr
    assert target.read_bytes() == b"new\n" and target.stat().st_mode & 0o777 == 0o600
    assert backup.read_bytes() == b"old\n" and backup.stat().st_mode & 0o777 == 0o600
    assert write_file(local, str(target), b"newer\n", 0o644, backup=str(backup)).ok
    assert backup.read_bytes() == b"old\n"  # the first backup is kept
    fresh = tmp_path / "new/dir/file"
    assert write_file(local, str(fresh), b"x", 0o640).ok and fresh.stat().st_mode & 0o777 == 0o640


def test_truncated_content_leaves_the_file_untouched(local, tmp_path):
    """What a dropped connection looks like to the host: stdin ends early. Nothing is renamed into place."""
    target = tmp_path / "f"
    target.write_bytes(b"original\n")
    content = b"the whole new content\n" * 100
    argv = ["sh", "-c", hostops_script(), "hosttune", "write",
            str(target), "0644", sha(content), "", ""]
    result = local.change(argv, stdin=content[: len(content) // 2])
    assert not result.ok and "did not arrive whole" in result.stderr
    assert target.read_bytes() == b"original\n"
    assert [p.name for p in tmp_path.iterdir()] == ["f"]  # no temporary file left behind


def test_write_refuses_a_file_changed_since_the_plan(local, tmp_path):
    target = tmp_path / "f"
    target.write_bytes(b"someone else's edit\n")
    result = write_file(local, str(target), b"ours\n", 0o644, expected=sha(b"what we planned against\n"))
    assert not result.ok and "changed since the plan" in result.stderr
    assert target.read_bytes() == b"someone else's edit\n"


def test_link_restore_remove_move(local, tmp_path):
    (tmp_path / "cuda-12.4").mkdir()
    (tmp_path / "cuda-11.8").mkdir()
    link = tmp_path / "cuda"
    link.symlink_to("cuda-11.8")
    assert hostops(local, "link", str(link), str(tmp_path / "cuda-12.4"), str(tmp_path / "bk/cuda")).ok
    assert os.readlink(link) == str(tmp_path / "cuda-12.4") and os.readlink(tmp_path / "bk/cuda") == "cuda-11.8"
    assert hostops(local, "restore", str(link), str(tmp_path / "bk/cuda")).ok and os.readlink(link) == "cuda-11.8"
    assert hostops(local, "move", str(tmp_path / "cuda-11.8"), str(tmp_path / "bk/cuda-11.8")).ok
    assert not (tmp_path / "cuda-11.8").exists() and (tmp_path / "bk/cuda-11.8").is_dir()
    assert hostops(local, "move", str(tmp_path / "bk/cuda-11.8"), str(tmp_path / "cuda-11.8")).ok
    assert hostops(local, "restore", str(tmp_path / "x"), str(tmp_path / "missing"), "optional").ok
    assert not hostops(local, "restore", str(tmp_path / "x"), str(tmp_path / "missing")).ok
    assert not hostops(local, "remove", str(tmp_path / "cuda-12.4")).ok  # never a directory


# -- executor and rollback, for real, on a --root directory -------------------------------


def tree(root) -> dict[str, str]:
    out = {}
    for p in sorted(root.rglob("*")):
        rel = str(p.relative_to(root))
        if rel.split("/")[0] == "var":  # the journal and backups stay, by design
            continue
        out[rel] = ("link:" + os.readlink(p)) if p.is_symlink() else (sha(p.read_bytes()) + oct(p.stat().st_mode)) if p.is_file() else "dir"
    return out


def image(tmp_path):
    root = tmp_path / "img"
    (root / "etc/sysctl.d").mkdir(parents=True)
    (root / "etc/sysctl.d/95-site.conf").write_bytes(b"vm.swappiness = 10\nkernel.numa_balancing = 1\n")
    (root / "etc/sysctl.d/95-site.conf").chmod(0o640)
    (root / "usr/local/cuda-12.4").mkdir(parents=True)
    (root / "usr/local/cuda-11.8/bin").mkdir(parents=True)
    (root / "usr/local/cuda").symlink_to("/usr/local/cuda-11.8")
    return root


STEPS = [
    Step(("numa.topology",), "numa", (FileWrite("/etc/sysctl.d/90-hosttune.conf", b"kernel.numa_balancing = 0\n"),
                                      CommentOut("/etc/sysctl.d/95-site.conf", "kernel.numa_balancing"),
                                      KernelWrite(("/proc/sys/kernel/numa_balancing",), "0"))),
    Step(("cuda.toolkit",), "cuda", (Symlink("/usr/local/cuda", "/usr/local/cuda-12.4"),
                                     FileWrite("/etc/profile.d/hosttune-cuda.sh", b"export CUDA_HOME=/usr/local/cuda\n"))),
    Step(("cuda.toolkit",), "prune", (Remove("/usr/local/cuda-11.8"),), opt_in="prune-cuda"),
]


def plan_for(local, root, steps=STEPS) -> HostPlan:
    options = PlanOptions(root=str(root), opt_ins=frozenset({"prune-cuda"}))
    state = read_state(local, requests_for(steps, str(root)), root=str(root), manager=None)
    return build_plan(HOST, LATENCY, Facts(), [], state, options, steps)


def test_apply_then_rollback_under_root_is_byte_for_byte(local, tmp_path):
    root = image(tmp_path)
    before = tree(root)
    plan = plan_for(local, root)
    assert [s.summary for s in plan.steps] == ["numa", "cuda", "prune"]
    assert any("live kernel write skipped" in n for n in plan.steps[0].notes)
    run = new_run_id()
    result = execute_plan(local, plan, run)
    assert result.status == "changed" and result.changed == 3, result
    assert (root / "etc/sysctl.d/90-hosttune.conf").read_bytes() == b"kernel.numa_balancing = 0\n"
    assert b"# kernel.numa_balancing = 1" in (root / "etc/sysctl.d/95-site.conf").read_bytes()
    assert (root / "etc/sysctl.d/95-site.conf").stat().st_mode & 0o777 == 0o640
    assert os.readlink(root / "usr/local/cuda") == "/usr/local/cuda-12.4" and not (root / "usr/local/cuda-11.8").exists()
    journal = Journal.from_json((root / journal_path(run).lstrip("/")).read_text())
    assert journal.status == "done" and [s.status for s in journal.steps] == ["done"] * 3
    assert journal.steps[0].ops[0].existed is False and journal.steps[0].ops[1].backup
    assert (root / journal_path(run).lstrip("/")).stat().st_mode & 0o777 == 0o600

    again = plan_for(local, root)
    assert not again.steps  # idempotent: nothing left to do

    back = rollback_host(local, HOST, None, str(root))
    assert back.status == "restored", back
    assert tree(root) == before
    assert Journal.from_json((root / journal_path(run).lstrip("/")).read_text()).rolled_back
    assert rollback_host(local, HOST, None, str(root)).status == "nothing"


def test_rollback_of_a_root_that_is_not_there_or_unreadable_journals_is_a_failure_not_nothing(local, tmp_path):
    """A mistyped --root, or a journal folder that cannot be read, must not read as "nothing to roll back"."""
    missing = rollback_host(local, HOST, None, str(tmp_path / "no-such-image"), dry_run=True)
    assert missing.status == "failed" and missing.exit_bits == 2
    assert missing.error == f"--root {tmp_path / 'no-such-image'}: no such directory on this host; give the folder the image is mounted at"
    root = tmp_path / "img"
    (root / "var/lib/hosttune").mkdir(parents=True)
    (root / "etc").mkdir()
    (root / "var/lib/hosttune/runs").write_text("not a folder")
    unreadable = rollback_host(local, HOST, None, str(root))
    assert unreadable.status == "failed" and "cannot read the journal folder" in unreadable.error
    (root / "var/lib/hosttune/runs").unlink()
    assert rollback_host(local, HOST, None, str(root)).status == "nothing"  # no journal folder yet: no run


def test_an_older_run_is_not_rolled_back_over_a_later_one(local, tmp_path):
    """r1 and r2 both wrote 90-hosttune.conf: undoing r1 first would put r1's backup over r2's change."""
    root = image(tmp_path)
    before = tree(root)
    assert execute_plan(local, plan_for(local, root), "r1").status == "changed"
    again = [Step(("numa.topology",), "numa", (FileWrite("/etc/sysctl.d/90-hosttune.conf", b"kernel.numa_balancing = 1\n"),))]
    assert execute_plan(local, plan_for(local, root, again), "r2").status == "changed"
    refused = rollback_host(local, HOST, "r1", str(root), dry_run=True)
    assert refused.status == "failed" and refused.error.startswith("run r1 was followed by r2, not rolled back")
    elsewhere = [Step(("x",), "x", (FileWrite("/etc/elsewhere.conf", b"x\n"),))]
    assert execute_plan(local, plan_for(local, root, elsewhere), "r3").status == "changed"  # touches none of r1's files
    (root / "etc/elsewhere.conf").unlink()  # (so the tree compares equal at the end)
    assert "followed by r2," in rollback_host(local, HOST, "r1", str(root), dry_run=True).error
    assert rollback_host(local, HOST, "r1", str(root)).status == "failed"  # nor for real
    assert rollback_host(local, HOST, "r2", str(root)).status == "restored"
    assert rollback_host(local, HOST, "r1", str(root)).status == "restored"
    assert tree(root) == before


class _Answering(LocalTransport):
    """This machine for the journal's host operations under a temporary root; one scripted command's answer."""

    def __init__(self, answer):
        super().__init__()
        self.answer = answer

    def _command(self, argv, stdin, timeout):
        if "dcgmi" in argv:  # (under --root, behind chroot ROOT)
            return self.answer
        return super()._command(argv, stdin, timeout)


def test_an_exit_0_whose_stderr_names_a_failure_word_fails_the_step_in_apply_too(tmp_path):
    """dcgmi diag exits 0 and says Fail: the executor that apply and remediation share must not call it done."""
    from hosttune.transport.base import CommandResult

    root = image(tmp_path)
    diag = Command(("dcgmi", "diag", "-r", "2", "-i", "0"), fail_on_stderr=("Fail",))
    plan = replace(plan_for(LocalTransport(), root, []), steps=(Step(("gpu.diag",), "diagnose", (diag,)),))
    said = CommandResult(diag.argv, 0, "", "Memory test: Fail\n", 0.1)
    result = execute_plan(_Answering(said), plan, "r1")
    assert result.status == "failed" and "Memory test: Fail" in result.error
    journal = Journal.from_json((root / journal_path("r1").lstrip("/")).read_text())
    assert journal.steps[0].ops[0].status == "failed"
    assert execute_plan(_Answering(replace(said, stderr="")), plan, "r2").status == "changed"


def test_remediations_diagnosis_fails_on_a_fail_row_of_dcgmis_table_on_stdout(tmp_path):
    from hosttune.actions.remediate import diagnose_ops
    from hosttune.transport.base import CommandResult

    root = image(tmp_path)
    diag = replace(diagnose_ops(0)[0], offline=True)  # run in the test's image root, not skipped there
    plan = replace(plan_for(LocalTransport(), root, []), steps=(Step(("gpu.diag",), "diagnose", (diag,)),))
    table = ("+---------------------------+----------------+\n| Diagnostic                | Result         |\n"
             "| Deployment                | Pass           |\n| Memory                    | {}           |\n")
    said = CommandResult(diag.argv, 0, table.format("Fail"), "", 0.1)
    result = execute_plan(_Answering(said), plan, "r1")
    assert result.status == "failed" and "| Memory" in result.error
    assert execute_plan(_Answering(replace(said, stdout=table.format("Pass"))), plan, "r2").status == "changed"


def test_failing_step_stops_the_plan_and_the_journal_says_where(local, tmp_path):
    root = image(tmp_path)
    (root / "etc/profile.d").mkdir()
    (root / "etc/profile.d/hosttune-cuda.sh").mkdir()  # a directory where a file must go
    steps = STEPS[:2] + [Step(("x",), "never reached", (FileWrite("/etc/never", b"x"),))]
    plan = plan_for(local, root, steps)
    assert [s.summary for s in plan.blocked] == ["cuda"]  # the plan already sees it
    bad = replace(plan, steps=(plan.steps[0], Step(("cuda.toolkit",), "cuda", (FileWrite("/etc/profile.d/hosttune-cuda.sh", b"x"),)), plan.steps[1]))
    run = new_run_id()
    result = execute_plan(local, bad, run)
    assert result.status == "failed" and [s.status for s in result.steps] == ["done", "failed", "not run"]
    assert "hosttune-cuda.sh" in result.error
    journal = Journal.from_json((root / journal_path(run).lstrip("/")).read_text())
    assert [s.status for s in journal.steps] == ["done", "failed", "pending"] and journal.status == "failed"
    assert journal.steps[1].error and not (root / "etc/never").exists()


def test_a_failed_runs_recap_lists_what_it_changed_and_the_command_that_undoes_it(local, tmp_path):
    from hosttune.execute.recap import outcome_dict, render as render_recap

    root = image(tmp_path)
    before = tree(root)
    (root / "etc/profile.d").mkdir()
    (root / "etc/profile.d/hosttune-cuda.sh").mkdir()  # a directory where the cuda step's file must go
    cuda = Step(("cuda.toolkit",), "cuda", (Symlink("/usr/local/cuda", "/usr/local/cuda-12.4"),
                                            FileWrite("/etc/profile.d/hosttune-cuda.sh", b"x")))
    plan = plan_for(local, root, [STEPS[0], cuda])
    bad = replace(plan, steps=(plan.steps[0], cuda))  # the plan saw the directory in the way: run it regardless
    result = execute_plan(local, bad, "r1")
    assert result.status == "failed"
    assert result.changes == ("created /etc/sysctl.d/90-hosttune.conf", "replaced /etc/sysctl.d/95-site.conf",
                              "linked /usr/local/cuda -> /usr/local/cuda-12.4")
    outcome = rollout.HostOutcome(bad, Outcome.FAILED, result, result.error)
    text = render_recap([outcome], "r1", "inv.yaml")
    assert "1 of 2 steps done, step 2 failed after 1 of its 2 operations" in text
    assert "changed before the failure: created /etc/sysctl.d/90-hosttune.conf, replaced" in text
    assert f"undo: hosttune rollback -i inv.yaml --limit h --run r1 --root {root} --yes" in text
    assert outcome_dict(outcome, "inv.yaml")["undo"] == f"hosttune rollback -i inv.yaml --limit h --run r1 --root {root} --yes"
    (root / "etc/profile.d/hosttune-cuda.sh").rmdir()
    (root / "etc/profile.d").rmdir()
    assert rollback_host(local, HOST, "r1", str(root)).status == "restored"
    assert tree(root) == before


# -- journal and undo lists as data -------------------------------------------------------


def test_journal_round_trips():
    j = Journal("r1", "h", "/", "t", (JournalStep(0, ("a",), "s", True, True, (
        OpRecord("kernel", "d", paths=("/p",), value="0", before_values=(("/p", "1"),)),
        OpRecord("command", "c", argv=("apt-mark", "hold", "x"), undo=("apt-mark", "unhold", "x"))), "done"),))
    assert Journal.from_json(j.to_json().decode()) == j


def test_undo_order_services_then_files_then_regenerate_and_created_units_stopped():
    ops = (
        OpRecord("write", "w", path="/etc/systemd/system/u.service", existed=False, status="done"),
        OpRecord("command", "reload", argv=("systemctl", "daemon-reload"), regenerate=True, status="done"),
        OpRecord("service", "enable", unit="u.service", enabled=True, before_enabled="", status="done"),
        OpRecord("kernel", "k", paths=("/sys/kernel/mm/transparent_hugepage/enabled",), value="never",
                 before_values=(("/sys/kernel/mm/transparent_hugepage/enabled", "always [madvise] never"),), status="done"),
    )
    hold = (OpRecord("command", "hold", argv=("apt-mark", "hold", "x"), undo=("apt-mark", "unhold", "x"), status="done"),
            OpRecord("service", "disable", unit="irqbalance.service", enabled=False, running=False,
                     before_enabled="enabled", before_active="active", status="done"))
    j = Journal("r", "h", "/", "t", (JournalStep(0, ("mm.thp",), "thp", False, True, ops, "done"),
                                     JournalStep(1, ("x",), "x", False, False, hold, "done")))
    undo = [(u.argv or u.hostop, u.stdin) for u in undo_list(j)]
    assert undo == [
        (("systemctl", "enable", "irqbalance.service"), None),
        (("systemctl", "start", "irqbalance.service"), None),
        (("apt-mark", "unhold", "x"), None),
        (("tee", "--", "/sys/kernel/mm/transparent_hugepage/enabled"), b"madvise\n"),
        (("systemctl", "stop", "u.service"), None),  # a boot unit may have run since: stopped before it is removed
        (("systemctl", "disable", "u.service"), None),
        (("remove", "/etc/systemd/system/u.service"), None),
        (("systemctl", "daemon-reload"), None),
    ]


def test_undo_of_a_cut_off_step_covers_every_operation_and_skips_unrun_steps():
    w = OpRecord("write", "w", path="/etc/a", existed=True, backup="/b/0-0-a")
    j = Journal("r", "h", "/", "t", (JournalStep(0, ("a",), "a", False, False, (w,), "running"),
                                     JournalStep(1, ("b",), "b", False, False, (replace(w, path="/etc/b"),), "pending")))
    assert [u.hostop for u in undo_list(j)] == [("restore", "/etc/a", "/b/0-0-a", "optional")]


def test_a_made_directory_goes_after_what_was_made_in_it_and_both_are_reported_as_changes():
    from hosttune.execute.undo import changes

    made = OpRecord("dir", "make directory /usr/local", path="/usr/local", created_dirs=("/usr", "/usr/local"), status="done")
    link = OpRecord("link", "l", path="/usr/local/cuda", target="/usr/local/cuda-12.4", existed=False, status="done")
    kernel = OpRecord("kernel", "k", paths=("/sys/x",), value="never", status="failed")
    j = Journal("r", "h", "/", "t", (JournalStep(0, ("a",), "a", False, False, (made, link, kernel), "failed"),))
    assert [u.hostop for u in undo_list(j)] == [("remove", "/usr/local/cuda"), ("rmdirs", "/usr/local", "/usr")]
    assert changes(j) == ("made directories /usr, /usr/local", "linked /usr/local/cuda -> /usr/local/cuda-12.4")


def test_pick_journal():
    a = Journal("20250101T000000Z-a", "h", "/", "t", (JournalStep(0, (), "", False, False, (), "done"),))
    b = replace(a, run="20250102T000000Z-b")
    assert pick_journal([a, b], None) is b
    assert pick_journal([a, replace(b, rolled_back="t")], None) is a
    assert pick_journal([a, b], "20250101T000000Z-a") is a and pick_journal([a], "nope") is None


# -- fleet control --------------------------------------------------------------------------


def fake_plans(names):
    return [HostPlan(Host(n, "g", ConnectionSpec(n)), "p", steps=(Step(("x",), "s", ()),)) for n in names]


@pytest.fixture
def fake_execute(monkeypatch):
    ran = []

    def execute(plan, run):
        ran.append(plan.host.name)
        return rollout.HostOutcome(plan, Outcome.FAILED if plan.host.name.startswith("bad") else Outcome.CHANGED)

    monkeypatch.setattr(rollout, "_execute", execute)
    return ran


def test_serial_batches_and_max_fail_percent(fake_execute):
    plans = fake_plans(["bad1", "ok2", "ok3", "ok4"])
    out = rollout.apply_plans(plans, {}, "r", rollout.ApplyOptions(serial=1, max_fail_percent=0))
    assert fake_execute == ["bad1"] and [o.state for o in out] == ["failed", "skipped", "skipped", "skipped"]
    assert exit_code(out) == 2 | 1
    fake_execute.clear()
    out = rollout.apply_plans(plans, {}, "r", rollout.ApplyOptions(serial=2, max_fail_percent=50))
    assert fake_execute == ["bad1", "ok2", "ok3", "ok4"]  # 1 of 2 is not more than 50%
    fake_execute.clear()
    out = rollout.apply_plans(plans, {}, "r", rollout.ApplyOptions(serial=2, max_fail_percent=49))
    assert fake_execute == ["bad1", "ok2"] and out[2].state == "skipped"
    fake_execute.clear()
    out = rollout.apply_plans(plans, {}, "r", rollout.ApplyOptions())
    assert sorted(fake_execute) == ["bad1", "ok2", "ok3", "ok4"] and [o.state for o in out][1:] == ["changed"] * 3


def test_batches():
    plans = fake_plans("abcde")
    assert [[p.host.name for p in b] for b in batches(plans, 2)] == [["a", "b"], ["c", "d"], ["e"]]
    assert len(batches(plans, None)) == 1


def test_boot_marker_changes_with_boot_id_or_pid1():
    stat = "1 (systemd) S 0 1 1 0 -1 4194560 1 2 3 4 5 6 7 8 20 0 1 0 4242 1000 200"
    assert parse_boot_marker(f"abc\n{stat}\n") == "abc/4242"
    assert parse_boot_marker(f"abc\n{stat.replace('4242', '9999')}\n") != parse_boot_marker(f"abc\n{stat}\n")


def test_recap_text_names_each_host_state():
    from hosttune.execute.recap import render as render_recap
    from hosttune.execute.runner import HostRun, StepOutcome, StepStatus

    plans = fake_plans(["a", "b", "c", "d"])
    outcomes = [
        rollout.HostOutcome(plans[0], Outcome.CHANGED,
                            HostRun(plans[0].host, "r", Outcome.CHANGED, (StepOutcome(0, ("x",), "s", StepStatus.DONE),))),
        rollout.HostOutcome(replace(plans[1], steps=()), Outcome.OK),
        rollout.HostOutcome(plans[2], Outcome.FAILED, error="step 1 exited 1: boom"),
        rollout.HostOutcome(replace(plans[3], reachable=False), Outcome.UNREACHABLE, error="cannot reach"),
    ]
    text = render_recap(outcomes, "r")
    assert "a  changed     1 of 1 steps done" in text and "c  failed      step 1 exited 1: boom" in text
    assert text.splitlines()[-1] == "  changed=1, ok=1, failed=1, unreachable=1, skipped=0, exit 6"


def test_layers_plan_execute_actions_point_one_way():
    """cli → execute → plan → actions; nothing below imports what is above it."""
    import ast
    from pathlib import Path

    pkg = Path(__file__).resolve().parents[2] / "hosttune"
    forbidden = {"actions": ("hosttune.plan.host_plan", "hosttune.execute", "hosttune.cli"),
                 "plan": ("hosttune.execute", "hosttune.cli"), "execute": ("hosttune.cli",)}
    files = {"actions": list((pkg / "actions").glob("*.py")), "plan": list(pkg.glob("plan*.py")),
             "execute": list((pkg / "execute").glob("*.py"))}
    for layer, paths in files.items():
        for path in paths:
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ImportFrom) and node.module:
                    assert not node.module.startswith(forbidden[layer]), f"{path} imports {node.module}"


def test_failure_budget_stays_spent_once_later_batches_are_skipped():
    failed, skipped, ok = Outcome.FAILED, Outcome.SKIPPED, Outcome.OK
    assert over_budget([failed], 40)
    # Skipped hosts were never tried: 1 failure out of 1 tried stays over 40 %.
    assert over_budget([failed, skipped, skipped], 40)
    assert not over_budget([failed, ok, ok], 40)
    assert not over_budget([skipped], 0) and not over_budget([failed], None)


def test_apply_with_reboot_leaves_this_machines_reboot_to_its_operator(monkeypatch):
    """A host of the local transport is the machine hosttune runs on: rebooting it would take hosttune down
    before it could wait for the boot and re-check, so apply never reboots it and the recap says so."""
    from hosttune.config.inventory import local_inventory
    from hosttune.execute import recap

    monkeypatch.setattr(rollout, "reboot_and_wait", lambda *a, **k: pytest.fail("this machine was rebooted"))
    plan = HostPlan(host=local_inventory().hosts[0], profile="inference-latency", pending_reboot=("cpu.cstates",))
    [outcome] = rollout.apply_plans([plan], {}, "run-1", rollout.ApplyOptions(reboot=True))
    assert outcome.state is Outcome.OK and not outcome.rebooted and outcome.exit_bits == 1
    assert "reboot pending: this machine runs hosttune" in recap.render([outcome], "run-1")
    assert recap.outcome_dict(outcome)["reboot_skipped"].endswith("reboot it by hand")


def test_a_rollback_that_failed_can_be_run_again_and_finishes_the_job(local, tmp_path):
    """A failed rollback leaves the run live: leaving --run out takes it again, and --run names it again."""
    root = image(tmp_path)
    before = tree(root)
    assert execute_plan(local, plan_for(local, root), "r1").status == "changed"
    made = root / "etc/profile.d/hosttune-cuda.sh"
    made.unlink()
    made.mkdir()  # remove refuses a directory: this undo fails
    failed = rollback_host(local, HOST, None, str(root))
    assert failed.status == "failed" and "is a directory" in failed.error
    made.rmdir()
    made.write_bytes(b"in the way\n")
    assert rollback_host(local, HOST, None, str(root), dry_run=True).status == "planned"
    assert rollback_host(local, HOST, "r1", str(root)).status == "restored"
    assert tree(root) == before
    assert rollback_host(local, HOST, None, str(root)).status == "nothing"


def test_a_done_write_whose_backup_is_gone_fails_its_rollback_instead_of_reporting_it_restored(local, tmp_path):
    """The write ran, so its backup was made: a missing one (cleaned away) means the file cannot come back."""
    root = image(tmp_path)
    assert execute_plan(local, plan_for(local, root), "r1").status == "changed"
    site = root / "etc/sysctl.d/95-site.conf"
    edited = site.read_bytes()
    for backup in (root / "var/lib/hosttune/runs").glob("*.backup/*-95-site.conf"):
        backup.unlink()
    back = rollback_host(local, HOST, None, str(root))
    assert back.status == "failed" and "95-site.conf is missing" in back.error, back
    assert site.read_bytes() == edited  # left as the run made it, and the failure says so


def test_a_file_edited_since_the_run_is_kept_in_the_runs_backups_before_rollback_puts_back_what_was_there(local, tmp_path):
    root = image(tmp_path)
    before = tree(root)
    assert execute_plan(local, plan_for(local, root), "r1").status == "changed"
    site, ours = root / "etc/sysctl.d/95-site.conf", root / "etc/sysctl.d/90-hosttune.conf"
    site.write_bytes(site.read_bytes() + b"vm.max_map_count = 262144\n")  # someone's edit after the apply
    edited = site.read_bytes()
    plan = rollback_host(local, HOST, None, str(root), dry_run=True)
    kept = [line for line in plan.done if line.startswith("keep")]
    assert kept == ["keep /etc/sysctl.d/95-site.conf as it is now (changed since run r1 wrote it) in "
                    "/var/lib/hosttune/runs/r1.backup/edited-0-1-95-site.conf"]
    assert rollback_host(local, HOST, None, str(root)).status == "restored"
    assert tree(root) == before
    assert (root / "var/lib/hosttune/runs/r1.backup/edited-0-1-95-site.conf").read_bytes() == edited
    assert not ours.exists() and not list((root / "var/lib/hosttune/runs/r1.backup").glob("edited-0-0-*"))


def test_without_run_rollback_takes_the_latest_apply_never_a_later_remediation_or_uncordon_step(local, tmp_path):
    """A cordon that remediate wrote since the apply stays unless its run is named: `hosttune rollback --yes` to undo
    an apply must not put a failing host back into service."""
    root = image(tmp_path)
    before = tree(root)
    assert execute_plan(local, plan_for(local, root), "r1").status == "changed"
    cordon = [Step(("gpu.xid",), "cordon", (FileWrite("/var/lib/hosttune/cordon.json", b"{}\n"),))]
    assert execute_plan(local, plan_for(local, root, cordon), "r2-1", command="remediate").status == "changed"
    assert rollback_host(local, HOST, None, str(root), dry_run=True).run == "r1"
    assert rollback_host(local, HOST, None, str(root)).status == "restored" and tree(root) == before
    assert rollback_host(local, HOST, None, str(root)).status == "nothing"
    assert (root / "var/lib/hosttune/cordon.json").exists()
    assert rollback_host(local, HOST, "r2-1", str(root)).status == "restored"  # named, it is rolled back
    assert not (root / "var/lib/hosttune/cordon.json").exists()


def test_only_a_write_that_ran_has_edits_since_to_keep():
    """A failed write left the file as it was: rollback has nothing of its to keep or restore (an edit since stays),
    nor anything to say about it."""
    w = OpRecord("write", "w", path="/etc/a", existed=True, sha_after="ab" * 32, backup="/b/0-0-a")
    failed = Journal("r", "h", "/", "t", (JournalStep(0, ("a",), "a", False, False, (replace(w, status="failed"),), "failed"),))
    assert [u.hostop[0] for u in undo_list(failed)] == []
    done = Journal("r", "h", "/", "t", (JournalStep(0, ("a",), "a", False, False, (replace(w, status="done"),), "done"),))
    assert [u.hostop[0] for u in undo_list(done)] == ["keep", "restore"]


RELATIVE_WRITE = ('{"index": 0, "fixes": ["a"], "summary": "s", "needs_reboot": false, "is_live_kernel_write": false, '
                  '"status": "done", "ops": [{"kind": "write", "description": "w", "path": "etc/x", "existed": false, '
                  '"status": "done", "paths": [], "argv": [], "created_dirs": [], "undo": null, "before_values": []}]}')


@pytest.mark.parametrize("text", [
    '{"run": "x", broken', '{"run": "x"}', "[]",
    "",  # skipped, as if no run were there
    '{"run": "x", "host": "h", "root": "/", "started": 5, "steps": []}',  # beside another run: an internal error
    '{"run": "x", "host": "h", "root": "/", "started": "t", "steps": [%s]}' % RELATIVE_WRITE,  # "remove etc/x" planned
])
def test_a_damaged_journal_is_that_hosts_one_line_error_not_a_crash(local, tmp_path, text):
    """Under --root the journal to move is the image's, not the build machine's /var/lib/hosttune/runs."""
    root = tmp_path / "img"
    (root / "var/lib/hosttune/runs").mkdir(parents=True)
    (root / "etc").mkdir()
    (root / "var/lib/hosttune/runs/r0.json").write_text(text)
    result = rollback_host(local, HOST, None, str(root), dry_run=True)
    assert result.status == "failed" and result.exit_bits == 2
    assert result.error.startswith(f"{root}/var/lib/hosttune/runs/r0.json: unreadable run journal ("), result.error
    assert result.error.endswith(f"): move it out of {root}/var/lib/hosttune/runs to roll back this host's other runs")


def test_a_run_whose_only_changes_have_no_reverse_says_so_instead_of_an_empty_plan(local, tmp_path):
    """An apply that only installed numactl: rollback removes no package, and its plan and result say that."""
    install = OpRecord("command", "$ apt-get install -y numactl", argv=("apt-get", "install", "-y", "numactl"), status="done")
    failed = replace(install, description="$ apt-get install -y nvtop", status="failed")
    journal = Journal("r1", "h", "/", "t", (JournalStep(0, ("tools.numactl",), "numactl installed", False, False,
                                                        (install, failed), "failed"),))
    root = tmp_path / "img"
    (root / "var/lib/hosttune/runs").mkdir(parents=True)
    (root / "etc").mkdir()
    (root / journal_path("r1").lstrip("/")).write_bytes(journal.to_json())
    said = ("not undone: $ apt-get install -y numactl (rollback has no reverse for a command; undo it by hand)",)
    plan = rollback_host(local, HOST, None, str(root), dry_run=True)
    assert plan.status == "planned" and plan.done == said
    done = rollback_host(local, HOST, None, str(root))
    assert done.status == "restored" and done.done == said


def test_a_run_that_also_installed_packages_says_rollback_keeps_them_beside_what_it_undoes(local, tmp_path):
    """An apply that wrote a file and installed numactl: rollback removes the file and says numactl stays."""
    install = OpRecord("command", "$ apt-get install -y numactl", argv=("apt-get", "install", "-y", "numactl"), status="done")
    write = OpRecord("write", "w", path="/etc/hosttune-x.conf", existed=False, status="done")
    journal = Journal("r1", "h", "/", "t", (JournalStep(0, ("tools.numactl",), "numactl installed", False, False,
                                                        (install,), "done"),
                                            JournalStep(1, ("mm.thp",), "thp", False, False, (write,), "done")))
    root = tmp_path / "img"
    (root / "var/lib/hosttune/runs").mkdir(parents=True)
    (root / "etc").mkdir()
    (root / "etc/hosttune-x.conf").write_text("x\n")
    (root / journal_path("r1").lstrip("/")).write_bytes(journal.to_json())
    kept = "not undone: $ apt-get install -y numactl (rollback has no reverse for a command; undo it by hand)"
    plan = rollback_host(local, HOST, None, str(root), dry_run=True)
    assert plan.status == "planned" and plan.done == ("remove /etc/hosttune-x.conf (hosttune created it)", kept)
    done = rollback_host(local, HOST, None, str(root))
    assert done.status == "restored" and done.done == ("remove /etc/hosttune-x.conf (hosttune created it)", kept)
    assert not (root / "etc/hosttune-x.conf").exists()


def test_rollback_says_which_directories_it_made_it_keeps_because_something_was_put_in_them_since(local, tmp_path):
    root = image(tmp_path)
    plan = replace(plan_for(local, root, []), steps=(Step(("a",), "a", (FileWrite("/etc/hosttune.d/a.conf", b"a\n"),)),))
    assert execute_plan(local, plan, "r1").status == "changed"
    (root / "etc/hosttune.d/site.conf").write_text("the site's own\n")
    planned = rollback_host(local, HOST, "r1", str(root), dry_run=True)
    assert planned.done == ("remove /etc/hosttune.d/a.conf (hosttune created it)",
                            "remove the directories made for it, each if still empty: /etc/hosttune.d")
    done = rollback_host(local, HOST, "r1", str(root))
    assert done.status == "restored" and done.done == (
        "remove /etc/hosttune.d/a.conf (hosttune created it)",
        "remove the directories made for it, each if still empty: /etc/hosttune.d "
        "(kept /etc/hosttune.d: files were put in it since)")
    assert (root / "etc/hosttune.d/site.conf").exists() and not (root / "etc/hosttune.d/a.conf").exists()


def test_rollback_does_not_ask_to_undo_a_package_list_refresh_by_hand():
    """apt-get update (dnf makecache) before an install changed no package: only the install is said to stay."""
    from hosttune.execute.undo import not_reversed

    ops = tuple(OpRecord("command", f"$ {' '.join(argv)}", argv=argv, status="done") for argv in (
        ("apt-get", "update", "-q"), ("dnf", "makecache", "-q"),
        ("env", "DEBIAN_FRONTEND=noninteractive", "apt-get", "install", "-y", "-q", "--no-install-recommends", "numactl")))
    journal = Journal("r1", "h", "/", "t", (JournalStep(0, ("tools.numactl",), "numactl", False, False, ops, "done"),))
    assert not_reversed(journal) == (
        "not undone: $ env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends numactl "
        "(rollback has no reverse for a command; undo it by hand)",)


def test_rollback_leaves_alone_the_file_of_a_write_that_failed_and_so_never_touched_it(local, tmp_path):
    """The write failed before its atomic rename: a file there since (made by hand once the failure was fixed) is
    not the run's, and neither the rollback's plan nor its run removes or restores it."""
    root = image(tmp_path)
    (root / "etc/default").mkdir(exist_ok=True)
    (root / "etc/default/hosttune-b").write_text("in the way\n")  # a file where the second write's directory must be
    steps = [Step(("a",), "a", (FileWrite("/etc/hosttune-a.conf", b"a\n"),)),
             Step(("b",), "b", (FileWrite("/etc/default/hosttune-b/b.conf", b"b\n"),
                                FileWrite("/etc/hosttune-c.conf", b"c\n")))]
    plan = replace(plan_for(local, root, []), steps=tuple(steps))
    assert execute_plan(local, plan, "r1").status == "failed"
    (root / "etc/default/hosttune-b").unlink()
    (root / "etc/default/hosttune-b").mkdir()
    (root / "etc/default/hosttune-b/b.conf").write_text("written by hand since\n")
    planned = rollback_host(local, HOST, "r1", str(root), dry_run=True)
    assert planned.done == ("remove /etc/hosttune-a.conf (hosttune created it)",)
    assert rollback_host(local, HOST, "r1", str(root)).status == "restored"
    assert not (root / "etc/hosttune-a.conf").exists()
    assert (root / "etc/default/hosttune-b/b.conf").read_text() == "written by hand since\n"


def test_a_reboot_the_host_refuses_is_said_at_once_not_waited_for(monkeypatch):
    """sudo without a password, or an inhibitor lock: the host answers from the same boot, so no reboot is coming."""
    from contextlib import contextmanager

    from hosttune.execute import reboot
    from hosttune.transport.base import CommandResult

    stat = "1 (systemd) S " + " ".join(["0"] * 16) + " 4242 0 0"

    class Refusing:
        def read(self, argv, timeout=None):
            return CommandResult(tuple(argv), 0, f"abc\n{stat}\n", "", 0.0)

        def change(self, argv, timeout=None):
            return CommandResult(tuple(argv), 1, "", "sudo: a password is required\n", 0.0)

    monkeypatch.setattr(reboot, "open_transport", contextmanager(lambda spec, read_only=False: (yield Refusing())))
    started = time.monotonic()
    assert reboot.reboot_and_wait(HOST, timeout_s=3, poll_s=0.01) == "not rebooted: sudo: a password is required"
    assert time.monotonic() - started < 1


class _JournalUnwritable(LocalTransport):
    """This machine, except that the run journal cannot be rewritten (a full or read-only /var)."""

    def _command(self, argv, stdin, timeout):
        if "write" in argv and any(str(a).endswith("/runs/r1.json") for a in argv):
            return CommandResult(tuple(argv), 1, "", "hosttune: No space left on device\n", 0.0)
        return super()._command(argv, stdin, timeout)


def test_a_rollback_whose_journal_cannot_be_marked_says_so_and_fails(tmp_path):
    root = image(tmp_path)
    before = tree(root)
    local = LocalTransport()
    assert execute_plan(local, plan_for(local, root), "r1").status == "changed"
    back = rollback_host(_JournalUnwritable(), HOST, None, str(root))
    assert tree(root) == before  # the files came back
    assert back.status == "failed" and back.error.startswith("rolled back, but the journal")
    assert "No space left on device" in back.error and "the next rollback takes this run again" in back.error


def test_a_run_followed_by_a_remediation_step_on_the_same_file_says_to_name_that_step(local, tmp_path):
    """Leaving --run out takes the latest apply, never a remediate step: the refusal must not send the user there."""
    root = image(tmp_path)
    assert execute_plan(local, plan_for(local, root), "r1").status == "changed"
    again = [Step(("numa.topology",), "numa", (FileWrite("/etc/sysctl.d/90-hosttune.conf", b"kernel.numa_balancing = 1\n"),))]
    assert execute_plan(local, plan_for(local, root, again), "r2-1", command="remediate").status == "changed"
    refused = rollback_host(local, HOST, "r1", str(root), dry_run=True)
    assert refused.status == "failed" and "leave --run out" not in refused.error
    # under --root, the command it names is for the image: without --root it looked for the run on the running system
    assert refused.error.endswith(f"roll those back first, the latest first, each by naming it: hosttune rollback "
                                  f"--limit h --run r2-1 --root {root}")
    # the same command line as apply's undo line: the inventory and the host it was given
    refused = rollback_host(local, HOST, "r1", str(root), dry_run=True, inventory="/srv/inv.yaml")
    assert refused.error.endswith(f"each by naming it: hosttune rollback -i /srv/inv.yaml --limit h --run r2-1 --root {root}")


def test_a_relative_root_is_recorded_and_printed_as_its_absolute_path(tmp_path, monkeypatch):
    """The journal and the recap's undo line name the image so that they work from any folder."""
    import json

    from typer.testing import CliRunner

    from hosttune.cli import app

    (tmp_path / "img/etc/default").mkdir(parents=True)
    (tmp_path / "img/etc/default/grub").write_text('GRUB_CMDLINE_LINUX=""\n')
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["apply", "--root", "img", "--yes"])
    assert f"(files under {tmp_path}/img)" in result.output.splitlines()[0], result.output
    [journal] = (tmp_path / "img/var/lib/hosttune/runs").glob("*.json")
    assert json.loads(journal.read_text())["root"] == f"{tmp_path}/img"
    later = CliRunner().invoke(app, ["rollback", "--root", "img", "--dry-run"])
    assert later.exit_code == 0, later.output


def test_a_later_run_in_the_same_second_is_later_whatever_its_random_suffix(tmp_path, monkeypatch):
    """Two applies within one second: the second is the later run, so rolling back the first is refused while the
    second changed the same file, and rollback without --run takes the second."""
    import itertools
    import json

    from typer.testing import CliRunner

    from hosttune.cli import app
    from hosttune.execute import journal

    clock = itertools.count()
    monkeypatch.setattr(journal.time, "time", lambda: 1_800_000_000.1 + next(clock) / 1000)  # one second, ms apart
    suffixes = iter(["ffffff", "000000"])  # the later run's random part sorts first
    monkeypatch.setattr(journal.secrets, "token_hex", lambda n: next(suffixes))
    (tmp_path / "img/etc/default").mkdir(parents=True)
    (tmp_path / "img/etc/default/grub").write_text('GRUB_CMDLINE_LINUX=""\n')
    (tmp_path / "inv.yaml").write_text("hosts:\n  localhost:\n    transport: local\n")
    apply = ["apply", "-i", str(tmp_path / "inv.yaml"), "--root", str(tmp_path / "img"), "--yes", "--format", "json"]
    first = json.loads(CliRunner().invoke(app, apply).stdout)["run"]
    (tmp_path / "img/etc/sysctl.d/90-hosttune.conf").write_text("edited by hand\n")
    later = json.loads(CliRunner().invoke(app, apply).stdout)["run"]
    assert first[:16] == later[:16] and later < first
    rollback = ["rollback", "-i", str(tmp_path / "inv.yaml"), "--root", str(tmp_path / "img"), "--dry-run"]
    refused = CliRunner().invoke(app, [*rollback, "--run", first])
    assert f"--run {later} --root" in refused.stdout, refused.output
    assert f"run {later}" in CliRunner().invoke(app, rollback).stdout.splitlines()[0]


def test_a_relative_inventory_is_named_by_its_absolute_path_in_the_commands_printed(tmp_path, monkeypatch):
    """The command a refusal gives works from any folder, as the run's --root does."""
    import json

    from typer.testing import CliRunner

    from hosttune.cli import app

    (tmp_path / "img/etc/default").mkdir(parents=True)
    (tmp_path / "img/etc/default/grub").write_text('GRUB_CMDLINE_LINUX=""\n')
    (tmp_path / "inv.yaml").write_text("hosts:\n  localhost:\n    transport: local\n")
    monkeypatch.chdir(tmp_path)
    apply = ["apply", "-i", "inv.yaml", "--root", "img", "--yes", "--format", "json"]
    first = json.loads(CliRunner().invoke(app, apply).stdout)["run"]
    (tmp_path / "img/etc/sysctl.d/90-hosttune.conf").write_text("edited by hand\n")
    later = json.loads(CliRunner().invoke(app, apply).stdout)["run"]
    refused = CliRunner().invoke(app, ["rollback", "-i", "inv.yaml", "--root", "img", "--run", first, "--dry-run"])
    assert refused.stdout.rstrip().endswith(f"each by naming it: hosttune rollback -i {tmp_path}/inv.yaml --limit localhost "
                                            f"--run {later} --root {tmp_path}/img"), refused.output
