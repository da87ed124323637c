"""Plans as data: actions resolved against the current state; diffs; the state script's parser."""

import subprocess
from dataclasses import replace

import pytest

from hosttune.actions.base import Command, CommentOut, FileWrite, KernelWrite, Remove, Packages, Service, Step, Symlink
from hosttune.actions import steps_for
from hosttune.actions.platform import GRUB_DROPIN
from hosttune.checks import run_checks
from hosttune.probes.facts import Facts
from hosttune.checks.findings import Status
from hosttune.config.inventory import Host
from hosttune.plan.host_plan import PlanOptions, build_plan
from hosttune.plan.resolve import comment_out, kernel_value_holds, matches_pin, resolve_step
from hosttune.plan.render import plan_dict, render
from hosttune.plan.state import FileState, PackageState, State, UnitState, parse_state, requests_for, sha256, state_script
from hosttune.probes.gather import parse_probe_output
from hosttune.config.profile import KernelSpec, load_profile
from hosttune.transport.base import ConnectionSpec

HOST = Host("h", "g", ConnectionSpec("h"))
LATENCY = load_profile("inference-latency")
ONLINE = PlanOptions()


def file_state(path, content: bytes, mode=0o644):
    return FileState(path, "file", mode=mode, uid=0, gid=0, sha256=sha256(content), content=content)


def step(*ops, **kw):
    return Step(("x",), "test", tuple(ops), **kw)


# -- resolving -------------------------------------------------------------------------------


def test_matches_pin():
    assert matches_pin("535.129.03-0ubuntu1", "535.129.03")
    assert matches_pin("3:535.129.03-1.el9", "535.129.03")
    assert matches_pin("2.10-3", "2.10") and matches_pin("2.10", "2.10")
    assert not matches_pin("2.100-1", "2.10") and not matches_pin("535.129.030-1", "535.129.03")


def test_kernel_values_compare_like_the_kernel_prints_them():
    assert kernel_value_holds("/sys/kernel/mm/transparent_hugepage/enabled", "always [madvise] never", "madvise")
    assert not kernel_value_holds("/sys/kernel/mm/transparent_hugepage/enabled", "[always] madvise never", "madvise")
    assert kernel_value_holds("/proc/irq/42/smp_affinity_list", "1-2", "0-3")
    assert not kernel_value_holds("/proc/irq/42/smp_affinity_list", "0-15", "0-3")
    assert not kernel_value_holds("/proc/sys/kernel/numa_balancing", None, "0")


def test_what_already_holds_is_dropped():
    content = b"kernel.numa_balancing = 0\n"
    state = State(files={"/etc/a": file_state("/etc/a", content), "/usr/local/cuda": FileState("/usr/local/cuda", "dir", link="/usr/local/cuda-12.4")},
                  units={"irqbalance.service": UnitState("irqbalance.service", "disabled", "inactive")},
                  kernel={"/proc/sys/kernel/numa_balancing": "0"})
    s = step(FileWrite("/etc/a", content), Command(("update-grub",), regenerate=True), Symlink("/usr/local/cuda", "/usr/local/cuda-12.4"),
             Service("irqbalance.service", False, False), KernelWrite(("/proc/sys/kernel/numa_balancing",), "0"),
             Remove("/usr/local/cuda-11.8"))
    assert resolve_step(s, state) is None


def test_changes_are_kept_minimal():
    state = State(files={"/etc/a": file_state("/etc/a", b"old\n", 0o600)},
                  units={"irqbalance.service": UnitState("irqbalance.service", "enabled", "inactive")},
                  kernel={"/proc/irq/1/smp_affinity_list": "0-3", "/proc/irq/2/smp_affinity_list": "0-15"})
    s = step(FileWrite("/etc/a", b"new\n"), Command(("update-grub",), regenerate=True), Service("irqbalance.service", False, False),
             KernelWrite(("/proc/irq/1/smp_affinity_list", "/proc/irq/2/smp_affinity_list"), "0-3"))
    resolved = resolve_step(s, state)
    assert resolved.ops == (FileWrite("/etc/a", b"new\n"), Command(("update-grub",), regenerate=True),
                            Service("irqbalance.service", False, None),
                            KernelWrite(("/proc/irq/2/smp_affinity_list",), "0-3"))
    assert resolved.ops[2].argv == ("systemctl", "disable", "irqbalance.service")


