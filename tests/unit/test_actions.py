"""Actions as data: these facts and this profile give these steps and commands."""

import dataclasses
import subprocess
from dataclasses import replace


from hosttune.actions import ACTIONS, steps_for
from hosttune.actions import cpu, cuda, gpu, irq, kernel, memory, packages
from hosttune.actions.base import (
    Command, CommentOut, FileWrite, KernelWrite, Remove, Packages, Service, Symlink,
)
from hosttune.actions.platform import GRUB_DROPIN, Apt, Dnf, GrubDropIn, Grubby, select
from hosttune.rendering import render
from hosttune.checks import BY_ID, run_checks
from hosttune.probes.facts import Facts, ServiceState
from hosttune.checks.findings import Status
from hosttune.config.inventory import Host
from hosttune.config.profile import build, load_profile
from hosttune.transport.base import ConnectionSpec

HOST = Host("h", "g", ConnectionSpec("h"), irq_cores="0-3")
LATENCY = load_profile("inference-latency")
# The latency playbook with explicit core sets, for facts that carry no CPUs.
PINNED_CORES = build("pinned", {**{f.name: dataclasses.asdict(getattr(LATENCY, f.name)) for f in dataclasses.fields(LATENCY)
                                   if f.name not in ("name", "description")},
                                "kernel": {"rcu_nocbs": "4-63"}, "irq": {"irqbalance": False, "gpu_affinity": "0-3"}})


def systemd_debian(**kw) -> Facts:
    return Facts(pid1="systemd", os_id="debian", package_manager="apt", cmdline_source="grub", cmdline_configured=("quiet",), **kw)


def ops_of(steps, kind):
    return [op for s in steps for op in s.ops if isinstance(op, kind)]


# -- the platform selector ---------------------------------------------------------------


def test_platform_is_chosen_in_one_place():
    assert select(Facts(package_manager="apt", cmdline_source="grub")).packages == Apt()
    assert select(Facts(package_manager="apt", cmdline_source="grub")).boot == GrubDropIn()
    assert select(Facts(os_like=("rhel", "fedora"), cmdline_source="grub")).boot == Grubby()
    assert select(Facts(package_manager="dnf", cmdline_source="grubby")).packages == Dnf()
    none = select(Facts(package_manager="apt"))
    assert none.boot is None and "no boot loader configuration" in none.why_no_boot
    assert select(Facts()).packages is None


def test_apt_and_dnf_flavours():
    assert Apt().install((("hello", "2.10-3"), ("numactl", None)))[-2:] == ("hello=2.10-3", "numactl")
    assert Dnf().install((("nvidia-driver", "3:535.129.03-1.el9"),))[-1] == "nvidia-driver-3:535.129.03-1.el9"


def test_only_an_install_to_an_exact_pin_may_move_held_packages_downgrade_or_erase():
    """Installing numactl must fail rather than change the held driver stack it happens to touch."""
    moves = {"--allow-downgrades", "--allow-change-held-packages", "--allowerasing"}
    assert moves.isdisjoint(Apt().install((("numactl", None),)) + Dnf().install((("numactl", None),)))
    assert {"--allow-downgrades", "--allow-change-held-packages"} <= set(Apt().install((("nvidia-driver-535", "535.129.03-0ubuntu1"),)))
    assert "--allowerasing" in Dnf().install((("nvidia-driver", "3:535.129.03-1.el9"),))
    assert Apt().hold(("a",)) == Command(("apt-mark", "hold", "a"), undo=("apt-mark", "unhold", "a"))
    assert Dnf().hold(("a",)).argv == ("dnf", "versionlock", "add", "a")
    assert Apt().driver_packages("535.129.03") == ("nvidia-driver-535",)
    assert Dnf().cuda_packages("12.4") == ("cuda-toolkit-12-4",)


# -- kernel command line -----------------------------------------------------------------


