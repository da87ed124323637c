"""Old releases taken off a host. Every deploy of new settings installs one more folder under
/opt/hosttune/releases; once a deploy has switched and its release serves, all but the newest
`keep` go (a whole virtualenv each, gigabytes with torch). The live release and the one
--rollback goes back to (the one live before it) are always among those kept. So do the wheel
sets under /opt/hosttune/wheels that no release kept names in its release.json (every build
uploaded stayed there otherwise); where a kept release's release.json names none, which it
needs is unknown and every set stays.

Operations as data, like plan.py: decided from the state read before the deploy, run after its gate.
"""

from __future__ import annotations

from typing import Callable

from hosttune.actions.base import Command, Op, describe
from hosttune.deploy.errors import DeployError
from hosttune.deploy.release import RELEASES, WHEELS, Release, release_name
from hosttune.deploy.state import HostState
from hosttune.execute.perform import OperationFailed, run_ops
from hosttune.transport.base import Transport

DEFAULT_KEEP = 5  # the live release, the one --rollback goes back to, and the three newest before them
MIN_KEEP = 2


def rollback_target(state: HostState, release: Release) -> str | None:
    """The release --rollback goes back to once `release` is live: the one live before it (or, when the deploy
    restarts the live release itself, the one `previous` names now)."""
    live = release_name(state.current)
    return live if live and live != release.id else release_name(state.previous)


def pruned(state: HostState, release: Release, keep: int) -> list[str]:
    """The release folders a deploy of `release` removes once it serves: all but the `keep` newest (by when their
    release.json was written), never the live one nor the one --rollback goes back to."""
    names = {release_name(d) for d in state.releases}
    back = rollback_target(state, release)
    pinned = {release.id} | ({back} & names)  # a rollback target whose folder is gone takes no place of the kept
    others = [d for d in state.releases if release_name(d) not in pinned | {back} and _is_release_folder(d)]
    others.sort(key=lambda d: (state.releases[d], d), reverse=True)  # newest first
    return sorted(others[max(keep - len(pinned), 0):])


def pruned_wheels(state: HostState, release: Release, keep: int) -> list[str]:
    """The wheel sets (folders under /opt/hosttune/wheels, named by a wheel's sha256[:16]) that neither `release` nor
    a release folder kept uses; none where a kept release's release.json names no wheel (what it needs is unknown).
    A folder without release.json is an install that did not finish: it is made again, with its wheels uploaded."""
    gone = set(pruned(state, release, keep))
    kept = [d for d in state.releases if d not in gone]
    if any(d in state.uses and not state.uses[d] for d in kept):
        return []
    needed = {w.sha256[:16] for w in release.wheels} | {s[:16] for d in kept for s in state.uses.get(d, ())}
    return [d for d in state.wheel_sets if _is_wheel_set(d) and d.rsplit("/", 1)[-1] not in needed]


def prune_ops(state: HostState, release: Release, keep: int) -> list[Op]:
    """The old release folders, then the wheel sets none of those kept uses."""
    return [Command(("rm", "-rf", "--", *paths), timeout=600.0)
            for paths in (pruned(state, release, keep), pruned_wheels(state, release, keep)) if paths]


def prune_lines(state: HostState, release: Release, keep: int) -> list[str]:
    """prune_ops as a plan shows them, labelled as run once the new release serves (never after a failed gate)."""
    return [f"[remove old releases] {describe(op)}" for op in prune_ops(state, release, keep)]


def prune(transport: Transport, before: HostState, release: Release, keep: int,
          on_op: Callable[[Op], None] | None = None) -> str:
    """Remove the folders past those kept, `release` serving; what went wrong, in words for the recap, or ""."""
    try:
        run_ops(transport, prune_ops(before, release, keep), on_op)
    except (DeployError, OperationFailed) as exc:  # the deploy stands: the folders stay, and the recap says so
        return f"old releases not removed: {exc}"
    return ""


def _is_release_folder(path: str) -> bool:
    """A folder right under /opt/hosttune/releases, as the state read lists them: nothing else is ever removed."""
    name = path.removeprefix(RELEASES + "/")
    return path.startswith(RELEASES + "/") and name not in ("", ".", "..") and "/" not in name


def _is_wheel_set(path: str) -> bool:
    """A folder right under /opt/hosttune/wheels named as deploy names one (16 hex digits): nothing else goes."""
    name = path.removeprefix(WHEELS + "/")
    return path.startswith(WHEELS + "/") and len(name) == 16 and all(c in "0123456789abcdef" for c in name)
