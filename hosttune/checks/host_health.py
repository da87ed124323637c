"""Host health for serving: /dev/shm and a real CUDA smoke test on every GPU."""

from __future__ import annotations

from hosttune.checks.base import Check, gpu_unavailable, na
from hosttune.probes.facts import Facts
from hosttune.checks.findings import Severity, Status, Verdict
from hosttune.config.profile import Profile

# cuInit errors whose cause the host shows elsewhere, with the check that explains it.
_CUDA_HINTS = {
    "CUDA_ERROR_SYSTEM_NOT_READY": "Fabric Manager has not set up the NVSwitch fabric (see gpu.fabric)",
    "CUDA_ERROR_NO_DEVICE": "the driver shows no usable GPU (see gpu.count)",
    "CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE": "a CUDA forward-compatibility library is in the loader path",
    "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH": "the kernel module and libcuda differ (see driver.version)",
}


# A GPU that a serving engine holds (exclusive-process mode, or its memory taken) refuses a
# second context: that is the engine working, not a fault.
_BUSY = ("CUDA_ERROR_DEVICES_UNAVAILABLE", "CUDA_ERROR_OUT_OF_MEMORY")


def shm(facts: Facts, profile: Profile) -> Verdict:
    want = profile.health.shm_min_mib
    if want is None:
        return na("/dev/shm size not managed by the profile")
    if facts.image:
        return na("an image: /dev/shm is a tmpfs mounted at boot (check it on the running host)", f">= {want} MiB")
    s = facts.health.shm
    desired = f">= {want} MiB"
    if s.size_kib is None:
        return Verdict(Status.DRIFT, desired, None, "missing", "/dev/shm is not mounted: NCCL and the engines' shared-memory queues fail")
    size_mib = s.size_kib // 1024
    active = f"{size_mib} MiB ({s.used_kib // 1024 if s.used_kib is not None else '?'} MiB used, {s.fstype or '?'})"
    if size_mib < want:
        return Verdict(Status.DRIFT, desired, None, active, f"/dev/shm is {size_mib} MiB: NCCL's shared-memory transport "
                       "and multi-GPU engines fail with bus errors or 'No space left on device'")
    return Verdict(Status.OK, desired, None, active)


def _hint(error: str) -> str:
    return next((f": {hint}" for code, hint in _CUDA_HINTS.items() if code in error), "")


def cuda_smoke(facts: Facts, profile: Profile) -> Verdict:
    if missing := gpu_unavailable(facts):
        return missing
    run = facts.health.cuda
    desired = "a context, allocation, copy and kernel succeed on every GPU"
    if run is None:
        return na("the CUDA smoke test did not run on this host", desired)
    if run.runtime is None:
        return na(f"no CUDA runtime to test with: {run.error}", desired)
    if run.error:
        return Verdict(Status.DRIFT, desired, None, "CUDA unusable", run.error + _hint(run.error))
    busy = [g for g in run.gpus if not g.ok and any(code in g.error for code in _BUSY)]
    failed = [g for g in run.gpus if not g.ok and g not in busy]
    problems = [f"GPU{g.index}: {g.error}{_hint(g.error)}" for g in failed]
    if len(run.gpus) < len(facts.gpu.gpus):
        problems.append(f"CUDA sees {len(run.gpus)} GPU(s), NVML {len(facts.gpu.gpus)}")
    times = [g.ms for g in run.gpus if g.ok and g.ms is not None]
    active = f"{len(run.gpus) - len(failed) - len(busy)} of {len(run.gpus)} GPU(s) passed" + (f" (slowest {max(times):.0f} ms)" if times else "")
    notes = [f"GPU{g.index} not tested: held by another process ({g.error})" for g in busy]
    return Verdict(Status.DRIFT if problems else Status.OK, desired, None, active, "; ".join(problems + notes))


CHECKS = (
    Check("sys.shm", "shared memory (/dev/shm) size", Severity.WARNING,
          "NCCL's shared-memory transport and multi-GPU engines put their buffers in /dev/shm; the 64 MiB a container "
          "gets by default makes them crash with bus errors.",
          "mount -o remount,size=16G /dev/shm and persist it in /etc/fstab "
          "(tmpfs /dev/shm tmpfs defaults,size=16G 0 0); in a container, start it with --shm-size or --ipc=host", False, shm),
    Check("cuda.smoke", "CUDA smoke test", Severity.CRITICAL,
          "NVML can report a healthy GPU on which no CUDA program runs (Fabric Manager down, a broken libcuda, a "
          "wedged GPU); only a real context, copy and kernel prove it can serve.",
          "read the CUDA error it names: start Fabric Manager for error 802, reset or reboot a wedged GPU, "
          "reinstall the driver for a library mismatch", False, cuda_smoke),
)
