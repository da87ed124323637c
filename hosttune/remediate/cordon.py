"""Taking a cordoned host back (`hosttune uncordon`): the cordon file removed, its replicas started and back
in its front, through the executor with a journal (rollback cordons it again)."""

from __future__ import annotations

from dataclasses import dataclass

from hosttune.actions import remediate as ops
from hosttune.actions.base import Step
from hosttune.errors import HosttuneError
from hosttune.fleet_runner import EXIT_ERROR, EXIT_UNREACHABLE
from hosttune.remediate.climb import execute_step
from hosttune.remediate.survey import Survey


@dataclass(frozen=True)
class Uncordon:
    survey: Survey
    done: bool = False
    run: str | None = None
    error: str | None = None

    @property
    def exit_bits(self) -> int:
        if not self.survey.reachable:
            return EXIT_UNREACHABLE
        return EXIT_ERROR if self.error or self.survey.error else 0


def uncordon_step(survey: Survey, wait_s: int = 600) -> Step | None:
    """None when the host is not cordoned."""
    if survey.snapshot.cordon is None:
        return None
    replicas = tuple((r.index, r.unit, r.port) for r in survey.snapshot.replicas)
    body = ops.uncordon_ops(survey.snapshot.lb_script, replicas, wait_s, survey.snapshot.services)
    return Step(("remediate.cordon",), "uncordon the host", tuple(body))


def uncordon_host(survey: Survey, run: str) -> Uncordon:
    step = uncordon_step(survey)
    if step is None or not survey.reachable or survey.error:
        return Uncordon(survey)
    try:
        ok, error = execute_step(survey, step, run, "uncordon")
    except HosttuneError as exc:  # lost or refused: this host's result, and the others are still taken back
        return Uncordon(survey, False, run, str(exc))
    return Uncordon(survey, ok, run, error or None)