def test_grub_drop_in_and_update_grub(l40s):
    step = kernel.kernel_cmdline(l40s, LATENCY, HOST)[0]
    assert step.needs_reboot and set(step.fixes) == {"cpu.cstates", "kernel.rcu_nocbs"}
    write, update = step.ops
    assert write.path == GRUB_DROPIN and write.mode == 0o644
    assert write.content.decode().splitlines()[-1] == (
        'GRUB_CMDLINE_LINUX_DEFAULT="${GRUB_CMDLINE_LINUX_DEFAULT} "'
        "'intel_idle.max_cstate=1 processor.max_cstate=1 rcu_nocbs=2-15'")  # auto on 16 CPUs: 0-1 keep house
    assert update == Command(("update-grub",), regenerate=True)


def test_grub_drop_in_sourced_by_sh_appends_params(tmp_path):
    """What update-grub (and the probe) see after sourcing /etc/default/grub and the drop-in."""
    (step,) = kernel.kernel_cmdline(systemd_debian(), PINNED_CORES, HOST)
    (tmp_path / "grub").write_text('GRUB_CMDLINE_LINUX_DEFAULT="quiet splash"\n')
    (tmp_path / "90-hosttune.cfg").write_bytes(step.ops[0].content)
    out = subprocess.run(["sh", "-c", f'. {tmp_path}/grub; . {tmp_path}/90-hosttune.cfg; printf %s "$GRUB_CMDLINE_LINUX_DEFAULT"'],
                         capture_output=True, text=True, check=True).stdout
    assert out == "quiet splash intel_idle.max_cstate=1 processor.max_cstate=1 rcu_nocbs=4-63"


def test_grubby_on_rhel_likes_with_undo():
    facts = Facts(pid1="systemd", os_id="rocky", os_like=("rhel",), package_manager="dnf", cmdline_source="grub",
                  cmdline_configured=("ro", "intel_idle.max_cstate=9"))
    (step,) = kernel.kernel_cmdline(facts, PINNED_CORES, HOST)
    (cmd,) = step.ops
    assert cmd.argv == ("grubby", "--update-kernel=ALL", "--args=intel_idle.max_cstate=1 processor.max_cstate=1 rcu_nocbs=4-63")
    assert cmd.undo == ("grubby", "--update-kernel=ALL", "--remove-args=intel_idle.max_cstate processor.max_cstate rcu_nocbs",
                        "--args=intel_idle.max_cstate=9")


def test_no_boot_loader_is_blocked_with_the_params_to_add(h200):
    (step,) = kernel.kernel_cmdline(h200, LATENCY, HOST)
    assert step.blocked and not step.ops
    assert "no boot loader configuration" in step.blocked and "rcu_nocbs=2-15" in step.blocked  # its 16 CPUs
    assert "max_cstate" not in step.blocked  # no cpuidle driver on that VM: nothing to limit


def test_a_haltpoll_guest_gets_no_c_state_limit_nor_live_idle_write(haltpoll_guest):
    """Its command line still gets rcu_nocbs; the C-state parameters would change nothing there."""
    facts = haltpoll_guest["before"]
    (step,) = kernel.kernel_cmdline(facts, LATENCY, HOST)
    assert step.fixes == ("kernel.rcu_nocbs",) and not ops_of([step], KernelWrite)
    assert step.ops[0].content.decode().splitlines()[-1] == (  # auto on 2 CPUs: 0 keeps house
        'GRUB_CMDLINE_LINUX_DEFAULT="${GRUB_CMDLINE_LINUX_DEFAULT} "rcu_nocbs=1')
    steps = steps_for(run_checks(facts, LATENCY), facts, LATENCY, HOST)
    assert not [s for s in steps if "cpu.cstates" in s.fixes]


def test_bare_metal_intel_idle_still_gets_the_c_state_limit(a100):
    step = kernel.kernel_cmdline(replace(a100, cmdline_configured=("quiet",)), LATENCY, HOST)[0]
    assert "cpu.cstates" in step.fixes and b"intel_idle.max_cstate=1 processor.max_cstate=1" in step.ops[0].content


