"""The probe under `--root`: every fact from the image's files, none from the machine that runs it."""

from __future__ import annotations

import json
import socket
from dataclasses import replace

import pytest
from typer.testing import CliRunner

from hosttune.checks import run_checks
from hosttune.cli import app
from hosttune.errors import CommandTimeout, ProbeError
from hosttune.checks.findings import Status
from hosttune.probes.gather import gather
from hosttune.config.profile import load_profile
from hosttune.transport.local import LocalTransport

DPKG_STATUS = """\
Package: libcudnn9-cuda-12
Status: hold ok installed
Version: 9.1.0.70-1

Package: cuda-toolkit-12-4
Status: install ok installed
Version: 12.4.1-1

Package: irqbalance
Status: install ok installed
Version: 1.9.2-1
"""


def write(root, path: str, text: str) -> None:
    target = root / path.lstrip("/")
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text)


def make_image(root) -> None:
    write(root, "/etc/os-release", 'ID=debian\nVERSION_ID="12"\n')
    write(root, "/etc/hostname", "baked-image\n")
    write(root, "/etc/default/grub", 'GRUB_CMDLINE_LINUX_DEFAULT="quiet"\nGRUB_CMDLINE_LINUX="console=ttyS0"\n')
    write(root, "/etc/default/hosttune-thp", "# Managed by hosttune (transparent hugepages).\nTHP_MODE=never\n")
    write(root, "/etc/sysctl.d/90-site.conf", "kernel.numa_balancing = 1\n")
    write(root, "/var/lib/dpkg/status", DPKG_STATUS)
    (root / "usr/local/cuda-12.4/bin").mkdir(parents=True)
    (root / "usr/local/cuda").symlink_to("/usr/local/cuda-12.4")  # absolute: resolved inside the image
    (root / "lib/systemd").mkdir(parents=True)
    (root / "lib/systemd/systemd").write_text("")
    (root / "sbin").mkdir()
    (root / "sbin/init").symlink_to("/lib/systemd/systemd")


def test_facts_come_from_the_image_only(tmp_path):
    make_image(tmp_path)
    facts = gather(LocalTransport(), root=str(tmp_path)).facts
    assert facts.image == str(tmp_path) and facts.hostname == "baked-image" != socket.gethostname()
    assert facts.os_id == "debian" and facts.pid1 == "systemd"  # what /sbin/init resolves to in the image
    assert facts.cmdline_configured == ("console=ttyS0", "quiet") and facts.cmdline_source == "grub"
    assert facts.cmdline_active == ()  # an image runs no kernel
    assert facts.cuda.symlink_target == "/usr/local/cuda-12.4" and facts.cuda.toolkits == ("/usr/local/cuda-12.4",)
    assert facts.packages == {"libcudnn9-cuda-12": "9.1.0.70-1", "cuda-toolkit-12-4": "12.4.1-1", "irqbalance": "1.9.2-1"}
    assert facts.held == ("libcudnn9-cuda-12",)
    assert facts.thp_configured == "never" and facts.numa_balancing_configured == 1
    assert facts.numa_balancing_source == "/etc/sysctl.d/90-site.conf"
    assert facts.cpu.count == 0 and facts.numa_nodes == {} and facts.pci == () and facts.gpu.gpus == ()


def test_image_findings_judge_its_configuration(tmp_path):
    make_image(tmp_path)
    facts = gather(LocalTransport(), root=str(tmp_path)).facts
    found = {f.check_id: f for f in run_checks(facts, load_profile("inference-latency"))}
    assert found["cpu.cstates"].status is Status.DRIFT and found["cpu.cstates"].active == "-"
    assert found["kernel.rcu_nocbs"].status is Status.NOT_APPLICABLE  # auto needs CPUs; an image has none
    assert found["kernel.rcu_nocbs"].detail == ("rcu_nocbs: auto needs the host's CPUs, and an image has none to read: "
                                                "set rcu_nocbs for these hosts in the inventory")
    assert found["mm.thp"].status is Status.DRIFT and found["mm.thp"].configured == "never"
    assert found["numa.topology"].status is Status.DRIFT
    assert found["driver.held"].status is Status.DRIFT and "cuda-toolkit-12-4" in found["driver.held"].detail
    assert found["gpu.persistence"].status is Status.NOT_APPLICABLE and "an image" in found["gpu.persistence"].detail
    assert found["sys.shm"].status is Status.NOT_APPLICABLE  # mounted at boot, not a file of the image
    assert not [f.check_id for f in found.values() if f.status is Status.ERROR]


