"""Preconditions: what a plan's operations need, checked against the host before anything is sent.

Every operation declares its needs (`Op.needs`). Walking the plan in order, each need is
- met by an earlier operation of the plan (`Op.provides`: a write makes its directories),
- met by the host as it is (facts read by `hosttune.probes.needs`, one read-only round trip),
- met by an operation the planner adds: a missing parent directory is made first, a Python
  without ensurepip gets the distribution's venv package where a package manager has it,
- left to the image itself under --root (update-grub that the image lacks: its drop-in is
  written, the image's own update-grub reads it when it runs), or
- a plan-time error: one line, and nothing is sent to that host.

Pure: `requests_for` says what to ask the host, `check` judges the answers. Tests are data.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Iterable

from hosttune.actions.base import Command, Directory, KernelWrite, Op, describe
from hosttune.actions.needs import (Need, NeedCommand, NeedDir, NeedModel, NeedPort, NeedSpace, NeedVenv, describe_need,
                                    size_text)
from hosttune.actions.platform import PackageFlavour
from hosttune.probes.needs import HostNeeds
from hosttune.quoting import join

Group = tuple[Op, ...]

RUNS_DIR = "/var/lib/hosttune/runs"  # a run's journal and backups (`hosttune.execute.journal`), made before its first step


class Verdict(str, Enum):
    HOLDS = "holds"
    ADDED = "added"  # an operation the planner adds meets it
    DEFERRED = "deferred"  # --root: the image's own tools do it when they run
    FAILS = "fails"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class Answer:
    verdict: Verdict
    text: str  # one line: how it holds, what was added, or what is wrong and what to do
    ops: tuple[Op, ...] = ()  # added operations
    first: bool = False  # added at the very start of the plan (package installs), else just before the operation


@dataclass(frozen=True)
class Checked:
    """The plan's operations as they will run, and what the check found."""

    groups: tuple[Group, ...]
    notes: tuple[tuple[str, ...], ...]  # per group: what was left to the image itself, and why
    lines: tuple[str, ...]  # one per need: what was checked and how it holds
    errors: tuple[str, ...]

    @property
    def error(self) -> str | None:
        return "; ".join(self.errors) or None


def _runs(op: Op, offline: bool) -> bool:
    """Operations --root leaves out (live kernel writes, running-system commands) need nothing."""
    return not (offline and (isinstance(op, KernelWrite) or (isinstance(op, Command) and not op.offline)))


def _needs(groups: Iterable[Group], offline: bool) -> list[Need]:
    return list(dict.fromkeys(n for g in groups for op in g if _runs(op, offline) for n in op.needs))


def requests_for(groups: Iterable[Group], flavour: PackageFlavour | None, offline: bool) -> list[tuple[str, str]]:
    """What to ask the host (`hosttune.probes.needs`) about these operations' needs."""
    out: list[tuple[str, str]] = []
    for need in _needs(groups, offline):
        if isinstance(need, NeedCommand):
            out.append(("cmd" if offline and not need.on_machine else "mcmd", need.name))
        elif isinstance(need, NeedVenv):
            out.append(("venv", need.python))
            if flavour is not None:
                out.append(("pkg", flavour.venv_package(need.python)))
        elif isinstance(need, NeedDir):
            out.append(("dir", need.path))
        elif isinstance(need, NeedSpace):
            out.append(("space", need.path))
        elif isinstance(need, NeedPort):
            out.append(("port", str(need.port)))
    return list(dict.fromkeys(out))


# -- judging one need ------------------------------------------------------------------------


def _first_line(text: str, width: int = 100) -> str:
    """A description on one line (a `sh -c` script's first line), cut at `width`."""
    line = text.splitlines()[0] if text else ""
    return line if len(line) <= width and line == text else line[:width].rstrip() + " …"


def _program(need: NeedCommand, op: Op, facts: HostNeeds, offline: bool) -> Answer:
    found = (facts.commands if offline and not need.on_machine else facts.machine_commands).get(need.name)
    if found:
        return Answer(Verdict.HOLDS, f"{need.name}: {found}")
    if offline and isinstance(op, Command) and op.regenerate:
        return Answer(Verdict.DEFERRED, f"--root: the image has no {need.name}, so `{join(op.argv)}` is not run here; "
                                        f"the files it reads are written, and the image's own {need.name} reads them when it runs")
    where = "in the image (--root)" if offline and not need.on_machine else "on the host"
    return Answer(Verdict.FAILS, f"{need.name} not found {where}, needed for: {_first_line(describe(op))}")