def test_rcu_nocbs_past_the_hosts_cpus_is_never_written(h200):
    steps = kernel.kernel_cmdline(h200, PINNED_CORES, HOST)  # 4-63 on a host of 16 CPUs
    assert not any("rcu_nocbs" in s.blocked + s.summary for s in steps)


def test_nvme_param_and_wake_only_with_nvme(a100):
    steps = kernel.kernel_cmdline(a100, LATENCY, HOST)
    assert b"nvme_core.default_ps_max_latency_us=0" in steps[0].ops[0].content
    (wake,) = ops_of(steps[1:], KernelWrite)
    assert wake == KernelWrite(("/sys/class/nvme/nvme1/device/power/control",), "on")
    assert b"nvme_core" not in kernel.kernel_cmdline(systemd_debian(), LATENCY, HOST)[0].ops[0].content


def test_deep_idle_states_disabled_now_on_every_cpu(l40s):
    steps = kernel.kernel_cmdline(l40s, LATENCY, HOST)
    (live,) = ops_of(steps, KernelWrite)
    assert live.value == "1" and len(live.paths) == 16  # C6 on 16 CPUs
    assert live.paths[0] == "/sys/devices/system/cpu/cpu0/cpuidle/state3/disable"


# -- services, units, kernel values ------------------------------------------------------


def test_irqbalance_disable_now(l40s):
    (step,) = irq.irqbalance(l40s, LATENCY, HOST)
    (op,) = step.ops
    assert op == Service("irqbalance.service", enabled=False, running=False)
    assert op.argv == ("systemctl", "disable", "--now", "irqbalance.service")
    assert step.commands == (("systemctl", "disable", "--now", "irqbalance.service"),)
    running = {"irqbalance": ServiceState("irqbalance", running=True)}
    assert irq.irqbalance(Facts(pid1="process_api", services=running), LATENCY, HOST)[0].blocked
    assert irq.irqbalance(Facts(pid1="init"), LATENCY, HOST) == []  # not installed (an image): nothing to stop


def test_gpu_irq_affinity_written_now_and_persisted(a100):
    (step,) = irq.gpu_affinity(a100, LATENCY, HOST)
    script, unit, reload, enable, *live = step.ops
    assert script.path == "/usr/local/sbin/hosttune-irq-affinity" and script.mode == 0o755
    assert b"pin 0000:17:00.0 0-1\n" in script.content  # housekeeping cores of each GPU's NUMA node
    assert b"pin 0000:b1:00.0 32-33\n" in script.content
    assert unit.path == "/etc/systemd/system/hosttune-irq-affinity.service"
    assert b"ExecStart=/usr/local/sbin/hosttune-irq-affinity" in unit.content
    assert reload == Command(("systemctl", "daemon-reload"), regenerate=True, offline=False)
    assert enable == Service("hosttune-irq-affinity.service", enabled=True)
    assert step.is_live_kernel_write and {k.value for k in live} == {"0-1", "32-33"}
    assert "/proc/irq/128/smp_affinity_list" in [p for k in live for p in k.paths]


def test_irq_script_quotes_what_it_is_given(tmp_path):
    """A hostile PCI address in the rendered script stays one word: nothing runs."""
    marker = tmp_path / "pwned"
    script = render("hosttune-irq-affinity.sh.j2", pins=[(f"x; touch {marker}", "0-3"), ("$(touch " + str(marker) + ")", "1")])
    (tmp_path / "s.sh").write_bytes(script)
    subprocess.run(["sh", str(tmp_path / "s.sh")], capture_output=True)
    assert not marker.exists()


def test_governor_now_and_at_boot(a100):
    (step,) = cpu.governor(a100, LATENCY, HOST)
    files = [op.path for op in step.writes]
    assert files == ["/usr/local/sbin/hosttune-cpu-governor", "/etc/systemd/system/hosttune-cpu-governor.service"]
    (live,) = ops_of([step], KernelWrite)
    assert live.value == "performance" and [p.split("/")[5] for p in live.paths] == ["cpu60", "cpu61", "cpu62", "cpu63"]


