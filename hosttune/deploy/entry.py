"""Which wheelhouse entry a host gets: the newest of the engine (or of --ref) built for its Python, its GPUs'
compute capabilities and a CUDA its driver runs."""

from __future__ import annotations

from hosttune.build.archs import covers
from hosttune.build.source import safe_ref
from hosttune.build.wheelhouse import Entry, entries, read_entry
from hosttune.deploy.errors import DeployError
from hosttune.deploy.request import DeployRequest
from hosttune.presets import cuda_major


def _of_ref(entry: Entry, ref: str) -> bool:
    """The entry was built from `ref`: its key names it (as the key spells it), or its commit starts with it."""
    name = safe_ref(ref)
    return entry.key.ref in (ref, name) or entry.key.ref.startswith(name + "-") or (entry.commit or "").startswith(ref)


def _driver_runs(built_with: str | None, driver: str | None) -> bool:
    """Wheels compiled with a CUDA toolkit run on a driver of that major version or a later one (None: not judged)."""
    toolkit, runs = cuda_major(built_with), cuda_major(driver)
    return toolkit is None or runs is None or toolkit <= runs


def pick_entry(request: DeployRequest, abi: str | None, archs: tuple[str, ...], host: str,
               cuda: str | None = None) -> Entry:
    """The newest wheelhouse entry of the engine that this host can install and run (cuda: its driver's CUDA)."""
    built = entries(request.wheelhouse, request.engine)
    candidates = [e for e in built if _of_ref(e, request.ref)] if request.ref else built
    fitting = [e for e in candidates if (e.is_pure or e.key.python_abi == abi)
               and all(covers(e.key.archs, a) for a in archs if e.key.archs) and _driver_runs(e.key.cuda, cuda)]
    if not fitting:
        have = ", ".join(e.key.name for e in built) or "none"
        of_ref = f" of --ref {request.ref}" if request.ref else ""
        driver = f", a driver of CUDA {cuda}" if cuda and archs else ""
        toolkit = f" with a CUDA toolkit of {cuda_major(cuda)}.x or older" if driver and cuda_major(cuda) else ""
        raise DeployError(
            f"{host}: no {request.engine} wheels{of_ref} in {request.wheelhouse} fit this host (Python {abi or '?'}"
            f"{', GPUs ' + ','.join(archs) if archs else ''}{driver}; built: {have}). Run: hosttune build --engine "
            f"{request.engine}{' --ref ' + request.ref if request.ref else ''} --arch auto -i INVENTORY{toolkit}")
    entry = read_entry(fitting[0].path)  # hashed again: what gets shipped is what was built
    if entry is None:
        raise DeployError(f"{fitting[0].path}: a wheel no longer matches its recorded hash; build it again")
    return entry