def _venv(need: NeedVenv, facts: HostNeeds, flavour: PackageFlavour | None, offline: bool) -> Answer:
    why = facts.venvs.get(need.python, "not checked")
    where = "the image" if offline else "the host"  # --root: the image's python and package lists (needs.sh)
    if not why:
        return Answer(Verdict.HOLDS, describe_need(need))
    if flavour is None:
        return Answer(Verdict.FAILS, f"{need.python} cannot make a virtualenv ({why}) and {where} has no apt or dnf: "
                                     f"install its venv module (ensurepip) by hand")
    package = flavour.venv_package(need.python)
    if not facts.candidates.get(package):
        return Answer(Verdict.FAILS, f"{need.python} cannot make a virtualenv ({why}) and {package} is not in {where}'s "
                                     f"package lists: install {package} (or refresh the lists)")
    install = Command(flavour.install(((package, None),)), meets=(need,))
    return Answer(Verdict.ADDED, f"install {package}: {need.python} cannot make a virtualenv ({why})",
                  (Command(flavour.refresh()), install), first=True)


def _in_the_way(path: str) -> Answer:
    return Answer(Verdict.FAILS, f"{path} is not a directory; move it away first")


def _dir(need: NeedDir, facts: HostNeeds) -> Answer:
    kind = facts.dirs.get(need.path, "absent")
    if kind == "dir":
        return Answer(Verdict.HOLDS, describe_need(need))
    if kind == "other":
        return _in_the_way(need.path)
    if blocked := facts.blocked.get(need.path):  # mkdir -p cannot make it through a file
        return _in_the_way(blocked)
    return Answer(Verdict.ADDED, f"make directory {need.path} (missing)", (Directory(need.path),))


def _port(need: NeedPort, facts: HostNeeds) -> Answer:
    listeners = facts.ports.get(need.port)
    if listeners is None:
        return Answer(Verdict.HOLDS, f"port {need.port}: not checked (the host has no ss)")
    strangers = sorted({u for u in listeners if not any(u == o or (o.endswith("@") and u.startswith(o)) for o in need.owners)})
    if not listeners:
        return Answer(Verdict.HOLDS, f"port {need.port} free")
    if not strangers:
        return Answer(Verdict.HOLDS, f"port {need.port} held by {', '.join(sorted(set(listeners)))} (this deployment's)")
    who = ", ".join("a process hosttune cannot name" if u == "?" else u for u in strangers)
    return Answer(Verdict.FAILS, f"port {need.port} is in use by {who}; choose another port or stop it")


def _model(need: NeedModel, facts: HostNeeds) -> Answer:
    why = facts.models.get(need.path, "was not read")
    if not why:
        return Answer(Verdict.HOLDS, describe_need(need))
    return Answer(Verdict.FAILS, f"the model folder {need.path} {why}")


def judge(need: Need, op: Op, facts: HostNeeds, flavour: PackageFlavour | None, offline: bool) -> Answer:
    """One need of one operation, against the host's answers."""
    if isinstance(need, NeedCommand):
        return _program(need, op, facts, offline)
    if isinstance(need, NeedVenv):
        return _venv(need, facts, flavour, offline)
    if isinstance(need, NeedDir):
        return _dir(need, facts)
    if isinstance(need, NeedPort):
        return _port(need, facts)
    assert isinstance(need, NeedModel), f"judged elsewhere: {need!r}"
    return _model(need, facts)


