"""`apply --root` bakes a Debian image: facts from the image only, idempotent, rollback byte for byte.

The image is an overlay of the cached debootstrap root with a grub configuration added; hosttune
reaches it over the local transport, as on an image build machine. Nothing here boots.
"""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from typer.testing import CliRunner

from hosttune.cli import app

from .apply_setup import UPDATE_GRUB, fake_nvcc, tree
from .rootfs import make_root

pytestmark = pytest.mark.live
runner = CliRunner()


def write(root: Path, path: str, text: str, mode: int = 0o644) -> None:
    target = root / path.lstrip("/")
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text)
    target.chmod(mode)


@pytest.fixture
def image(live_image, tmp_path):
    """A writable image with grub's configuration, update-grub and a CUDA 12.4 toolkit that /usr/local/cuda names."""
    host_dir = tmp_path / "image"
    host_dir.mkdir()
    root, _ = make_root(live_image.root, host_dir)
    write(root, "/etc/default/grub", 'GRUB_DEFAULT=0\nGRUB_TIMEOUT=5\nGRUB_CMDLINE_LINUX_DEFAULT="quiet"\nGRUB_CMDLINE_LINUX=""\n')
    write(root, "/usr/sbin/update-grub", UPDATE_GRUB, 0o755)  # run inside the image with chroot
    write(root, "/usr/local/cuda-12.4/bin/nvcc", fake_nvcc("12.4"), 0o755)
    (root / "usr/local/cuda").symlink_to("/usr/local/cuda-12.4")
    subprocess.run(["chroot", str(root), "update-grub"], check=True)
    yield root
    subprocess.run(["umount", str(root)], capture_output=True)


def apply_json(inv: Path, root: Path, *args: str) -> tuple[int, dict]:
    result = runner.invoke(app, ["apply", "-i", str(inv), "--root", str(root), "--format", "json", *args])
    assert isinstance(result.exception, (SystemExit, type(None))), result.exception
    return result.exit_code, json.loads(result.stdout)


def image_inventory(tmp_path: Path) -> Path:
    """This machine over the local transport, with the CPU list an image cannot give."""
    inv = tmp_path / "inv.yaml"
    inv.write_text('hosts:\n  localhost:\n    transport: local\n    rcu_nocbs: "2-31"\n'
                   '    pins: {cuda: "12.4", python: "3.11"}\n')
    return inv


def unit_enabled(root: Path, unit: str) -> str:
    return subprocess.run(["systemctl", f"--root={root}", "is-enabled", unit], capture_output=True, text=True).stdout.strip()


def test_apply_root_bakes_the_image_from_its_own_facts_then_rollback_restores_every_byte(image, tmp_path):
    inv = image_inventory(tmp_path)
    before = tree(image)

    code, dry = apply_json(inv, image, "--dry-run")
    (host,) = dry["hosts"]
    fixes = {c for step in host["plan"]["steps"] for c in step["fixes"]}
    assert fixes == {"cpu.governor", "cpu.cstates", "kernel.rcu_nocbs", "irq.irqbalance", "numa.topology", "mm.thp",
                     "cuda.toolkit"}, host["plan"]
    text = runner.invoke(app, ["apply", "-i", str(inv), "--root", str(image), "--dry-run"]).stdout
    pid1 = Path("/proc/1/comm").read_text().strip()
    assert "PID 1" not in text and pid1 not in text  # the build machine's init is nobody's business here
    assert "rcu_nocbs=2-31" in text  # the inventory's list: an image has no CPUs to derive one from
    assert tree(image) == before

    code, doc = apply_json(inv, image, "--yes")
    (host,) = doc["hosts"]
    assert host["state"] == "changed", host
    dropin = (image / "etc/default/grub.d/90-hosttune.cfg").read_text()
    assert "intel_idle.max_cstate=1 processor.max_cstate=1 rcu_nocbs=2-31" in dropin
    assert "quiet intel_idle.max_cstate=1 processor.max_cstate=1 rcu_nocbs=2-31" in (image / "boot/grub/grub.cfg").read_text()
    assert unit_enabled(image, "irqbalance.service") == "disabled"
    assert unit_enabled(image, "hosttune-thp.service") == "enabled"
    assert unit_enabled(image, "hosttune-cpu-governor.service") == "enabled"
    assert (image / "etc/sysctl.d/90-hosttune.conf").read_text().endswith("kernel.numa_balancing = 0\n")
    assert "/usr/local/cuda/bin" in (image / "etc/profile.d/hosttune-cuda.sh").read_text()

    code, again = apply_json(inv, image, "--dry-run")
    (host,) = again["hosts"]
    assert host["plan"]["steps"] == [] and code == 0, host["plan"]  # idempotent: the image holds every setting

    result = runner.invoke(app, ["rollback", "--yes", "-i", str(inv), "--root", str(image)])
    assert result.exit_code == 0 and "restored" in result.stdout, result.stdout
    after = tree(image)
    assert {k: v for k, v in after.items() if before.get(k) != v} == {} and set(before) == set(after)


def test_apply_root_on_a_minimal_image_plans_what_it_lacks_and_rollback_restores_every_byte(tmp_path):
    """An image with only etc/default/grub: no /usr/local, no update-grub, no shell to chroot into."""
    image = tmp_path / "minimal"
    write(image, "/etc/default/grub", 'GRUB_DEFAULT=0\nGRUB_CMDLINE_LINUX_DEFAULT="quiet"\nGRUB_CMDLINE_LINUX=""\n')
    inv = image_inventory(tmp_path)
    before = tree(image)

    code, dry = apply_json(inv, image, "--dry-run")
    (host,) = dry["hosts"]
    assert host["error"] is None and tree(image) == before, host
    ops = [op["description"] for step in host["plan"]["steps"] for op in step["ops"]]
    assert ops.index("make directory /usr/local") < ops.index("link /usr/local/cuda -> /usr/local/cuda-12.4")
    assert "$ update-grub" not in ops  # nothing the image cannot do is planned as if it could
    notes = [n for step in host["plan"]["steps"] for n in step["notes"]]
    assert any("the image has no update-grub" in n and "the image's own update-grub" in n for n in notes)
    text = runner.invoke(app, ["apply", "-i", str(inv), "--root", str(image), "--dry-run"]).stdout
    assert "checked on the host before anything is sent:" in text and "added: make directory /usr/local" in text

    code, doc = apply_json(inv, image, "--yes")
    (host,) = doc["hosts"]
    assert host["state"] == "changed" and all(s["status"] == "done" for s in host["steps"]), host
    dropin = (image / "etc/default/grub.d/90-hosttune.cfg").read_text()
    assert "intel_idle.max_cstate=1 processor.max_cstate=1 rcu_nocbs=2-31" in dropin
    assert (image / "usr/local/cuda").is_symlink()

    code, again = apply_json(inv, image, "--yes")
    (host,) = again["hosts"]
    assert host["state"] == "ok" and host["plan"]["steps"] == [] and again["run"] is None, host

    result = runner.invoke(app, ["rollback", "--yes", "-i", str(inv), "--root", str(image)])
    assert result.exit_code == 0 and "restored" in result.stdout, result.stdout
    after = {k: v for k, v in tree(image).items() if k not in ("/var", "/var/lib")}  # the journals' folder stays
    assert after == before  # every byte, and every directory apply made is gone
