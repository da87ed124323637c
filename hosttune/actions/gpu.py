"""GPU settings: persistence through nvidia-persistenced, ECC and MIG modes."""

from __future__ import annotations

from hosttune.actions.base import Command, Service, Step, blocked
from hosttune.checks.base import is_systemd, not_systemd
from hosttune.probes.facts import Facts
from hosttune.config.inventory import Host
from hosttune.config.profile import Profile


def persistence(facts: Facts, profile: Profile, host: Host) -> list[Step]:
    """systemctl enable --now nvidia-persistenced (the daemon owns persistence mode; nvidia-smi -pm is deprecated)."""
    daemon = facts.services.get("nvidia-persistenced")
    if not is_systemd(facts):
        return [blocked("gpu.persistence", f"{not_systemd(facts)}: run nvidia-persistenced from the host's init system")]
    if daemon is None or daemon.enabled in (None, "not-found"):
        return [blocked("gpu.persistence", "nvidia-persistenced is not installed (it ships with the NVIDIA driver packages)")]
    if daemon.enabled == "masked":
        return [blocked("gpu.persistence", "nvidia-persistenced is masked; unmask it if that was not deliberate")]
    return [Step(("gpu.persistence",), "nvidia-persistenced enabled and running",
                 (Service("nvidia-persistenced.service", enabled=True, running=True),))]


def _mode_step(check_id: str, flag: str, want: bool, indices: list[int], what: str) -> Step:
    value, old = ("1", "0") if want else ("0", "1")
    ops = tuple(Command(("nvidia-smi", "-i", str(i), flag, value), undo=("nvidia-smi", "-i", str(i), flag, old), offline=False)
                for i in indices)
    return Step((check_id,), f"{what} {'on' if want else 'off'} on GPU {', '.join(map(str, indices))} (takes effect after a GPU reset or reboot)",
                ops, needs_reboot=True)


def ecc(facts: Facts, profile: Profile, host: Host) -> list[Step]:
    """nvidia-smi -e on each GPU whose ECC mode differs; pending retirements need a drained GPU reset instead."""
    want = profile.gpu.ecc
    if any(g.retirement_pending for g in facts.gpu.gpus):
        return [blocked("gpu.ecc", "page retirement / row remap pending: drain the GPU and reset it (nvidia-smi -r) or reboot")]
    wrong = [g.index for g in facts.gpu.gpus if g.ecc_enabled is not None and g.ecc_enabled != want and not g.ecc_pending]
    return [_mode_step("gpu.ecc", "-e", want, wrong, "ECC")] if wrong else []


def mig(facts: Facts, profile: Profile, host: Host) -> list[Step]:
    """nvidia-smi -mig on each GPU whose MIG mode differs."""
    want = profile.gpu.mig
    wrong = [g.index for g in facts.gpu.gpus if g.mig_enabled is not None and g.mig_enabled != want and not g.mig_pending]
    return [_mode_step("gpu.mig", "-mig", want, wrong, "MIG")] if wrong else []
