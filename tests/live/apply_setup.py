"""Make a live container look like an untuned GPU host (shared by the apply/verify live tests).

No GPU exists in a container, so the GPU side is replayed: a fake `nvidia-smi` prints the
outputs recorded on a real H200 (tests/fixtures/h200), and a fake `nvidia-persistenced`
unit stands in for the daemon. Everything else is real: Debian's irqbalance unit, real
.deb packages and holds, sysctl.d, grub's /etc/default files, profile.d login shells.
"""
from __future__ import annotations

import hashlib
import textwrap
from pathlib import Path

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "h200"
FAKE_DRIVER_PKG = "nvidia-kernel-common-535"
SNAPSHOT_DIRS = ("/etc", "/usr/local", "/boot")
SNAPSHOT_SKIP = ("/etc/ld.so.cache",)  # rebuilt by dpkg triggers of package installs, not by hosttune
JOURNALS = "/var/lib/hosttune"  # the run journals stay, so rollback knows the run was undone
# The containers share this machine's kernel and so its cpuidle driver: on a VM guest whose driver is haltpoll
# cpu.cstates is not-applicable and apply writes no C-state limit; on intel_idle or acpi_idle both happen.
_IDLE_DRIVER = Path("/sys/devices/system/cpu/cpuidle/current_driver")
HALTPOLL = _IDLE_DRIVER.exists() and _IDLE_DRIVER.read_text().strip() == "haltpoll"

FAKE_SMI = """\
#!/bin/sh
# Replays nvidia-smi outputs recorded on a real H200.
case "$*" in
  *-q*-x*) cat /usr/local/lib/fake-gpu/nvidia-smi-q.xml ;;
  *--query-gpu*) cat /usr/local/lib/fake-gpu/nvidia-smi-query.csv ;;
  *) echo "fake nvidia-smi: $*" >&2; exit 1 ;;
esac
"""
PERSISTENCED_UNIT = """\
[Unit]
Description=NVIDIA persistence daemon (stand-in for hosttune's live tests)
[Service]
ExecStart=/usr/local/sbin/nvidia-persistenced infinity
[Install]
WantedBy=multi-user.target
"""
UPDATE_GRUB = """\
#!/bin/sh
# Stand-in for update-grub: renders /boot/grub/grub.cfg from /etc/default/grub and grub.d like grub-mkconfig does.
set -e
. /etc/default/grub
for f in /etc/default/grub.d/*.cfg; do [ -r "$f" ] && . "$f"; done
mkdir -p /boot/grub
printf 'menuentry "Debian GNU/Linux" {\\n\\tlinux /boot/vmlinuz root=/dev/vda1 ro %s %s\\n}\\n' "$GRUB_CMDLINE_LINUX" "$GRUB_CMDLINE_LINUX_DEFAULT" > /boot/grub/grub.cfg
"""


def fake_nvcc(release: str) -> str:
    return f"#!/bin/sh\necho 'nvcc: NVIDIA (R) Cuda compiler driver'\necho 'Cuda compilation tools, release {release}, V{release}.99'\necho 'Build cuda_{release}.r{release}/compiler.0_0'\n"


def write(host, path: str, text: str, mode: int = 0o644) -> None:
    target = host.path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text)
    target.chmod(mode)


def install_fake_deb(host, name: str = FAKE_DRIVER_PKG, version: str = "535.129.03-1") -> None:
    host.exec(textwrap.dedent(f"""\
        set -e
        d=$(mktemp -d); mkdir -p $d/DEBIAN
        printf 'Package: {name}\\nVersion: {version}\\nArchitecture: all\\nMaintainer: t <t@t>\\nDescription: test\\n' > $d/DEBIAN/control
        dpkg-deb --build $d /var/tmp/{name}.deb >/dev/null && dpkg -i /var/tmp/{name}.deb >/dev/null
    """))