def test_regenerate_only_when_its_files_change():
    content = b"x\n"
    state = State(files={GRUB_DROPIN: file_state(GRUB_DROPIN, content)}, units={"u.service": UnitState("u.service", "disabled", "inactive")})
    s = step(FileWrite(GRUB_DROPIN, content), Command(("update-grub",), regenerate=True), Service("u.service", True))
    assert resolve_step(s, state).ops == (Service("u.service", True, None),)


def test_writes_go_through_symlinks_and_refuse_directories():
    state = State(files={"/etc/sysctl.d/99-sysctl.conf": replace(file_state("/etc/sysctl.d/99-sysctl.conf", b"a=1\n"),
                                                                link="../sysctl.conf", real="/etc/sysctl.conf"),
                         "/etc/d": FileState("/etc/d", "dir")})
    (op,) = resolve_step(step(CommentOut("/etc/sysctl.d/99-sysctl.conf", "a")), state).ops
    assert op.path == "/etc/sysctl.conf" and op.content == b"# a=1  # disabled by hosttune (see /etc/sysctl.d/90-hosttune.conf)\n"
    plan = build_plan(HOST, LATENCY, Facts(), [], state, ONLINE, [step(FileWrite("/etc/d", b"x"))])
    assert not plan.steps and "is a directory" in plan.blocked[0].blocked


def test_comment_out_keeps_everything_else():
    text = b"# note\nvm.swappiness = 10\nkernel.numa_balancing = 1\n kernel/numa_balancing=1\n;kernel.numa_balancing = 1\n"
    out = comment_out(text, "kernel.numa_balancing").decode().splitlines()
    assert out[:2] == ["# note", "vm.swappiness = 10"] and out[2].startswith("# kernel.numa_balancing = 1")
    assert out[3].startswith("#  kernel/numa_balancing=1") and out[4] == ";kernel.numa_balancing = 1"


def test_packages_resolve_to_exact_versions_and_missing_holds():
    state = State(packages={"hello": PackageState("hello", None, ("2.10-3", "2.9-1")),
                            "numactl": PackageState("numactl", "2.0.16-1", ("2.0.16-1",))}, held=("numactl",))
    resolved = resolve_step(step(Packages("apt", ("hello",), "2.10", hold=True), Packages("apt", ("numactl",), hold=True)), state)
    refresh, install, hold = resolved.ops
    assert refresh.argv == ("apt-get", "update", "-q")
    assert install.argv[-1] == "hello=2.10-3" and "numactl" not in install.argv[-2:]
    assert hold == Command(("apt-mark", "hold", "hello"), undo=("apt-mark", "unhold", "hello"))
    done = State(packages={"hello": PackageState("hello", "2.10-3")}, held=("hello",))
    assert resolve_step(step(Packages("apt", ("hello",), "2.10", hold=True)), done) is None


def test_a_pin_nobody_offers_is_blocked_not_failed():
    state = State(packages={"nvidia-driver-535": PackageState("nvidia-driver-535", None, ("535.54.03-1",))})
    plan = build_plan(HOST, LATENCY, Facts(), [], state, ONLINE, [step(Packages("apt", ("nvidia-driver-535",), "535.129.03"))])
    assert not plan.steps
    assert "no nvidia-driver-535 535.129.03 in the package lists (available: 535.54.03-1)" in plan.blocked[0].blocked


def test_offline_root_skips_live_writes_and_says_so():
    state = State(units={"u.service": UnitState("u.service", "disabled", None)})
    s = step(FileWrite("/etc/x", b"x"), Command(("systemctl", "daemon-reload"), regenerate=True, offline=False),
             Service("u.service", True, True), KernelWrite(("/sys/kernel/mm/transparent_hugepage/enabled",), "never"),
             Command(("nvidia-smi", "-e", "1"), offline=False))
    resolved = resolve_step(s, state, offline=True)
    assert resolved.ops == (FileWrite("/etc/x", b"x"), Service("u.service", True, None))
    assert any("live kernel write skipped" in n for n in resolved.notes)
    assert any("nvidia-smi" in n for n in resolved.notes)


def test_opt_in_steps_are_left_out_without_their_flag():
    s = step(Remove("/usr/local/cuda-11.8"), opt_in="prune-cuda")
    state = State(files={"/usr/local/cuda-11.8": FileState("/usr/local/cuda-11.8", "dir")})
    assert build_plan(HOST, LATENCY, Facts(), [], state, ONLINE, [s]).left_out == (s,)
    pruning = build_plan(HOST, LATENCY, Facts(), [], state, PlanOptions(opt_ins=frozenset({"prune-cuda"})), [s])
    assert pruning.steps == (s,)


