"""The Debian bookworm root the live test hosts boot from, built once and cached.

The cache key is a hash of the recipe (suite, variant, packages, post-install script),
so changing the recipe builds a new image beside the old one. A build goes to a temporary
directory and is renamed into place only when complete: an interrupted build never
leaves a half-made image where the next run would trust it.
"""
from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

CACHE_ROOT = Path(os.environ.get("HOSTTUNE_IMAGE_CACHE", "/var/cache/hosttune-tests"))
MIRROR = os.environ.get("HOSTTUNE_DEBIAN_MIRROR", "http://deb.debian.org/debian")
READY_MARK = ".hosttune-image-ok"

# What hosttune's probes and actions expect on a Debian host, beyond systemd and sshd:
# sysctl/ps (procps), ip, lsmod, numactl, irqbalance (inactive in containers by its own
# ConditionVirtualization=!container), venv for deploy's versioned virtualenvs, and nginx
# for the host-local upstream over a host's replicas.
PACKAGES = (
    "systemd", "systemd-sysv", "openssh-server", "python3", "dbus", "sudo",
    "procps", "iproute2", "kmod", "python3-venv", "numactl", "irqbalance", "nginx-light",
)

# Runs inside the new root (chroot) once per build. Host keys are removed here and
# generated per container, so every container has its own key.
POST_INSTALL = r"""
set -eu
useradd --create-home --shell /bin/bash deploy
echo 'deploy ALL=(ALL) NOPASSWD:ALL' > /etc/sudoers.d/deploy
chmod 0440 /etc/sudoers.d/deploy
rm -f /etc/ssh/ssh_host_*
cat > /etc/ssh/sshd_config.d/10-hosttune-test.conf <<'EOF'
HostKey /etc/ssh/ssh_host_ed25519_key
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin prohibit-password
UseDNS no
EOF
# Timers that would grab the dpkg lock in the middle of a test, and a console getty
# nobody logs in on.
for unit in apt-daily.timer apt-daily-upgrade.timer dpkg-db-backup.timer \
            e2scrub_all.timer fstrim.timer console-getty.service; do
    ln -sf /dev/null "/etc/systemd/system/$unit"
done
# Containers share the host's network: no nginx on port 80 at boot; deploy starts it on its own port.
rm -f /etc/nginx/sites-enabled/default /etc/systemd/system/multi-user.target.wants/nginx.service
apt-get clean
"""


@dataclass(frozen=True)
class Recipe:
    suite: str = "bookworm"
    variant: str = "minbase"
    packages: tuple[str, ...] = PACKAGES
    post_install: str = POST_INSTALL

    @property
    def key(self) -> str:
        text = "\n".join([self.suite, self.variant, ",".join(sorted(self.packages)), self.post_install])
        return hashlib.sha256(text.encode()).hexdigest()[:12]

    @property
    def name(self) -> str:
        return f"{self.suite}-{self.key}"


@dataclass(frozen=True)
class Image:
    root: Path
    recipe: Recipe
    build_s: float  # 0.0 when it came from the cache


class ImageBuildError(RuntimeError):
    pass


def ensure_image(recipe: Recipe = Recipe(), cache_root: Path = CACHE_ROOT) -> Image:
    """Return the cached root for `recipe`, building it first if it is not there yet."""
    final = cache_root / recipe.name
    if (final / READY_MARK).exists():
        return Image(final, recipe, 0.0)
    cache_root.mkdir(parents=True, exist_ok=True)
    # One builder at a time per recipe; the others wait and then find it built.
    with open(cache_root / f".lock-{recipe.name}", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (final / READY_MARK).exists():
            return Image(final, recipe, 0.0)
        _remove_stale_builds(cache_root, recipe)
        started = time.monotonic()
        _build(recipe, final)
        return Image(final, recipe, time.monotonic() - started)


def _build(recipe: Recipe, final: Path) -> None:
    tmp = final.parent / f".build-{recipe.name}-{os.getpid()}"
    try:
        _debootstrap(recipe, tmp)
        _run(["chroot", str(tmp), "/bin/sh", "-c", recipe.post_install], "post-install")
        (tmp / READY_MARK).write_text(f"{recipe}\n")
        if final.exists():  # a directory without READY_MARK: a broken leftover
            remove_tree(final)
        os.rename(tmp, final)
    except BaseException:
        remove_tree(tmp)
        raise


def _debootstrap(recipe: Recipe, target: Path) -> None:
    if shutil.which("debootstrap") is None:
        raise ImageBuildError("debootstrap is missing: apt-get install debootstrap")
    argv = [
        "debootstrap", f"--variant={recipe.variant}", "--include=" + ",".join(recipe.packages),
        recipe.suite, str(target), MIRROR,
    ]
    _run(argv, "debootstrap")


def _run(argv: list[str], what: str) -> None:
    proc = subprocess.run(argv, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-30:])
        raise ImageBuildError(f"{what} failed (exit {proc.returncode}): {' '.join(argv)}\n{tail}")


def _remove_stale_builds(cache_root: Path, recipe: Recipe) -> None:
    # Called under the recipe's lock, so any build directory left is from a dead builder.
    for stale in cache_root.glob(f".build-{recipe.name}-*"):
        remove_tree(stale)


def mounts_under(path: Path) -> list[Path]:
    """Mount points at or below `path`, deepest first (debootstrap mounts /proc, /sys)."""
    base = str(path.resolve())
    points = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            point = line.split()[4].encode().decode("unicode_escape")
            if point == base or point.startswith(base + "/"):
                points.append(Path(point))
    return sorted(points, key=lambda p: len(p.parts), reverse=True)


def remove_tree(path: Path) -> None:
    """rm -rf that first unmounts anything mounted inside, and never crosses into a mount."""
    if not path.exists():
        return
    _unmount_under(path)
    subprocess.run(["rm", "-rf", "--one-file-system", str(path)], check=True)


def remove_tree_later(path: Path, trash: Path) -> subprocess.Popen | None:
    """remove_tree's unmounting now, then the folder moved to `trash` (on the same filesystem) and deleted by an
    rm in the background: a host's root with the virtualenvs deployed to it takes 20-30 s to delete, which the
    next test need not wait for. The caller waits for the returned process before removing trash's parent."""
    if not path.exists():
        return None
    _unmount_under(path)
    path.rename(trash)
    return subprocess.Popen(["nice", "-n", "19", "rm", "-rf", "--one-file-system", str(trash)])


def _unmount_under(path: Path) -> None:
    for point in mounts_under(path):
        subprocess.run(["umount", "--lazy", str(point)], capture_output=True)
