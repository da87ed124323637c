"""Links inside an image (`--root`) are resolved as the image resolves them: reads and writes stay inside it."""

from __future__ import annotations

import shutil

import pytest

from typer.testing import CliRunner

from hosttune.cli import app
from hosttune.probes.gather import gather
from hosttune.transport.local import LocalTransport
from test_image_probe import make_image, write


def test_a_folder_linked_above_the_image_root_is_read_and_written_inside_the_image(tmp_path):
    """/etc/sysctl.d -> ../../outside climbs, on this machine, out of the image into a folder of its own: the image's
    `..` stops at its root, so its sysctl.d is ROOT/outside, and the machine's folder is neither read nor written."""
    image, outside = tmp_path / "img", tmp_path / "outside"
    make_image(image)
    outside.mkdir()
    (outside / "95-site.conf").write_text("kernel.numa_balancing = 1\n")
    shutil.rmtree(image / "etc/sysctl.d")
    (image / "etc/sysctl.d").symlink_to("../../outside")
    facts = gather(LocalTransport(), root=str(image)).facts
    assert facts.numa_balancing_source != "/etc/sysctl.d/95-site.conf"
    result = CliRunner().invoke(app, ["apply", "--root", str(image), "--yes"])
    assert "failed=0" in result.output, result.output
    assert [p.name for p in outside.iterdir()] == ["95-site.conf"]
    assert (image / "outside/90-hosttune.conf").read_text().strip().endswith("kernel.numa_balancing = 0")


def test_an_absolute_link_names_the_images_folder_of_that_path_for_apply_and_rollback(tmp_path):
    """/etc/default -> HOST (an absolute path that exists on this machine too) is ROOT/HOST in the image: its grub is
    the one read, its grub.d gets the drop-in, and rollback takes it out there; the machine's folder stays as it was."""
    image, host = tmp_path / "img", tmp_path / "host/default"
    make_image(image)
    write(host, "/grub", 'GRUB_CMDLINE_LINUX="from-the-build-machine"\n')
    inside = image / str(host).lstrip("/")
    inside.parent.mkdir(parents=True)
    (image / "etc/default").rename(inside)
    (image / "etc/default").symlink_to(host)
    assert gather(LocalTransport(), root=str(image)).facts.cmdline_configured == ("console=ttyS0", "quiet")
    applied = CliRunner().invoke(app, ["apply", "--root", str(image), "--yes"])
    assert "failed=0" in applied.output, applied.output
    assert "intel_idle.max_cstate=1" in (inside / "grub.d/90-hosttune.cfg").read_text()
    assert [p.name for p in host.iterdir()] == ["grub"]
    rolled = CliRunner().invoke(app, ["rollback", "--root", str(image), "--yes"])
    assert rolled.exit_code == 0 and not (inside / "grub.d/90-hosttune.cfg").exists(), rolled.output
    assert [p.name for p in host.iterdir()] == ["grub"]


@pytest.mark.parametrize("folder", ["etc", "etc/sysctl.d"])
def test_a_folder_whose_link_loops_inside_the_image_is_refused_in_one_line_naming_the_path(tmp_path, folder):
    """/etc -> /etc is the build machine's /etc when followed here, and a loop inside the image."""
    image = tmp_path / "img"
    make_image(image)
    shutil.rmtree(image / folder)
    (image / folder).symlink_to(f"/{folder}")
    result = CliRunner().invoke(app, ["apply", "--root", str(image), "--dry-run"])
    assert result.exit_code == 2, result.output
    (line,) = [line for line in result.output.splitlines() if "goes through more than 40 links" in line]
    assert f": --root {image}: /{folder}" in line and line.endswith(" goes through more than 40 links inside the image")


def test_a_runs_folder_linked_to_an_absolute_path_is_the_images_folder_of_that_path(tmp_path):
    """The journal folder itself a link (to a folder that this machine has too): made private, written and read back
    for rollback in the image, never chmod-ed or read on this machine."""
    image, machine = tmp_path / "img", tmp_path / "machine-runs"
    make_image(image)
    machine.mkdir(mode=0o755)
    (image / "var/lib/hosttune").mkdir(parents=True)
    (image / "var/lib/hosttune/runs").symlink_to(machine)
    applied = CliRunner().invoke(app, ["apply", "--root", str(image), "--yes"])
    assert "failed=0" in applied.output, applied.output
    inside = image / str(machine).lstrip("/")
    assert ".json" in {p.suffix for p in inside.iterdir()} and (inside.stat().st_mode & 0o777) == 0o700
    rolled = CliRunner().invoke(app, ["rollback", "--root", str(image), "--yes"])
    assert rolled.exit_code == 0 and "restored" in rolled.output, rolled.output
    assert list(machine.iterdir()) == [] and (machine.stat().st_mode & 0o777) == 0o755


def test_the_dnf_lock_list_of_an_image_is_read_through_its_links_inside_the_image(tmp_path):
    import subprocess

    from hosttune.plan.state import state_script

    image, machine = tmp_path / "img", tmp_path / "machine-dnf"
    write(machine, "/plugins/versionlock.list", "the-build-machines-0:1-1.*\n")
    write(image / str(machine).lstrip("/"), "/plugins/versionlock.list", "nvidia-driver-3:550.54-1.el9.*\n")
    (image / "etc").mkdir()
    (image / "etc/dnf").symlink_to(machine)
    out = subprocess.run(["sh", "-c", state_script(), "s", str(image), "dnf", "held:"], capture_output=True,
                         text=True, check=True).stdout
    assert out.splitlines() == ["@@s:0", "lock:nvidia-driver-3:550.54-1.el9.*", "@@s-end:0"]