def test_what_only_a_running_host_has_is_said_to_be_read_there_not_to_be_missing_from_this_host(tmp_path):
    """An image has no devices, interrupts or kernel log to read: "no NVMe devices" or "no NVIDIA GPU on this host"
    described the build machine's view of the image as a host without them."""
    make_image(tmp_path)
    facts = gather(LocalTransport(), root=str(tmp_path)).facts
    found = {f.check_id: f for f in run_checks(facts, load_profile("inference-latency"))}
    image_na = {i: f.detail for i, f in found.items() if f.status is Status.NOT_APPLICABLE and "monitor" not in i}
    assert not [d for d in image_na.values() if "this host" in d or "sysfs" in d or d == "no NVMe devices"], image_na
    for check in ("gpu.xid", "irq.gpu_affinity", "nvme.power", "pci.aer", "serve.units", "serve.api_key"):
        assert image_na[check].startswith("an image: ") and image_na[check].endswith(
            " is read on the running host (check it after the first boot)"), (check, image_na[check])


def test_the_governor_boot_script_of_an_image_is_read_and_compared_with_what_apply_would_write(tmp_path):
    """An image whose governor unit is enabled but whose script sets another governor than the profile's now."""
    import hashlib

    from hosttune.actions.units import boot_unit
    from hosttune.checks.boot_scripts import governor_script

    make_image(tmp_path)
    for op in boot_unit("hosttune-cpu-governor", "CPU frequency governor", governor_script("powersave"))[:2]:
        write(tmp_path, op.path, op.content.decode())
    write(tmp_path, "/etc/systemd/system/multi-user.target.wants/.keep", "")
    (tmp_path / "etc/systemd/system/multi-user.target.wants/hosttune-cpu-governor.service").symlink_to(
        "/etc/systemd/system/hosttune-cpu-governor.service")
    facts = gather(LocalTransport(), root=str(tmp_path)).facts
    unit = facts.services["hosttune-cpu-governor"]
    assert unit.enabled == "enabled" and unit.script == hashlib.sha256(governor_script("powersave")).hexdigest()
    finding = next(f for f in run_checks(facts, load_profile("inference-latency")) if f.check_id == "cpu.governor")
    assert (finding.status, finding.configured) == (Status.DRIFT, "boot script differs")  # the profile: performance
    write(tmp_path, "/usr/local/sbin/hosttune-cpu-governor", governor_script("performance").decode())
    facts = gather(LocalTransport(), root=str(tmp_path)).facts
    finding = next(f for f in run_checks(facts, load_profile("inference-latency")) if f.check_id == "cpu.governor")
    assert (finding.status, finding.configured) == (Status.OK, "performance")


def test_a_root_that_is_not_a_directory_is_the_hosts_one_line_error(tmp_path):
    with pytest.raises(ProbeError, match=f"--root {tmp_path / 'typo'}: no such directory on this host; give the folder"):
        gather(LocalTransport(), root=str(tmp_path / "typo"))


def test_apply_dry_run_under_a_missing_root_plans_nothing_and_exits_2(tmp_path):
    result = CliRunner().invoke(app, ["apply", "--dry-run", "--root", str(tmp_path / "typo")])
    assert result.exit_code == 2 and "no such directory on this host" in result.stdout
    assert "0 changes" in result.stdout and not (tmp_path / "typo").exists()


def test_an_image_without_a_boot_loader_configuration_is_not_called_a_vm_or_container(tmp_path):
    """An image without /etc/default/grub was told its kernel command line is set by its host, as a VM's is."""
    (tmp_path / "img/etc").mkdir(parents=True)
    result = CliRunner().invoke(app, ["apply", "--dry-run", "--root", str(tmp_path / "img")])
    (line,) = [line for line in result.output.splitlines() if line.startswith("  - cpu.cstates: ")]
    assert line == ("  - cpu.cstates: not fixed by apply: the image has no boot loader configuration (no "
                    "/etc/default/grub, grubby or /etc/kernel/cmdline); add intel_idle.max_cstate=1 "
                    "processor.max_cstate=1 to the kernel command line by hand"), result.output


