"""The pinned CUDA toolkit: installed, /usr/local/cuda pointing at it, first on every login PATH."""

from __future__ import annotations

import re

from hosttune.actions.base import FileWrite, Remove, Step, Symlink
from hosttune.actions.platform import select
from hosttune.rendering import render
from hosttune.probes.facts import Facts
from hosttune.config.inventory import Host
from hosttune.config.profile import Profile

PROFILE_D = "/etc/profile.d/hosttune-cuda.sh"
CUDA_LINK = "/usr/local/cuda"


def toolkit_dir(pin: str) -> str:
    return f"/usr/local/cuda-{pin}"


def stale_toolkits(facts: Facts, pin: str) -> tuple[str, ...]:
    """/usr/local/cuda-X.Y directories of another X.Y that nothing points at (cuda-13 style alternatives links are not toolkits).

    Never the pinned toolkit, never the one /usr/local/cuda resolves to (builds may use it
    until the link moves), and never the only toolkit on the host.
    """
    toolkits = [p for p in facts.cuda.toolkits if re.fullmatch(r"/usr/local/cuda-(\d+\.\d+)", p)]
    if len(toolkits) < 2:
        return ()
    keep = {toolkit_dir(pin), facts.cuda.symlink_target}
    return tuple(p for p in toolkits if p not in keep)


def _where(facts: Facts) -> str:
    return "the image" if facts.image else "this host"


def cuda_toolkit(facts: Facts, profile: Profile, host: Host) -> list[Step]:
    """Toolkit package if missing, the /usr/local/cuda link, /etc/profile.d/hosttune-cuda.sh; stale toolkits reported."""
    pin = profile.cuda.toolkit
    platform = select(facts)
    ops: tuple = ()
    notes: list[str] = []
    main = None
    if toolkit_dir(pin) not in facts.cuda.toolkits:
        if platform.packages is None and facts.cuda.symlink_target in facts.cuda.toolkits:
            # /usr/local/cuda works now: pointed at a toolkit nobody can install, every build through it would break
            main = Step(("cuda.toolkit",), f"CUDA {pin} at /usr/local/cuda and first on PATH",
                        blocked=f"{toolkit_dir(pin)} is missing and {_where(facts)} has no apt or dnf: install CUDA {pin} by "
                                f"hand (/usr/local/cuda keeps pointing at {facts.cuda.symlink_target})")
        elif platform.packages is None:
            notes.append(f"{toolkit_dir(pin)} is missing and {_where(facts)} has no apt or dnf: install CUDA {pin} by hand")
        else:
            names = profile.cuda.packages or platform.packages.cuda_packages(pin)
            ops += (platform.packages_op(names, hold=profile.driver.held),)
    ops += (Symlink(CUDA_LINK, toolkit_dir(pin)), FileWrite(PROFILE_D, render("hosttune-cuda.sh.j2", version=pin), 0o644))
    stale = stale_toolkits(facts, pin)
    steps = [main or Step(("cuda.toolkit",), f"CUDA {pin} at /usr/local/cuda and first on PATH", ops, notes=tuple(notes))]
    if stale:
        steps.append(Step(("cuda.toolkit",), f"stale toolkits moved aside: {', '.join(stale)}",
                          tuple(Remove(p) for p in stale), opt_in="prune-cuda",
                          notes=("kept in the run's backup folder until you delete it; rollback puts them back",)))
    return steps