def make_untuned(host) -> None:
    """The drift apply can fix in a container: a unit, a hold, files, a link, a package at a pin."""
    # GPU side, replayed
    write(host, "/usr/local/lib/fake-gpu/nvidia-smi-q.xml", (FIXTURES / "nvidia-smi-q.xml").read_text())
    write(host, "/usr/local/lib/fake-gpu/nvidia-smi-query.csv", (FIXTURES / "nvidia-smi-query.csv").read_text())
    write(host, "/usr/local/bin/nvidia-smi", FAKE_SMI, 0o755)
    host.exec("cp /bin/sleep /usr/local/sbin/nvidia-persistenced")
    write(host, "/etc/systemd/system/nvidia-persistenced.service", PERSISTENCED_UNIT)
    install_fake_deb(host)  # an unheld driver package
    # a site sysctl that turns NUMA balancing back on at boot, sorting after hosttune's file
    write(host, "/etc/sysctl.d/95-site.conf", "# site defaults\nvm.swappiness = 10\nkernel.numa_balancing = 1\n")
    # grub's configuration, and update-grub
    write(host, "/etc/default/grub", 'GRUB_DEFAULT=0\nGRUB_TIMEOUT=5\nGRUB_CMDLINE_LINUX_DEFAULT="quiet"\nGRUB_CMDLINE_LINUX=""\n')
    write(host, "/usr/sbin/update-grub", UPDATE_GRUB, 0o755)
    # CUDA: the pinned toolkit and a stale one that a profile.d file puts first on PATH
    write(host, "/usr/local/cuda-12.4/bin/nvcc", fake_nvcc("12.4"), 0o755)
    write(host, "/usr/local/cuda-11.8/bin/nvcc", fake_nvcc("11.8"), 0o755)
    write(host, "/etc/profile.d/cuda-11.8.sh", "export PATH=/usr/local/cuda-11.8/bin:$PATH\n")
    host.exec("systemctl daemon-reload && update-grub")


def host_vars(**extra) -> dict:
    """Inventory vars for an untuned host: pins that make hello=2.10-3 the 'driver' package."""
    tune = {"driver": {"packages": ["hello"]}}
    for section, values in extra.pop("tune", {}).items():
        tune.setdefault(section, {}).update(values)
    return {"pins": {"driver": "2.10", "cuda": "12.4", "python": "3.11"}, "tune": tune, **extra}


def snapshot(host) -> dict[str, str]:
    """sha256 of every file (and the target of every link) under SNAPSHOT_DIRS, from the host side."""
    out = {}
    for top in SNAPSHOT_DIRS:
        base = host.path(top)
        for path in sorted(base.rglob("*")) if base.exists() else ():
            rel = "/" + str(path.relative_to(host.root))
            if rel in SNAPSHOT_SKIP:
                continue
            if path.is_symlink():
                out[rel] = "link:" + str(path.readlink())
            elif path.is_file():
                out[rel] = hashlib.sha256(path.read_bytes()).hexdigest() + f" {path.stat().st_mode:o}"
    return out


def held(host) -> set[str]:
    return set(host.exec("apt-mark showhold").stdout.split())


def unit_state(host, unit: str) -> tuple[str, str]:
    enabled = host.exec(f"systemctl is-enabled {unit}", check=False).stdout.strip()
    active = host.exec(f"systemctl is-active {unit}", check=False).stdout.strip()
    return enabled, active


def tree(root: Path) -> dict[str, str]:
    """Every path under root with its kind, mode and bytes (or link target); hosttune's journals aside."""
    out = {}
    for path in sorted(root.rglob("*")):
        rel = "/" + str(path.relative_to(root))
        if rel == JOURNALS or rel.startswith(JOURNALS + "/"):
            continue
        st = path.lstat()
        if path.is_symlink():
            out[rel] = "link " + str(path.readlink())
        elif path.is_file():
            out[rel] = f"file {st.st_mode:o} {st.st_uid}:{st.st_gid} " + hashlib.sha256(path.read_bytes()).hexdigest()
        else:
            out[rel] = f"{'dir' if path.is_dir() else 'other'} {st.st_mode:o} {st.st_uid}:{st.st_gid}"
    return out