@pytest.mark.parametrize("content", [(), ("boot/grub",)], ids=["empty", "a boot partition"])
def test_apply_on_a_folder_that_is_no_os_root_refuses_in_one_line_and_plans_nothing(tmp_path, content):
    """An image that failed to mount leaves an empty mount point: apply planned its files into it."""
    for folder in content:
        (tmp_path / "img" / folder).mkdir(parents=True)
    (tmp_path / "img").mkdir(exist_ok=True)
    result = CliRunner().invoke(app, ["apply", "--dry-run", "--root", str(tmp_path / "img")])
    assert result.exit_code == 2, result.output
    assert (f"  localhost: probe script exited 3: --root {tmp_path / 'img'}: does not look like an OS root (no etc "
            "folder); give the folder the image's root is mounted at") in result.output.splitlines(), result.output
    assert "0 changes" in result.output and [p.name for p in (tmp_path / "img").iterdir()] == list(content[:1] and ["boot"])


def test_a_root_that_is_a_file_is_said_to_be_one_not_to_be_missing(tmp_path):
    """An image file given for its mount point (disk.img) read as "no such directory on this host"."""
    (tmp_path / "disk.img").write_bytes(b"\0")
    said = (f"--root {tmp_path / 'disk.img'}: is a file, not a folder; mount the image and give the folder it is "
            "mounted at")
    applied = CliRunner().invoke(app, ["apply", "--dry-run", "--root", str(tmp_path / "disk.img")])
    assert applied.exit_code == 2 and f"  localhost: probe script exited 3: {said}" in applied.output.splitlines(), applied.output
    rolled = CliRunner().invoke(app, ["rollback", "--dry-run", "--root", str(tmp_path / "disk.img")])
    assert rolled.exit_code == 2 and rolled.stdout == f"localhost: failed: {said}\n", rolled.output


@pytest.mark.parametrize("root", ["//", "/.", "/tmp/.."])
def test_a_root_that_is_this_hosts_own_root_is_refused_not_planned_as_an_image(root):
    """`--root "$MNT/"` with MNT=/ planned the running system as an image: its changes "at the image's first boot", no
    update-grub, no live kernel write, while the files written were the running system's."""
    shown = root.removesuffix("/")  # "//" is named as "/", as every --root without its last slash
    said = (f"--root {shown}: is this host's own root (/); leave --root out to change the running system, or give the "
            "folder an image is mounted at")
    applied = CliRunner().invoke(app, ["apply", "--dry-run", "--root", root])
    assert applied.exit_code == 2 and f"  localhost: probe script exited 3: {said}" in applied.output.splitlines(), applied.output
    rolled = CliRunner().invoke(app, ["rollback", "--dry-run", "--root", root])
    assert rolled.exit_code == 2 and rolled.stdout == f"localhost: failed: {said}\n", rolled.output


def test_the_json_plan_of_an_image_that_cannot_be_planned_names_the_image_not_the_running_system(tmp_path):
    """A plan in error had "root": null, which is how a plan for the running system reads."""
    (tmp_path / "img").mkdir()
    result = CliRunner().invoke(app, ["apply", "--dry-run", "--format", "json", "--root", str(tmp_path / "img")])
    (host,) = json.loads(result.stdout)["hosts"]
    assert host["plan"]["error"].endswith("does not look like an OS root (no etc folder); give the folder the image's "
                                          "root is mounted at") and host["plan"]["root"] == str(tmp_path / "img")


def test_a_probe_past_its_time_says_so_and_what_to_do():
    with pytest.raises(CommandTimeout, match=r"^localhost: the probe did not finish within 0.01s: a command on the host "
                                             r"may hang \(nvidia-smi, a stale mount\), or raise the inventory's "
                                             r"probe_timeout$"):
        gather(LocalTransport(), timeout=0.01)


