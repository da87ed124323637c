"""One rung of one fault as a step of operations, or None where the rung has nothing to act on
(no replica on the GPU, no GPU to reset, a reboot not allowed). Pure: tests are data."""

from __future__ import annotations

import json
from dataclasses import dataclass

from hosttune.actions import remediate as ops
from hosttune.actions.base import Step
from hosttune.config.inventory import Host
from hosttune.execute.reboot import cannot_reboot
from hosttune.remediate.faults import Fault
from hosttune.remediate.rungs import Rung
from hosttune.remediate.state import HostSnapshot, Replica


@dataclass(frozen=True)
class LadderOptions:
    drain_wait_s: int = 60  # for in-flight requests of a drained replica
    restore_wait_s: int = 600  # for a restored replica to answer /health before it goes back into the front
    reboot: bool = False  # the reboot rung is climbed only with --reboot
    reboot_timeout_s: float = 600.0
    recheck_wait_s: float = 5.0  # after a restart, for the unit to settle before the re-check


def reboot_skipped(host: Host, options: LadderOptions) -> str | None:
    """Why the reboot rung is passed over on this host (the ladder goes on), or None: it reboots and waits."""
    if not options.reboot:
        return "--reboot not given"
    return cannot_reboot(host)


def replicas_of(fault: Fault, snapshot: HostSnapshot) -> tuple[Replica, ...]:
    """The replicas the fault takes out: those on its GPU, or the failing replica itself."""
    if fault.gpu is not None:
        return snapshot.replicas_on(fault.gpu)
    return tuple(r for r in snapshot.replicas if r.unit == fault.unit)


def gpus_of(fault: Fault, snapshot: HostSnapshot) -> tuple[int, ...]:
    if fault.gpu is not None:
        return (fault.gpu,)
    return tuple(sorted({g for r in replicas_of(fault, snapshot) for g in r.gpus}))


def _drain(fault: Fault, snapshot: HostSnapshot, options: LadderOptions) -> Step | None:
    replicas = replicas_of(fault, snapshot)
    if replicas:
        body = [op for r in replicas for op in ops.drain_ops(snapshot.lb_script, r.index, r.unit, r.port, options.drain_wait_s)]
        return Step((fault.check_id,), f"drain {', '.join(r.unit for r in replicas)} off {fault.where}", tuple(body))
    single = snapshot.services
    if fault.gpu is not None and single:  # one service holds every GPU: no front to drain it from
        body = [op for u in single for op in ops.drain_ops(None, 0, u, 0, options.drain_wait_s)]
        return Step((fault.check_id,), f"stop {', '.join(single)} (no replica front to drain it from)", tuple(body))
    return None


def restore_step(fault: Fault, snapshot: HostSnapshot, options: LadderOptions = LadderOptions()) -> Step | None:
    """After a GPU rung fixed the fault: its drained replicas started and back in the front."""
    replicas = replicas_of(fault, snapshot)
    if not replicas:
        return None
    body = [op for r in replicas for op in ops.restore_ops(snapshot.lb_script, r.index, r.unit, r.port, options.restore_wait_s)]
    return Step((fault.check_id,), f"restore {', '.join(r.unit for r in replicas)}", tuple(body))


def cordon_record(fault: Fault, run: str, now: float) -> bytes:
    return (json.dumps({"at": now, "reason": fault.reason, "run": run}) + "\n").encode()


def step_for(rung: Rung, fault: Fault, snapshot: HostSnapshot, options: LadderOptions, run: str = "", now: float = 0.0) -> Step | None:
    """The operations of this rung for this fault; None: nothing to do at this rung (the ladder goes on)."""
    fixes = (fault.check_id,)
    if rung is Rung.RESTART and fault.unit:
        return Step(fixes, f"restart {fault.unit}", tuple(ops.restart_ops((fault.unit,))))
    if rung is Rung.DRAIN:
        return _drain(fault, snapshot, options)
    gpus = gpus_of(fault, snapshot)
    if rung is Rung.DIAGNOSE and gpus:
        return Step(fixes, f"diagnose GPU {', '.join(map(str, gpus))} (dcgmi diag -r 2)", tuple(op for g in gpus for op in ops.diagnose_ops(g)))
    if rung is Rung.RESET and gpus:
        return Step(fixes, f"reset GPU {', '.join(map(str, gpus))}", tuple(op for g in gpus for op in ops.reset_ops(g)))
    if rung is Rung.CORDON:
        indices = tuple(r.index for r in snapshot.replicas)
        body = ops.cordon_ops(cordon_record(fault, run, now), snapshot.lb_script, indices, snapshot.services)
        return Step(fixes, "cordon the host", tuple(body))
    return None