def _space(groups: Iterable[Group], facts: HostNeeds, offline: bool) -> list[Answer]:
    """Free space, summed per filesystem over every write of the plan."""
    wanted: dict[str, NeedSpace] = {}
    for need in _needs(groups, offline):
        if isinstance(need, NeedSpace) and need.num_bytes >= getattr(wanted.get(need.path), "num_bytes", 0):
            wanted[need.path] = need
    per_mount: dict[str, tuple[int, int, list[str], list[str]]] = {}
    for path, need in wanted.items():
        if path not in facts.space:
            continue
        free, mount = facts.space[path]
        total, _, paths, notes = per_mount.get(mount, (0, free, [], []))
        per_mount[mount] = (total + need.num_bytes, free, paths + [path], notes + [need.note] * bool(need.note))
    answers = []
    for mount, (total, free, paths, notes) in per_mount.items():
        text = f"{size_text(total)} to write on {mount} ({size_text(free)} free)"
        why = "".join(f"; {n}" for n in notes)
        answers.append(Answer(Verdict.HOLDS, text + why) if total <= free else
                       Answer(Verdict.FAILS, f"{text}: not enough for {paths[0]}"
                                             f"{f' and {len(paths) - 1} more' if len(paths) > 1 else ''}; free space there "
                                             f"first{why}"))
    return answers


def blocked_writes(groups: Iterable[Group], facts: HostNeeds, offline: bool) -> list[Answer]:
    """A write makes its directories, except through a file where one of them must be."""
    paths = dict.fromkeys(n.path for n in _needs(groups, offline) if isinstance(n, NeedSpace))
    return [_in_the_way(blocked) for blocked in dict.fromkeys(facts.blocked[p] for p in paths if p in facts.blocked)]


def journal(facts: HostNeeds) -> Answer:
    """A run makes its journal's folder before its first step: `mkdir -p` cannot make it through a file."""
    kind = facts.dirs.get(RUNS_DIR, "absent")
    blocker = RUNS_DIR if kind == "other" else facts.blocked.get(RUNS_DIR)
    if blocker:
        return Answer(Verdict.FAILS, f"{blocker} is not a directory, and the run's journal goes in {RUNS_DIR}; "
                                     f"move it away first")
    return Answer(Verdict.HOLDS, f"the run's journal in {RUNS_DIR}{'' if kind == 'dir' else ' (made by the run)'}")


# -- the whole plan ----------------------------------------------------------------------------


class _Walk:
    """One walk over a plan: what is met so far, what the plan gets at its start, what was found."""

    def __init__(self, facts: HostNeeds, flavour: PackageFlavour | None, offline: bool):
        self.facts, self.flavour, self.offline = facts, flavour, offline
        self.met: set[Need] = set()
        self.first: list[Op] = []
        self.lines: dict[str, None] = {}
        self.errors: dict[str, None] = {}

    def record(self, answer: Answer) -> None:
        self.lines[f"{answer.verdict}: {answer.text}"] = None
        if answer.verdict is Verdict.FAILS:
            self.errors[answer.text] = None

    def step(self, op: Op, ops: list[Op], notes: list[str]) -> None:
        """`op` onto ops after what the planner adds for it; left to the image, its reason onto notes."""
        keep = True
        for need in op.needs if _runs(op, self.offline) else ():
            if need in self.met or isinstance(need, NeedSpace):
                continue
            answer = judge(need, op, self.facts, self.flavour, self.offline)
            self.record(answer)
            self.met.add(need)
            if answer.verdict is Verdict.DEFERRED:
                keep = False
                notes.append(answer.text)
            elif answer.verdict is Verdict.ADDED:
                (self.first if answer.first else ops).extend(answer.ops)
                self.met.update(n for added in answer.ops for n in added.provides)
        if keep:
            ops.append(op)
            self.met.update(op.provides)


def check(groups: Iterable[Group], facts: HostNeeds, flavour: PackageFlavour | None = None,
          offline: bool = False) -> Checked:
    """Walk the operations in order; each need is met by an earlier one, the host, an added one, or is an error."""
    groups = tuple(tuple(g) for g in groups)
    walk = _Walk(facts, flavour, offline)
    out: list[Group] = []
    notes: list[tuple[str, ...]] = []
    for group in groups:
        ops: list[Op] = []
        group_notes: list[str] = []
        for op in group:
            walk.step(op, ops, group_notes)
        out.append(tuple(ops))
        notes.append(tuple(group_notes))
    for answer in _space(groups, facts, offline) + blocked_writes(groups, facts, offline):
        walk.record(answer)
    if walk.first and out:
        out[0] = tuple(walk.first) + out[0]
    return Checked(tuple(out), tuple(notes), tuple(walk.lines), tuple(walk.errors))