def test_one_apply_disables_every_sysctl_file_that_would_override_numa_balancing_at_boot(tmp_path):
    """99-site.conf and sysctl.conf both sort after hosttune's 90 file: commenting out only the last one left the
    other winning at boot, so a second apply was needed. A vendor file read before ours is left alone."""
    make_image(tmp_path)
    write(tmp_path, "/etc/sysctl.d/99-site.conf", "vm.swappiness = 10\nkernel.numa_balancing = 1\n")
    write(tmp_path, "/etc/sysctl.conf", "kernel.numa_balancing=1\n")
    write(tmp_path, "/usr/lib/sysctl.d/10-vendor.conf", "kernel.numa_balancing = 1\n")
    inv = tmp_path / "inv.yaml"
    inv.write_text("hosts:\n  localhost: {transport: local}\n")
    image = tmp_path / "img"
    image.mkdir()
    for path in ("etc", "usr", "lib", "sbin", "var"):
        (tmp_path / path).rename(image / path)
    result = CliRunner().invoke(app, ["apply", "-i", str(inv), "--root", str(image), "--yes"])
    assert result.exit_code in (0, 1), result.output
    facts = gather(LocalTransport(), root=str(image)).facts
    assert (facts.numa_balancing_configured, facts.numa_balancing_source) == (0, "/etc/sysctl.d/90-hosttune.conf")
    assert (image / "usr/lib/sysctl.d/10-vendor.conf").read_text() == "kernel.numa_balancing = 1\n"
    assert "vm.swappiness = 10" in (image / "etc/sysctl.d/99-site.conf").read_text()


def test_a_grub_drop_in_read_after_hosttunes_that_resets_the_command_line_blocks_the_kernel_step(tmp_path):
    """99-site.cfg sets GRUB_CMDLINE_LINUX_DEFAULT anew after 90-hosttune.cfg: the parameters apply would write never
    reach the kernel, so the plan says so instead of writing them. One read before hosttune's, or one that appends
    to the variable, does not stand in the way."""
    make_image(tmp_path)
    write(tmp_path, "/etc/default/grub.d/50-cloudimg.cfg", 'GRUB_CMDLINE_LINUX_DEFAULT="console=ttyS0"\n')
    write(tmp_path, "/etc/default/grub.d/95-append.cfg", 'GRUB_CMDLINE_LINUX_DEFAULT="$GRUB_CMDLINE_LINUX_DEFAULT x=1"\n')
    write(tmp_path, "/etc/default/grub.d/99-site.cfg", '# GRUB_CMDLINE_LINUX_DEFAULT="ignored"\n'
                                                       'GRUB_CMDLINE_LINUX_DEFAULT="quiet splash"\n')
    facts = gather(LocalTransport(), root=str(tmp_path)).facts
    assert facts.grub_overrides == ("/etc/default/grub.d/99-site.cfg",)
    from hosttune.actions.kernel import kernel_cmdline
    from hosttune.config.inventory import local_inventory

    (step, *_) = kernel_cmdline(facts, load_profile("inference-latency"), local_inventory().hosts[0])
    assert step.ops == () and step.blocked == (
        "/etc/default/grub.d/99-site.cfg sets GRUB_CMDLINE_LINUX_DEFAULT after /etc/default/grub.d/90-hosttune.cfg "
        "and would drop its parameters: make it append ($GRUB_CMDLINE_LINUX_DEFAULT ...), or add "
        "intel_idle.max_cstate=1 processor.max_cstate=1 to it by hand")


def test_a_step_that_holds_while_its_check_still_drifts_says_the_checks_reason(tmp_path):
    """The image's toolkit has no nvcc: once apply has pointed /usr/local/cuda and PATH at it, nothing is left to
    change yet cuda.toolkit drifts. The plan gives the check's own reason: `hosttune check` has no --root to ask."""
    make_image(tmp_path)
    assert CliRunner().invoke(app, ["apply", "--root", str(tmp_path), "--yes"]).exit_code in (0, 1)
    result = CliRunner().invoke(app, ["apply", "--root", str(tmp_path), "--dry-run"])
    assert ("  - cuda.toolkit: not fixed by apply: what it would change holds already, yet the check still drifts: "
            "nvcc on the login PATH is missing") in result.output.splitlines(), result.output


def test_an_image_that_enables_irqbalance_drifts_on_its_configuration_not_a_running_state(tmp_path):
    """An image runs nothing: irqbalance is judged on being enabled for its first boot, never said to be stopped."""
    make_image(tmp_path)
    write(tmp_path, "/lib/systemd/system/irqbalance.service", "[Service]\nExecStart=/usr/sbin/irqbalance\n"
                                                              "[Install]\nWantedBy=multi-user.target\n")
    wants = tmp_path / "etc/systemd/system/multi-user.target.wants"
    wants.mkdir(parents=True)
    (wants / "irqbalance.service").symlink_to("/lib/systemd/system/irqbalance.service")
    facts = gather(LocalTransport(), root=str(tmp_path)).facts
    found = {f.check_id: f for f in run_checks(facts, load_profile("inference-latency"))}["irq.irqbalance"]
    assert (found.status, found.configured, found.active) == (Status.DRIFT, "enabled", "-")
    assert found.detail == "the image starts irqbalance at boot"