# -- grub drop-in: configured vs active, with recorded probe outputs --------------------------
# The recordings come from a VM guest whose cpuidle driver is haltpoll, where no C-state limit matters;
# the same command lines judged as on bare metal (intel_idle) show the configured-vs-active states.


@pytest.fixture
def grub(haltpoll_guest):
    return {name: replace(facts, cpu=replace(facts.cpu, idle_driver="intel_idle")) for name, facts in haltpoll_guest.items()}


# The recordings were made when the playbook said rcu_nocbs=4-63 whatever the host; these hosts have 2 CPUs.
CSTATES_ONLY = replace(LATENCY, kernel=KernelSpec(rcu_nocbs=None))


def test_grub_drop_in_is_pending_reboot_until_proc_cmdline_matches(grub):
    statuses = {name: {f.check_id: f.status for f in run_checks(facts, LATENCY)} for name, facts in grub.items()}
    assert statuses["before"]["cpu.cstates"] is Status.DRIFT
    assert statuses["after-apply"]["cpu.cstates"] is Status.PENDING_REBOOT
    assert statuses["after-reboot"]["cpu.cstates"] is Status.OK
    assert {s["kernel.rcu_nocbs"] for s in statuses.values()} == {Status.DRIFT}  # auto on 2 CPUs: 1, not 4-63


def test_rcu_nocbs_naming_cpus_the_host_lacks_is_an_error(grub):
    pinned = replace(LATENCY, kernel=KernelSpec(rcu_nocbs="4-63"))
    finding = next(f for f in run_checks(grub["after-reboot"], pinned) if f.check_id == "kernel.rcu_nocbs")
    assert finding.status is Status.ERROR and "CPUs 4-63 are not on this host (online: 0-1)" in finding.detail


def test_a_finding_in_error_is_in_the_plan_as_not_judged_not_left_out(grub):
    """rcu_nocbs=4-63 on a 2-CPU host: check says error (exit bit 2); the dry run must not look clean for it."""
    pinned = replace(LATENCY, kernel=KernelSpec(rcu_nocbs="4-63"))
    facts = grub["after-reboot"]
    plan = build_plan(HOST, pinned, facts, run_checks(facts, pinned), State(), ONLINE)
    (step,) = [s for s in plan.blocked if "kernel.rcu_nocbs" in s.fixes]
    assert step.blocked.startswith("not judged: CPUs 4-63 are not on this host (online: 0-1)")
    assert "  - kernel.rcu_nocbs: not fixed by apply: not judged: CPUs 4-63" in render([plan])


def test_grub_plans_before_and_after(grub):
    before = grub["before"]
    plan = build_plan(HOST, CSTATES_ONLY, before, run_checks(before, CSTATES_ONLY), State(), ONLINE)
    (kernel_step,) = [s for s in plan.steps if "kernel command line" in s.summary]
    assert kernel_step.needs_reboot and kernel_step.ops[0].path == GRUB_DROPIN
    assert "+GRUB_CMDLINE_LINUX_DEFAULT=" in plan.diffs[GRUB_DROPIN] and plan.diffs[GRUB_DROPIN].startswith("--- /dev/null")
    after = grub["after-apply"]
    plan = build_plan(HOST, CSTATES_ONLY, after, run_checks(after, CSTATES_ONLY), State(), ONLINE)
    assert not any("kernel command line" in s.summary for s in plan.steps)
    assert set(plan.pending_reboot) == {"cpu.cstates"} and plan.needs_reboot


def test_a_haltpoll_guest_gets_no_c_state_step_pending_reboot_or_blocked_line(haltpoll_guest):
    """On the recorded haltpoll guest the limit changes nothing: the plan neither writes it nor waits for a boot for it."""
    for name, facts in haltpoll_guest.items():
        plan = build_plan(HOST, CSTATES_ONLY, facts, run_checks(facts, CSTATES_ONLY), State(), ONLINE)
        assert not [s for s in plan.steps + plan.blocked if "cpu.cstates" in s.fixes or "kernel command line" in s.summary], name
        assert not plan.pending_reboot and not plan.needs_reboot and GRUB_DROPIN not in plan.diffs, name
    before = haltpoll_guest["before"]
    plan = build_plan(HOST, LATENCY, before, run_checks(before, LATENCY), State(), ONLINE)
    (kernel_step,) = [s for s in plan.steps if "kernel command line" in s.summary]
    assert kernel_step.fixes == ("kernel.rcu_nocbs",) and "max_cstate" not in plan.diffs[GRUB_DROPIN]
    assert "cpu.cstates" not in render([plan])