def test_governor_without_systemd_is_live_only_with_a_note():
    facts = Facts(pid1="process_api", cpu=replace(Facts().cpu, governors={0: "powersave"}))
    (step,) = cpu.governor(facts, LATENCY, HOST)
    assert [type(op) for op in step.ops] == [KernelWrite] and "not persisted" in step.notes[0]


def test_a_setting_written_without_systemd_is_planned_until_the_next_boot_not_at_boot(l40s):
    """No boot unit is written without systemd: the step's summary must not promise the boot."""
    bare = replace(l40s, pid1="process_api", thp_enabled="never",
                   cpu=replace(l40s.cpu, governors={0: "powersave"}))
    for action in (memory.thp, cpu.governor, irq.gpu_affinity):
        (lasting,) = action(l40s, LATENCY, HOST)
        (live,) = action(bare, LATENCY, HOST)
        assert lasting.summary.endswith(" now and at boot") and live.summary.endswith(" now, until the next boot"), \
            (lasting.summary, live.summary)
        assert live.summary.removesuffix(" now, until the next boot") == lasting.summary.removesuffix(" now and at boot")


def test_a_setting_planned_for_an_image_takes_effect_at_its_first_boot_not_now(l40s):
    """An image (--root) has no running kernel: no step may promise "now", NUMA balancing's sysctl file included."""
    image = replace(l40s, image="/srv/image", thp_enabled="never", cpu=replace(l40s.cpu, governors={0: "powersave"}))
    for action in (memory.numa_balancing, memory.thp, cpu.governor, irq.gpu_affinity):
        (host_step,) = action(l40s, LATENCY, HOST)
        (image_step,) = action(image, LATENCY, HOST)
        assert host_step.summary.endswith(" now and at boot"), host_step.summary
        assert image_step.summary == host_step.summary.replace(" now and at boot", " at the image's first boot")
    assert memory.numa_balancing(replace(image, pid1="process_api"), LATENCY, HOST)[0].summary.endswith(
        " at the image's first boot")  # sysctl.d is read at boot without systemd too


def test_irqbalance_in_an_image_is_disabled_from_its_first_boot_not_stopped(l40s):
    running = replace(l40s, services={"irqbalance": ServiceState("irqbalance", "active", "enabled")})
    (host_step,) = irq.irqbalance(running, LATENCY, HOST)
    (image_step,) = irq.irqbalance(replace(running, image="/srv/image"), LATENCY, HOST)
    assert (host_step.summary, image_step.summary) == ("irqbalance stopped and disabled",
                                                       "irqbalance disabled from the image's first boot")
    assert image_step.ops == host_step.ops  # --root leaves the stop out when it runs, and says so


def test_thp_files_unit_and_live_write(l40s):
    (step,) = memory.thp(l40s, LATENCY, HOST)
    defaults = step.ops[0]
    assert defaults.path == "/etc/default/hosttune-thp" and defaults.content.endswith(b"THP_MODE=madvise\n")
    unit = next(op for op in step.writes if op.path.endswith(".service"))
    assert b"EnvironmentFile=/etc/default/hosttune-thp" in unit.content
    assert step.ops[-1] == KernelWrite(("/sys/kernel/mm/transparent_hugepage/enabled",), "madvise")