def test_an_image_applied_in_full_asks_for_no_reboot_and_exits_0(tmp_path):
    """An image runs no kernel: its first boot takes the kernel command line with everything else. An image build
    whose apply made every change must not fail on a reboot left pending."""
    make_image(tmp_path / "img")
    inv = tmp_path / "inv.yaml"
    inv.write_text("hosts:\n  localhost:\n    transport: local\n    tune:\n      driver: {version: null, held: null}\n"
                   "      cuda: {toolkit: null}\n      tools: {numactl: null, python: null}\n")
    args = ["apply", "-i", str(inv), "--root", str(tmp_path / "img")]
    planned = CliRunner().invoke(app, [*args, "--dry-run"])
    assert "cpu.cstates: kernel command line via grub drop-in" in planned.output
    assert "[needs reboot]" not in planned.output and "reboot needed" not in planned.output, planned.output
    result = CliRunner().invoke(app, [*args, "--yes"])
    assert result.exit_code == 0 and "reboot pending" not in result.output, result.output


def test_numa_balancing_set_in_sysctl_conf_and_its_debian_link_is_disabled_in_one_write(tmp_path):
    """Debian's /etc/sysctl.d/99-sysctl.conf links to ../sysctl.conf: both name the one file to comment out. It was
    written twice, and the second write, expecting the file as the plan had read it, failed the run."""
    make_image(tmp_path)
    (tmp_path / "etc/sysctl.d/90-site.conf").unlink()
    write(tmp_path, "/etc/sysctl.conf", "vm.swappiness = 10\nkernel.numa_balancing = 1\n")
    (tmp_path / "etc/sysctl.d/99-sysctl.conf").symlink_to("../sysctl.conf")
    result = CliRunner().invoke(app, ["apply", "--root", str(tmp_path), "--yes"])
    assert "failed=0" in result.output and result.output.count("write /etc/sysctl.conf ") == 1, result.output
    assert (tmp_path / "etc/sysctl.d/99-sysctl.conf").is_symlink()
    assert (tmp_path / "etc/sysctl.conf").read_text().startswith("vm.swappiness = 10\n# kernel.numa_balancing = 1")
    rolled = CliRunner().invoke(app, ["rollback", "--root", str(tmp_path), "--yes"])
    assert rolled.exit_code == 0, rolled.output
    assert (tmp_path / "etc/sysctl.conf").read_text() == "vm.swappiness = 10\nkernel.numa_balancing = 1\n"


def test_an_absolute_link_in_an_image_is_followed_inside_the_image_not_on_the_build_machine(tmp_path):
    """/etc/sysctl.d/95-site.conf -> /etc/site/sysctl.conf names the image's file: read and edited on the machine's
    own path, the setting that wins at the image's boot went unseen and stayed."""
    make_image(tmp_path)
    (tmp_path / "etc/sysctl.d/90-site.conf").unlink()
    write(tmp_path, "/etc/site/sysctl.conf", "kernel.numa_balancing = 1\n")
    (tmp_path / "etc/sysctl.d/95-site.conf").symlink_to("/etc/site/sysctl.conf")
    facts = gather(LocalTransport(), root=str(tmp_path)).facts
    assert (facts.numa_balancing_configured, facts.numa_balancing_source) == (1, "/etc/sysctl.d/95-site.conf")
    result = CliRunner().invoke(app, ["apply", "--root", str(tmp_path), "--yes"])
    assert "failed=0" in result.output and "write /etc/site/sysctl.conf " in result.output, result.output
    assert (tmp_path / "etc/site/sysctl.conf").read_text().startswith("# kernel.numa_balancing = 1")
    assert gather(LocalTransport(), root=str(tmp_path)).facts.numa_balancing_configured == 0