# -- the state script, run for real on temporary files (it only reads) -------------------------


def test_state_script_reads_files_links_and_kernel_values(tmp_path):
    (tmp_path / "a.conf").write_bytes(b"one\n\x00two")
    (tmp_path / "a.conf").chmod(0o640)
    (tmp_path / "link").symlink_to("a.conf")
    (tmp_path / "dir").mkdir()
    (tmp_path / "value").write_text("always [madvise] never\n")
    requests = [("file", str(tmp_path / "a.conf")), ("file", str(tmp_path / "link")), ("file", str(tmp_path / "dir")),
                ("file", str(tmp_path / "none")), ("kernel", str(tmp_path / "value"))]
    out = subprocess.run(["sh", "-c", state_script(), "hosttune-state", "/", "none", *(f"{k}:{v}" for k, v in requests)],
                         capture_output=True, text=True, check=True).stdout
    state = parse_state(out, requests, None)
    a = state.files[str(tmp_path / "a.conf")]
    assert (a.kind, a.mode, a.content, a.sha256) == ("file", 0o640, b"one\n\x00two", sha256(b"one\n\x00two"))
    link = state.files[str(tmp_path / "link")]
    assert link.link == "a.conf" and link.real == str(tmp_path / "a.conf") and link.content == a.content
    assert state.files[str(tmp_path / "dir")].kind == "dir" and state.files[str(tmp_path / "none")].kind == "absent"
    assert state.kernel[str(tmp_path / "value")] == "always [madvise] never"


def test_state_requests_under_root_and_parsed_back_to_host_paths(tmp_path):
    steps = [step(FileWrite("/etc/x", b"1"), KernelWrite(("/proc/sys/kernel/numa_balancing",), "0"), Service("u.service", True),
                  Packages("apt", ("hello",)))]
    assert requests_for(steps, str(tmp_path)) == [("file", f"{tmp_path}/etc/x"), ("unit", "u.service"), ("pkg", "hello"), ("held", "")]
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc/x").write_text("1")
    requests = [("file", f"{tmp_path}/etc/x")]
    out = subprocess.run(["sh", "-c", state_script(), "s", str(tmp_path), "none", f"file:{tmp_path}/etc/x"], capture_output=True, text=True).stdout
    assert parse_state(out, requests, str(tmp_path)).files["/etc/x"].content == b"1"


# -- rendering ---------------------------------------------------------------------------------


def test_render_shows_commands_diffs_and_what_is_not_fixed(grub):
    facts = grub["before"]
    plan = build_plan(HOST, LATENCY, facts, run_checks(facts, LATENCY), State(units={"irqbalance.service": UnitState("irqbalance.service", "enabled", "active")}), ONLINE)
    text = render([plan])
    assert "$ systemctl disable --now irqbalance.service" in text
    assert "+++ /etc/default/grub.d/90-hosttune.cfg" in text and "$ update-grub" in text
    assert "not fixed by apply" in text and text.endswith("host")
    doc = plan_dict(plan)
    assert doc["needs_reboot"] and GRUB_DROPIN in doc["diffs"]


# -- the H200 host (no systemd, no boot loader), from its recorded probe output ----------------


def test_h200_plan_is_sensible_without_systemd(fixture_text):
    from hosttune.config.inventory import load_inventory
    from hosttune.config.profile import profile_for

    facts = parse_probe_output(fixture_text("h200", "probe-output.txt"))
    host = load_inventory("inventories/h200.yaml").hosts[0]
    profile = profile_for(host)
    state = State(kernel={f"/proc/irq/{i}/smp_affinity_list": "0-15" for i in range(42, 50)},
                  files={"/usr/local/cuda": FileState("/usr/local/cuda", "dir", link="/etc/alternatives/cuda", real="/usr/local/cuda-13.0")})
    plan = build_plan(host, profile, facts, run_checks(facts, profile), state, ONLINE)
    written = [op.path for s in plan.steps for op in s.writes]
    assert not any(p.startswith("/etc/systemd/") for p in written)  # no units on a host without systemd
    irq = next(s for s in plan.steps if s.fixes == ("irq.gpu_affinity",))
    (live,) = irq.ops
    assert live.value == "0-1" and len(live.paths) == 8 and "not persisted" in irq.notes[0]  # housekeeping of 16 CPUs
    cuda = next(s for s in plan.steps if s.fixes == ("cuda.toolkit",))
    assert [op.path for op in cuda.ops] == ["/etc/profile.d/hosttune-cuda.sh"]  # the link already resolves to 13.0
    reasons = {c: s.blocked for s in plan.blocked for c in s.fixes}
    assert "not systemd" in reasons["gpu.persistence"] and "no boot loader" in reasons["kernel.rcu_nocbs"]
    assert "rcu_nocbs=2-15" in reasons["kernel.rcu_nocbs"] and "cpu.cstates" not in reasons  # no cpuidle driver
    assert "driver.version" not in reasons and not plan.pending_reboot