def test_numa_balancing_sysctl_and_overriding_file(a100):
    (step,) = memory.numa_balancing(a100, LATENCY, HOST)
    assert step.ops[0].path == "/etc/sysctl.d/90-hosttune.conf" and step.ops[0].content.endswith(b"kernel.numa_balancing = 0\n")
    assert step.ops[-1] == KernelWrite(("/proc/sys/kernel/numa_balancing",), "0")
    late = replace(a100, numa_balancing_configured=1, numa_balancing_source="/etc/sysctl.d/95-site.conf")
    assert CommentOut("/etc/sysctl.d/95-site.conf", "kernel.numa_balancing") in memory.numa_balancing(late, LATENCY, HOST)[0].ops
    early = replace(a100, numa_balancing_configured=1, numa_balancing_source="/etc/sysctl.d/10-site.conf")
    assert not ops_of(memory.numa_balancing(early, LATENCY, HOST), CommentOut)  # ours sorts after it and wins


def test_persistenced(a100):
    (step,) = gpu.persistence(a100, LATENCY, HOST)
    assert step.ops == (Service("nvidia-persistenced.service", enabled=True, running=True),)
    missing = replace(a100, services={"nvidia-persistenced": ServiceState("nvidia-persistenced", "inactive", "not-found")})
    assert "not installed" in gpu.persistence(missing, LATENCY, HOST)[0].blocked


# -- packages and CUDA -------------------------------------------------------------------


def test_driver_pinned_install_and_hold(h200):
    (step,) = packages.driver_version(h200, LATENCY, HOST)
    assert step.needs_reboot and step.ops == (Packages("apt", ("nvidia-driver-535",), "535.129.03", hold=True),)
    custom = build("p", {"driver": {"version": "2.10", "packages": ["hello"]}})
    assert packages.driver_version(h200, custom, HOST)[0].ops == (Packages("apt", ("hello",), "2.10", hold=True),)


def test_unheld_stack_packages_get_held(a100):
    (step,) = packages.driver_held(a100, LATENCY, HOST)
    assert step.ops == (Packages("apt", ("cuda-toolkit-12-4", "libnvidia-compute-535-server"), None, hold=True),)
    rhel = replace(a100, package_manager="dnf", os_id="rocky")
    support, hold = packages.driver_held(rhel, LATENCY, HOST)
    assert support.ops == (Packages("dnf", ("python3-dnf-plugin-versionlock",)),)


def test_cuda_link_profile_d_and_stale_toolkits(a100):
    main, prune = cuda.cuda_toolkit(a100, LATENCY, HOST)
    assert Symlink("/usr/local/cuda", "/usr/local/cuda-12.4") in main.ops
    profile_d = next(op for op in main.writes if op.path == "/etc/profile.d/hosttune-cuda.sh")
    assert b"export CUDA_HOME=/usr/local/cuda" in profile_d.content
    assert prune.opt_in == "prune-cuda" and prune.ops == (Remove("/usr/local/cuda-11.8"),)


def test_cuda_profile_d_puts_the_pin_first_and_drops_stale_toolkits(tmp_path):
    (step,) = cuda.cuda_toolkit(Facts(cuda=replace(Facts().cuda, toolkits=("/usr/local/cuda-12.4",))), LATENCY, HOST)
    script = next(op for op in step.writes).content
    (tmp_path / "cuda.sh").write_bytes(script)
    out = subprocess.run(["sh", "-c", f'PATH=/usr/local/cuda-11.8/bin:/usr/bin:/bin LD_LIBRARY_PATH=/usr/local/cuda-11.8/lib64:/opt/lib; '
                                      f'. {tmp_path}/cuda.sh; echo "$PATH"; echo "$LD_LIBRARY_PATH"; . {tmp_path}/cuda.sh; echo "$PATH"'],
                         capture_output=True, text=True, check=True).stdout.splitlines()
    assert out == ["/usr/local/cuda/bin:/usr/bin:/bin", "/usr/local/cuda/lib64:/opt/lib", "/usr/local/cuda/bin:/usr/bin:/bin"]