def test_an_image_that_does_not_boot_systemd_is_named_for_its_init_not_the_build_machines_pid_1(tmp_path):
    make_image(tmp_path)
    (tmp_path / "sbin/init").unlink()
    write(tmp_path, "/sbin/init", "#!/bin/sh\n")
    text = CliRunner().invoke(app, ["apply", "--root", str(tmp_path), "--dry-run"]).output
    assert "PID 1" not in text, text
    assert ("  - mm.thp: not fixed by apply: not persisted: the image's /sbin/init is init, not systemd; add "
            "transparent_hugepage=madvise to the kernel command line") in text.splitlines(), text


def test_an_image_without_an_init_is_said_to_have_none_not_to_run_one_named_init(tmp_path):
    """/sbin/init missing read as an init named "init": "/sbin/init is init, not systemd". A link to a program the
    image does not hold (yet) still names it."""
    make_image(tmp_path)
    (tmp_path / "sbin/init").unlink()
    (tmp_path / "sbin/init").symlink_to("/lib/systemd/systemd")
    assert gather(LocalTransport(), root=str(tmp_path)).facts.pid1 == "systemd"
    (tmp_path / "sbin/init").unlink()
    assert gather(LocalTransport(), root=str(tmp_path)).facts.pid1 == ""
    text = CliRunner().invoke(app, ["apply", "--root", str(tmp_path), "--dry-run"]).output
    assert ("  - mm.thp: not fixed by apply: not persisted: the image's /sbin/init is missing, not systemd; add "
            "transparent_hugepage=madvise to the kernel command line") in text.splitlines(), text


def test_an_image_plan_says_the_monitor_is_left_to_the_host_booted_from_it(tmp_path):
    """The monitor's timers run on a booted host, and apply installs them there: with the monitor on, an image's plan
    said nothing of it, as if the image would come up monitored."""
    from hosttune import __version__
    from wheels import make_wheel

    make_image(tmp_path / "img")
    make_wheel(tmp_path / "wheels", "hosttune", __version__)
    inv = tmp_path / "inv.yaml"
    inv.write_text("hosts:\n  localhost:\n    transport: local\n    profile: inference-latency-monitored\n"
                   f"    tune:\n      monitor: {{wheels: {tmp_path / 'wheels'}}}\n")
    line = ("  - monitor.installed: not baked into the image: `hosttune apply` installs the monitor (its virtualenv, "
            "profile and timers) on each host once it runs from the image")
    args = ["apply", "-i", str(inv), "--root", str(tmp_path / "img"), "--dry-run"]
    assert line in CliRunner().invoke(app, args).output.splitlines()
    (host,) = json.loads(CliRunner().invoke(app, [*args, "--format", "json"]).stdout)["hosts"]
    assert host["plan"]["not_done"] == [line[4:]]
    unmonitored = CliRunner().invoke(app, ["apply", "--root", str(tmp_path / "img"), "--dry-run"]).output
    assert "monitor" not in unmonitored, unmonitored


def test_an_image_is_not_judged_on_a_gpu_count_it_cannot_show(tmp_path):
    """No PCI bus is read for an image: with the profile expecting 8 GPUs, gpu.count said "PCI shows 0" and the plan
    told the image's builder to reseat or replace a GPU, its exit code 1. Nor is irqbalance said to be stopped."""
    make_image(tmp_path / "img")
    facts = gather(LocalTransport(), root=str(tmp_path / "img")).facts
    profile = load_profile("inference-latency")
    profile = replace(profile, health=replace(profile.health, gpu_count=8))
    found = {f.check_id: f for f in run_checks(facts, profile)}
    assert found["gpu.count"].status is Status.NOT_APPLICABLE and found["gpu.count"].detail.startswith("an image: ")
    assert (found["irq.irqbalance"].configured, found["irq.irqbalance"].active) == ("not installed", "-")
    inv = tmp_path / "inv.yaml"
    inv.write_text("hosts:\n  localhost:\n    transport: local\n    tune:\n      health: {gpu_count: 8}\n")
    planned = CliRunner().invoke(app, ["apply", "-i", str(inv), "--root", str(tmp_path / "img"), "--dry-run"]).output
    assert "gpu.count" not in planned, planned


def test_a_relative_root_that_is_this_hosts_own_root_is_refused_too(monkeypatch):
    monkeypatch.chdir("/")
    applied = CliRunner().invoke(app, ["apply", "--dry-run", "--root", "."])
    assert applied.exit_code == 2 and "--root /.: is this host's own root (/)" in applied.output, applied.output