def test_a_drifting_check_whose_operations_all_hold_or_are_skipped_is_in_the_plan_with_why_not_left_out():
    """An image without systemd: THP's only operation is a live write (skipped under --root); and once the CUDA link and
    profile script are there, the missing toolkit is left. apply cannot fix either; the plan says so, and its exit bit."""
    facts = Facts(image="/img")
    findings = run_checks(facts, LATENCY)
    cuda = [s for s in steps_for(findings, facts, LATENCY, HOST, PlanOptions(root="/img").statuses) if "cuda.toolkit" in s.fixes]
    holds = State(files={op.path: file_state(op.path, op.content) for s in cuda for op in s.writes} | {
        "/usr/local/cuda": FileState("/usr/local/cuda", "link", link="/usr/local/cuda-12.4")})
    plan = build_plan(HOST, LATENCY, facts, findings, holds, PlanOptions(root="/img"))
    reasons = {c: s.blocked for s in plan.blocked for c in s.fixes}
    assert "not persisted: the image's /sbin/init is missing, not systemd" in reasons["mm.thp"]
    assert "/usr/local/cuda-12.4 is missing and the image has no apt or dnf" in reasons["cuda.toolkit"]
    assert {reasons[c] for c in ("tools.numactl", "python.version")} == {
        "no apt or dnf in the image: install and hold packages with its own package manager"}
    assert not [s for s in plan.steps if {"mm.thp", "cuda.toolkit"} & set(s.fixes)]
    assert "  - mm.thp: not fixed by apply: not persisted" in render([plan])


def test_a_login_that_is_not_root_is_the_hosts_error_in_the_plan_not_a_failure_after_confirming():
    """The dry run must not promise what the run cannot do: every change of apply is root's."""
    s = step(FileWrite("/etc/x", b"x"))
    user = build_plan(HOST, LATENCY, Facts(is_root=False), [], State(), ONLINE, [s])
    assert user.error == ("nothing sent: apply changes the host as root, and this login is not root: connect as root, "
                          "or set ssh.become: true (passwordless sudo)")
    assert user.error in render([user])
    assert build_plan(HOST, LATENCY, Facts(is_root=True), [], State(), ONLINE, [s]).error is None
    assert build_plan(HOST, LATENCY, Facts(is_root=False), [], State(), PlanOptions(root="/img"), [s]).error is None
    assert build_plan(HOST, LATENCY, Facts(is_root=False), [], State(), ONLINE, []).error is None  # nothing to do


def test_a_driver_pin_of_a_branch_matches_its_releases():
    """The inventory accepts pins: {driver: 535} (a whole number): it pins the 535 branch, whose packages are
    535.x.y, where no package could ever match it and apply's step was blocked."""
    assert matches_pin("535.129.03-0ubuntu1", "535") and matches_pin("3:535.129.03-1.el9", "535")
    assert matches_pin("535.129.03-0ubuntu1", "535.129") and not matches_pin("535.129.03-0ubuntu1", "535.12")
    assert not matches_pin("5350.1-1", "535") and not matches_pin("550.54.15-0ubuntu1", "535")


def test_a_branch_pin_installs_the_branchs_newest_release_whatever_order_the_manager_lists():
    """dnf --showduplicates lists oldest first, apt-cache madison newest first: the newest of the branch either way."""
    for available in (("3:535.54.03-1.el9", "3:535.129.03-1.el9", "3:550.54.15-1.el9"),
                      ("3:550.54.15-1.el9", "3:535.129.03-1.el9", "3:535.54.03-1.el9")):
        state = State(packages={"nvidia-driver": PackageState("nvidia-driver", None, available)})
        _, install = resolve_step(step(Packages("dnf", ("nvidia-driver",), "535")), state).ops
        assert install.argv[-1].endswith("535.129.03-1.el9"), install.argv
