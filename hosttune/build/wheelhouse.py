"""The wheelhouse: built wheels in folders keyed by (engine, ref, archs, CUDA version, Python ABI).

    WHEELHOUSE/vllm-v0.11.0-1a2b3c4d5e6f-sm_80.sm_90-cu13.0-cp311/
        wheels/*.whl          the engine's own wheels
        deps/*.whl            its dependencies (build --deps), for hosts without a package index
        build.log             the full build log
        manifest.json         written last: an entry without one is not complete

A folder appears under its key only when complete (built in a staging folder, then renamed),
so a second build with the same key is a cache hit and an interrupted one never is.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from hosttune.build.archs import sm_name

MANIFEST = "manifest.json"


def default_wheelhouse() -> Path:
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    return Path(cache) / "hosttune" / "wheelhouse"


@dataclass(frozen=True)
class WheelKey:
    engine: str
    ref: str  # the source's label: ref and commit, or the engine folder's hash
    archs: tuple[str, ...]  # () for a pure-Python engine: Triton compiles on the host
    cuda: str | None  # None for a pure-Python engine
    python_abi: str  # "cp311"

    @property
    def name(self) -> str:
        archs = ".".join(sm_name(a) for a in self.archs) or "anyarch"
        cuda = f"cu{self.cuda}" if self.cuda else "anycuda"
        return f"{self.engine}-{self.ref}-{archs}-{cuda}-{self.python_abi}"


@dataclass(frozen=True)
class WheelFile:
    name: str
    sha256: str
    size: int
    kind: str = "engine"  # engine | dep
    cuda_archs: dict[str, tuple[str, ...]] = field(default_factory=dict, hash=False)  # library → sm_* found


@dataclass(frozen=True)
class Entry:
    """One complete wheelhouse folder."""

    path: Path
    key: WheelKey
    wheels: tuple[WheelFile, ...]
    source: str
    commit: str | None
    built_at: float
    build_s: float
    toolchain: dict = field(default_factory=dict, hash=False)

    def file(self, wheel: WheelFile) -> Path:
        return self.path / ("wheels" if wheel.kind == "engine" else "deps") / wheel.name

    @property
    def engine_wheels(self) -> tuple[WheelFile, ...]:
        return tuple(w for w in self.wheels if w.kind == "engine")

    @property
    def has_deps(self) -> bool:
        return any(w.kind == "dep" for w in self.wheels)

    @property
    def is_pure(self) -> bool:
        """Only py3-none-any wheels: any host's Python 3 can install it."""
        return all(w.name.endswith("-none-any.whl") for w in self.wheels)


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def describe_wheels(folder: Path, kind: str, archs: dict[str, dict[str, tuple[str, ...]]] | None = None) -> list[WheelFile]:
    archs = archs or {}
    return [WheelFile(p.name, sha256_file(p), p.stat().st_size, kind, archs.get(p.name, {}))
            for p in sorted(folder.glob("*.whl"))]


def write_manifest(entry: Entry) -> None:
    doc = asdict(entry)
    doc["path"] = None
    tmp = entry.path / f".{MANIFEST}.tmp"
    tmp.write_text(json.dumps(doc, indent=1, default=list) + "\n")
    tmp.rename(entry.path / MANIFEST)


def read_entry(path: Path, *, verify: bool = True) -> Entry | None:
    """The entry in `path`, or None when it is incomplete or a wheel no longer matches its hash."""
    try:
        doc = json.loads((path / MANIFEST).read_text())
        key_doc = doc.pop("key")
        key = WheelKey(**{**key_doc, "archs": tuple(key_doc["archs"])})
        wheels = tuple(WheelFile(**{**w, "cuda_archs": {k: tuple(v) for k, v in w["cuda_archs"].items()}})
                       for w in doc.pop("wheels"))
        doc.pop("path", None)
        entry = Entry(path=path, key=key, wheels=wheels, **doc)
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if verify and not all(_intact(entry.file(w), w) for w in wheels):
        return None
    return entry


def _intact(path: Path, wheel: WheelFile) -> bool:
    try:
        return path.stat().st_size == wheel.size and sha256_file(path) == wheel.sha256
    except OSError:
        return False


def lookup(wheelhouse: Path, key: WheelKey) -> Entry | None:
    """A cache hit: the complete, intact entry for this key, if there is one."""
    return read_entry(wheelhouse / key.name)


def entries(wheelhouse: Path, engine: str) -> list[Entry]:
    """Every complete entry of an engine, newest first (not re-hashed: deploy hashes what it ships)."""
    found = [read_entry(p, verify=False) for p in wheelhouse.glob(f"{engine}-*") if p.is_dir()]
    return sorted((e for e in found if e and e.key.engine == engine), key=lambda e: e.built_at, reverse=True)


def now() -> float:
    return time.time()
