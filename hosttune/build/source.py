"""Which source a build starts from: a git repository (path or URL) at a ref resolved to a commit,
or, for the bundled engine, the engine/ folder of this checkout (named by a hash of its files).

Resolving is read-only (git ls-remote / rev-parse); the clone itself is a step of the plan.
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

from hosttune.build.errors import BuildError

_SHA = re.compile(r"^[0-9a-f]{40}$")
_SKIPPED = {"__pycache__", "build", "dist", ".pytest_cache"}


@dataclass(frozen=True)
class Source:
    location: str  # a git URL or path, or the engine folder
    ref: str  # as the user named it ("v0.6.3", "main", a sha), or "src.<hash>" for a folder
    commit: str | None  # the commit the ref names; None for a plain folder

    @property
    def label(self) -> str:
        """The ref as it appears in the wheelhouse key: the ref and the commit it named."""
        if self.commit is None or self.commit.startswith(self.ref):
            return self.ref if self.commit is None else self.commit[:12]
        return f"{safe_ref(self.ref)}-{self.commit[:12]}"


def safe_ref(text: str) -> str:
    """A ref as a wheelhouse key spells it: HEAD~1 as HEAD_1, release/v1 as release_v1."""
    return re.sub(r"[^A-Za-z0-9._+]+", "_", text)


def _git(argv: list[str]) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(["git", *argv], capture_output=True, text=True, timeout=300,
                              env={**os.environ, "GIT_TERMINAL_PROMPT": "0"})
    except (OSError, subprocess.SubprocessError) as exc:
        raise BuildError(f"git {argv[0]}: {exc}") from None


def is_local_repo(location: str) -> bool:
    return Path(location).is_dir()


def parse_ls_remote(text: str, ref: str) -> str | None:
    """The commit `ref` names in `git ls-remote` output; a peeled tag (^{}) wins over the tag object."""
    wanted = (f"refs/tags/{ref}^{{}}", f"refs/tags/{ref}", f"refs/heads/{ref}", ref)
    found: dict[str, str] = {}
    for line in text.splitlines():
        sha, _, name = line.partition("\t")
        found[name.strip()] = sha.strip()
    return next((found[n] for n in wanted if n in found), None)


def resolve_git(location: str, ref: str) -> Source:
    """The commit `ref` names in the repository at `location` (path or URL)."""
    if is_local_repo(location):
        if _git(["-C", location, "rev-parse", "--git-dir"]).returncode != 0:
            raise BuildError(f"--source {location} is not a git repository; give a git checkout's path or a git URL")
        proc = _git(["-C", location, "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}"])
        if proc.returncode != 0:
            raise BuildError(f"--ref {ref!r} names no commit in {location}")
        return Source(location, ref, proc.stdout.strip())
    if _SHA.match(ref):
        return Source(location, ref, ref)
    proc = _git(["ls-remote", location, ref, f"{ref}^{{}}"])
    if proc.returncode != 0:
        said = next((line for line in proc.stderr.splitlines() if line.strip()), f"git exit {proc.returncode}")
        raise BuildError(f"cannot read {location} ({said.strip()[:300]}); give --source a git repository path or "
                         "URL this machine can reach")
    commit = parse_ls_remote(proc.stdout, ref)
    if commit is None:
        raise BuildError(f"--ref {ref!r}: no such tag or branch in {location} (a full commit sha works too)")
    return Source(location, ref, commit)


def tree_hash(folder: Path) -> str:
    """A hash of every file under folder (paths and bytes) that git does not ignore.

    Outside a git checkout: every file but caches and build output.
    """
    digest = hashlib.sha256()
    for path in sorted(_files(folder)):
        digest.update(str(path.relative_to(folder)).encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()


def _files(folder: Path):
    listed = _git(["-C", str(folder), "ls-files", "-z", "--cached", "--others", "--exclude-standard", "."])
    if listed.returncode == 0:
        yield from (p for p in (folder / name for name in listed.stdout.split("\0") if name) if p.is_file())
        return
    for root, dirs, files in os.walk(folder):
        dirs[:] = [d for d in dirs if d not in _SKIPPED and not d.endswith(".egg-info")]
        for name in files:
            if not name.endswith((".pyc", ".pyo")):
                yield Path(root) / name


def engine_folder() -> Path:
    """engine/ beside the hosttune package (a source checkout: that is where the engine's sources are)."""
    folder = Path(__file__).resolve().parents[2] / "engine"
    if not (folder / "pyproject.toml").is_file():
        raise BuildError(f"the bundled engine's sources are not at {folder}: build from a hosttune source checkout")
    return folder


def resolve_custom(ref: str | None) -> Source:
    """The bundled engine: this checkout's engine/ folder, or engine/ at a git ref of this repository."""
    folder = engine_folder()
    if ref is None:
        return Source(str(folder), f"src.{tree_hash(folder)[:12]}", None)
    return resolve_git(str(folder.parent), ref)
