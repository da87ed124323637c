"""A host's plan: the steps `apply` will take, after dropping what already holds.

Planning = probe (facts) → checks (findings) → actions (steps) → current state (one
read-only round trip) → resolve: operations that already hold are dropped, packages are
resolved to exact versions, files get unified diffs. A dry run prints this plan; a real
run hands it to `hosttune.execute`. Both are the same code up to here.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field, replace

from hosttune.actions import steps_for
from hosttune.actions.base import Op, Step
from hosttune.actions.monitor import not_in_image
from hosttune.actions.platform import select
from hosttune.checks import run_checks
from hosttune.errors import HosttuneError, TransportError
from hosttune.probes.facts import Facts
from hosttune.checks.findings import Finding, Status
from hosttune.config.inventory import Host
from hosttune.plan import preconditions
from hosttune.plan.resolve import Blocked, resolve_step
from hosttune.plan.state import FileState, State, read_state, requests_for
from hosttune.probes.gather import gather
from hosttune.probes.needs import HostNeeds, read_needs
from hosttune.config.profile import Profile
from hosttune.transport import open_transport
from hosttune.transport.base import Transport

@dataclass(frozen=True)
class PlanOptions:
    root: str | None = None  # --root: files under this directory, no live kernel writes
    opt_ins: frozenset[str] = frozenset()  # e.g. {"prune-cuda"}

    @property
    def is_offline(self) -> bool:
        return bool(self.root) and self.root != "/"

    @property
    def statuses(self) -> tuple[Status, ...]:
        """Findings that get steps: drifting ones; for an image every managed setting."""
        return (Status.DRIFT, Status.PENDING_REBOOT, Status.OK) if self.is_offline else (Status.DRIFT,)


@dataclass(frozen=True)
class HostPlan:
    host: Host
    profile: str
    reachable: bool = True
    error: str | None = None
    findings: tuple[Finding, ...] = ()
    steps: tuple[Step, ...] = ()  # what apply does, in order
    blocked: tuple[Step, ...] = ()  # drift hosttune cannot fix itself, with the reason
    left_out: tuple[Step, ...] = ()  # opt-in steps whose flag was not given
    pending_reboot: tuple[str, ...] = ()  # checks whose configuration is right already
    diffs: dict[str, str] = field(default_factory=dict, hash=False)
    state: State = field(default_factory=State, hash=False)
    root: str | None = None
    preconditions: tuple[str, ...] = ()  # what was checked on the host before anything is sent, and how it holds
    not_done: tuple[str, ...] = ()  # what the profile asks that this run leaves to another (an image: the monitor)

    @property
    def is_image(self) -> bool:
        return bool(self.root) and self.root != "/"

    @property
    def needs_reboot(self) -> bool:
        """An image (--root) runs no kernel to reboot: its first boot takes every change."""
        return not self.is_image and (bool(self.pending_reboot) or any(s.needs_reboot for s in self.steps))


# -- the plan of one host -----------------------------------------------------------------


def unified_diff(path: str, before: bytes | None, after: bytes) -> str:
    old = (before or b"").decode("utf-8", "replace").splitlines(keepends=True)
    new = after.decode("utf-8", "replace").splitlines(keepends=True)
    lines = difflib.unified_diff(old, new, "/dev/null" if before is None else path, path)
    return "".join(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n" for line in lines)


def _diffs(steps: list[Step], state: State) -> dict[str, str]:
    diffs = {}
    for step in steps:
        for op in step.writes:
            fs = state.files.get(op.path) or FileState(op.path, "absent")
            diffs[op.path] = unified_diff(op.path, fs.content if fs.kind == "file" else None, op.content)
    return diffs


def build_plan(host: Host, profile: Profile, facts: Facts, findings: list[Finding], state: State,
               options: PlanOptions, steps: list[Step] | None = None) -> HostPlan:
    """Pure: facts, findings and the current state → the plan. Tests call this with recorded data."""
    steps = steps_for(findings, facts, profile, host, options.statuses) if steps is None else steps
    kept, blocked, left_out, held = [], [s for s in steps if s.blocked], [], []
    for step in steps:
        if step.blocked:
            continue
        if step.opt_in and step.opt_in not in options.opt_ins:
            left_out.append(step)
            continue
        try:
            resolved = resolve_step(step, state, options.is_offline)
        except Blocked as exc:
            blocked.append(replace(step, ops=(), blocked=str(exc)))
            continue
        if resolved is not None:
            kept.append(resolved)
        else:
            held.append(step)
    blocked += _left_drifting(held, findings, kept + blocked + left_out)
    pending = () if options.is_offline else tuple(f.check_id for f in findings if f.status is Status.PENDING_REBOOT)
    return HostPlan(host, profile.name, True, _not_root(facts, kept, options), tuple(findings), tuple(kept), tuple(blocked),
                    tuple(left_out), pending, _diffs(kept, state), state, options.root,
                    not_done=tuple(n for n in (not_in_image(facts, profile),) if n))


def _not_root(facts: Facts, steps: list[Step], options: PlanOptions) -> str | None:
    """Every change apply makes to a running system is root's: a login that is not root is refused in the plan."""
    if steps and not options.is_offline and facts.is_root is False:
        return ("nothing sent: apply changes the host as root, and this login is not root: connect as root, "
                "or set ssh.become: true (passwordless sudo)")
    return None