def test_a_missing_pinned_toolkit_with_no_package_manager_leaves_a_working_link_alone():
    """/usr/local/cuda -> cuda-13.0 works: pointing it at a cuda-12.4 nobody can install would break every build."""
    facts = _toolkits("/usr/local/cuda-13.0", link="/usr/local/cuda-13.0")
    (main,) = cuda.cuda_toolkit(facts, LATENCY, HOST)
    assert main.ops == () and main.fixes == ("cuda.toolkit",)
    assert main.blocked == ("/usr/local/cuda-12.4 is missing and this host has no apt or dnf: install CUDA 12.4 by hand "
                            "(/usr/local/cuda keeps pointing at /usr/local/cuda-13.0)")
    (bare,) = cuda.cuda_toolkit(_toolkits(), LATENCY, HOST)  # no link yet (an image being made): it is prepared
    assert Symlink("/usr/local/cuda", "/usr/local/cuda-12.4") in bare.ops and "install CUDA 12.4 by hand" in bare.notes[0]


def test_cuda_toolkit_missing_is_installed_by_package(h200):
    (main,) = cuda.cuda_toolkit(h200, load_profile("inference-latency"), HOST)[:1]
    assert main.ops[0] == Packages("apt", ("cuda-toolkit-12-4",), hold=True)


# -- the catalogue -----------------------------------------------------------------------


def test_every_fixable_check_has_an_action_and_the_rest_are_blocked(a100):
    assert set(ACTIONS) <= set(BY_ID)
    findings = run_checks(a100, LATENCY)
    steps = steps_for(findings, a100, LATENCY, HOST)
    blocked = {c for s in steps if s.blocked for c in s.fixes}
    assert {"gpu.pcie_link", "gpu.pstate", "cuda.driver_compat"} <= blocked
    fixed = {c for s in steps if not s.blocked for c in s.fixes}
    drifting = {f.check_id for f in findings if f.status is Status.DRIFT}
    unjudged = {f.check_id for f in findings if f.status is Status.ERROR}  # e.g. no kernel log without root
    assert unjudged and fixed | blocked == drifting | unjudged


def test_pending_reboot_gets_no_step_and_shared_actions_run_once(l40s):
    findings = run_checks(l40s, LATENCY)
    status = {f.check_id: f.status for f in findings}
    assert status["cpu.cstates"] is Status.PENDING_REBOOT and status["kernel.rcu_nocbs"] is Status.DRIFT
    steps = steps_for(findings, l40s, LATENCY, HOST)
    grub = [s for s in steps if any(isinstance(o, FileWrite) and o.path == GRUB_DROPIN for o in s.ops)]
    assert len(grub) == 1 and grub[0].fixes == ("kernel.rcu_nocbs",)


def test_actions_never_touch_a_transport():
    """Actions are pure: nothing in hosttune/actions imports transports, probes' gather, or execute."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parents[2] / "hosttune" / "actions"
    for path in root.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                assert not node.module.startswith(("hosttune.transport", "hosttune.execute", "hosttune.probes.gather", "subprocess")), path
            if isinstance(node, ast.Import):
                assert all(a.name not in ("subprocess", "paramiko") for a in node.names), path


def _toolkits(*paths, link=None) -> Facts:
    return Facts(cuda=replace(Facts().cuda, toolkits=paths, symlink_target=link))


def test_prune_cuda_never_moves_the_linked_the_pinned_or_the_only_toolkit():
    prune = lambda facts: [s for s in cuda.cuda_toolkit(facts, LATENCY, HOST) if s.opt_in == "prune-cuda"]  # noqa: E731
    assert prune(_toolkits("/usr/local/cuda-13.0", "/usr/local/cuda-13", link="/usr/local/cuda-13.0")) == []  # the only one
    assert prune(_toolkits("/usr/local/cuda-11.8")) == []  # the only one, even unpinned and unlinked
    (step,) = prune(_toolkits("/usr/local/cuda-11.8", "/usr/local/cuda-12.4", "/usr/local/cuda-13.0", link="/usr/local/cuda-13.0"))
    assert step.ops == (Remove("/usr/local/cuda-11.8"),)  # 12.4 is the pin, 13.0 what /usr/local/cuda points at
