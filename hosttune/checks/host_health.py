"""Host health for serving: /dev/shm, a real CUDA smoke test on every GPU, and a machine-id that names the machine."""

from __future__ import annotations

from hosttune.checks.base import Check, gpu_unavailable, is_systemd, na, not_systemd, unmanaged
from hosttune.probes.facts import Facts
from hosttune.checks.findings import Severity, Status, Verdict
from hosttune.config.profile import Profile
from hosttune.probes.machine import persistent_id

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
        return unmanaged("/dev/shm size not managed by the profile")
    if facts.image:
        return na("an image: /dev/shm is a tmpfs mounted at boot (check it on the running host)", f">= {want} MiB")
    s = facts.health.shm
    desired = f">= {want} MiB"
    if s is None:
        return Verdict(Status.ERROR, desired, detail="the probe did not read /dev/shm (its output has no health-host "
                       "section)")
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


_KEPT = "an id kept on disk, the same at every boot"


def machine_id(facts: Facts, profile: Profile) -> Verdict:
    if facts.image:
        return na("an image: systemd gives it its id at its first boot (an image should hold none)", _KEPT)
    if facts.machine_id_transient is None:  # the output of another hosttune's probe, which did not read it
        if not facts.machine_id:
            return na("the probe read no /etc/machine-id", _KEPT)
        return Verdict(Status.ERROR, _KEPT, None, facts.machine_id, "the probe did not say where /etc/machine-id "
                       "lives, so whether it lasts past this boot is unknown (the output of another hosttune version?)")
    raw = facts.machine_id
    if persistent_id(raw, facts.machine_id_transient):
        return Verdict(Status.OK, _KEPT, raw, raw)
    if not raw and not is_systemd(facts):
        return na(f"no /etc/machine-id: {not_systemd(facts)}", _KEPT)
    return Verdict(Status.DRIFT, _KEPT, "-", _shown(raw, facts.machine_id_transient), _why(raw, facts.machine_id_transient))


def _shown(raw: str, transient: bool) -> str:
    return f"{raw} (made anew at this boot)" if transient else repr(raw) if raw else "empty"


def _why(raw: str, transient: bool) -> str:
    if transient:
        return ("/etc/machine-id is a new id at every boot (mounted over a file that is empty or 'uninitialized' and "
                "could not be written, or on a tmpfs root): journald files each boot under another id (journalctl "
                "shows earlier boots only with --merge), and hosttune tells this host's status files and Xid ledger "
                "from a cloned disk's by its GPUs alone")
    return (f"/etc/machine-id is {_shown(raw, transient)}, not a machine-id: systemd makes one at the next boot, a new "
            "one at every boot where it cannot write the file")


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
    Check("sys.machine_id", "machine-id kept across boots", Severity.INFO,
          "The machine-id names a machine for journald and for hosttune's monitor status files and Xid ledger, which "
          "tell a disk cloned from another host by it; one made anew at every boot names nothing.",
          "systemd-machine-id-setup --commit writes this boot's id to /etc/machine-id (on a "
          "read-only root, give the image a writable /etc/machine-id); a clone is given its own by emptying the file "
          "before its first boot", False, machine_id,
          "an image (systemd gives it its id at its first boot), and a host without systemd and without the file"),
)