def _left_drifting(held: list[Step], findings: list[Finding], handled: list[Step]) -> list[Step]:
    """Steps with nothing left to do (every operation holds, or is a live write an image skips) whose check still
    drifts: apply cannot fix it, and the plan says so with the step's notes, never leaves it out."""
    drifting = {f.check_id: f.detail for f in findings if f.status is Status.DRIFT}
    covered = {c for s in handled for c in s.fixes}
    out = []
    for step in held:
        fixes = tuple(c for c in step.fixes if c in drifting and c not in covered)
        if fixes:
            covered |= set(fixes)
            out.append(replace(step, fixes=fixes, ops=(), notes=(), blocked=_why_left(step, [drifting[c] for c in fixes])))
    return out


def _why_left(step: Step, details: list[str]) -> str:
    """The step's notes, or the check's own reason: under --root no `hosttune check` can be asked for it."""
    if step.notes:
        return "; ".join(step.notes)
    reasons = "; ".join(dict.fromkeys(d for d in details if d))
    return f"what it would change holds already, yet the check still drifts: {reasons or 'run hosttune check for why'}"


def with_needs(plan: HostPlan, needs: HostNeeds, flavour=None) -> HostPlan:
    """Pure: the plan with its preconditions checked; an unmet one is the host's plan-time error."""
    offline = bool(plan.root) and plan.root != "/"
    checked = preconditions.check((s.ops for s in plan.steps), needs, flavour, offline)
    steps = tuple(replace(s, ops=ops, notes=s.notes + notes)
                  for s, ops, notes in zip(plan.steps, checked.groups, checked.notes) if ops)
    lines, errors = checked.lines, checked.errors
    if steps:
        answer = preconditions.journal(needs)
        lines += (f"{answer.verdict}: {answer.text}",)
        errors += (answer.text,) if answer.verdict is preconditions.Verdict.FAILS else ()
    error = f"nothing sent: {'; '.join(errors)}" if errors else plan.error
    return replace(plan, steps=steps, error=error, preconditions=lines)


JOURNAL_REQUESTS = [("dir", preconditions.RUNS_DIR)]


def journal_requests(plan: HostPlan) -> list[tuple[str, str]]:
    """A plan with steps is run with a journal: where it goes is asked with the operations' needs."""
    return list(JOURNAL_REQUESTS) if plan.steps else []


def journal_error(transport: Transport, writes: tuple[Op, ...] = ()) -> str | None:
    """Where a run's journal goes and where its `writes` go, asked alone (remediate, uncordon: their steps are made
    as they climb): the plan's one-line error when a run could not make their folders, else None."""
    groups = [writes]
    asks = list(dict.fromkeys(JOURNAL_REQUESTS + preconditions.requests_for(groups, None, False)))
    facts = read_needs(transport, asks, root=None, manager=None)
    failed = [a for a in (preconditions.journal(facts), *preconditions.blocked_writes(groups, facts, False))
              if a.verdict is preconditions.Verdict.FAILS]
    return f"nothing sent: {failed[0].text}" if failed else None  # the first: a file above both is named once


def plan_host(host: Host, profile: Profile, options: PlanOptions) -> HostPlan:
    """Probe the host, check it, and plan; never changes it. Unreachable hosts get a plan saying so."""
    try:
        with open_transport(host.connection, read_only=True) as transport:
            facts = gather(transport, timeout=host.probe_timeout_s, root=options.root if options.is_offline else None).facts
            findings = run_checks(facts, profile)
            steps = steps_for(findings, facts, profile, host, options.statuses)
            wanted = [s for s in steps if not s.blocked and (not s.opt_in or s.opt_in in options.opt_ins)]
            manager = select(facts).packages
            state = read_state(transport, requests_for(wanted, options.root), root=options.root,
                               manager=manager.name if manager else None)
            plan = build_plan(host, profile, facts, findings, state, options, steps)
            asks = preconditions.requests_for((s.ops for s in plan.steps), manager, options.is_offline)
            asks = list(dict.fromkeys(asks + journal_requests(plan)))
            needs = read_needs(transport, asks, root=options.root, manager=manager.name if manager else None)
    except TransportError as exc:  # the plan names its root all the same: it is not one for the running system
        return HostPlan(host, profile.name, reachable=False, error=str(exc), root=options.root)
    except HosttuneError as exc:
        return HostPlan(host, profile.name, error=str(exc), root=options.root)
    return with_needs(plan, needs, manager)
