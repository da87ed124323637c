"""Checks on the service hosttune deployed: its units running, its ports generating, its front's upstreams up."""

from __future__ import annotations

from hosttune.checks.base import Check, is_systemd, na, none_found
from hosttune.checks.findings import Severity, Status, Verdict
from hosttune.config.profile import Profile
from hosttune.probes.facts import Facts
from hosttune.probes.facts_serve import EndpointHealth, ServeFacts, UnitHealth

JOURNAL_SHOWN = 5  # lines of each stopped unit's journal in the finding's detail
KEY_UNREADABLE = "error: key unreadable"  # what the serve probe says when it cannot read the API key file


def _deployed(facts: Facts) -> ServeFacts | Verdict:
    serve = facts.serve
    if serve is None or not (serve.release or serve.fronts):
        return none_found(facts, "a deployed engine's state", "no engine or nginx front deployed by hosttune on this host")
    return serve


def _stopped(unit: UnitHealth) -> str:
    lines = " | ".join(line.strip() for line in unit.journal[-JOURNAL_SHOWN:]) or "no journal lines"
    return f"{unit.name} is {unit.state}; journal: {lines}"


def units(facts: Facts, profile: Profile) -> Verdict:
    """Every unit of the deployment runs: the engine service or each replica, nginx, the replica probe's timer."""
    serve = _deployed(facts)
    if isinstance(serve, Verdict):
        return serve
    if not is_systemd(facts):
        return na("systemd is not PID 1: no units to read")
    active = ", ".join(f"{u.name} {u.state}" for u in serve.units) or "none"
    stopped = [u for u in serve.units if not u.is_running]
    if not serve.units:
        return Verdict(Status.ERROR, "all active", None, active, "the deployment's units could not be read (systemctl show)")
    if stopped:
        return Verdict(Status.DRIFT, "all active", None, active, "; ".join(_stopped(u) for u in stopped),
                       subjects=tuple(u.name for u in stopped))
    return Verdict(Status.OK, "all active", None, active)


def _answer(e: EndpointHealth) -> str:
    if e.health != "200":
        return f"{e.role} port {e.port}: /health {e.health}"
    if e.generation != "ok":
        return f"{e.role} port {e.port}: {e.generation}"
    return f"{e.role} port {e.port}: one token in {e.seconds:.2f}s"


def health(facts: Facts, profile: Profile) -> Verdict:
    """Every engine port answers /health with 200 and generates one token within the gate's timeout."""
    serve = _deployed(facts)
    if isinstance(serve, Verdict):
        return serve
    if not serve.endpoints:
        return na("no engine port recorded by the live release")
    desired = f"/health 200, one token within {serve.endpoints[0].timeout_s:g}s"
    if any(e.health.startswith(KEY_UNREADABLE) for e in serve.endpoints):
        return Verdict(Status.ERROR, desired, None, None, "the engine's API key file cannot be read: check as root "
                       "(ssh.become) to send a keyed request")
    failing = [e for e in serve.endpoints if not e.is_serving]
    active = "; ".join(_answer(e) for e in serve.endpoints)
    if failing:
        return Verdict(Status.DRIFT, desired, None, active, "not serving: " + "; ".join(_answer(e) for e in failing),
                       subjects=tuple(e.role for e in failing))
    return Verdict(Status.OK, desired, None, active)


def front(facts: Facts, profile: Profile) -> Verdict:
    """The host nginx front answers /health on every port, with every upstream server in and accepting connections."""
    serve = _deployed(facts)
    if isinstance(serve, Verdict):
        return serve
    if not serve.fronts:
        return na("no nginx front deployed by hosttune on this host")
    problems = [f"port {f.port} ({f.scheme}): /health {f.health}" for f in serve.fronts if f.health != "200"]
    problems += [f"upstream {u.server} " + ("marked down" if u.down else "refuses connections")
                 for u in serve.upstreams if u.down or not u.reachable]
    in_service = sum(1 for u in serve.upstreams if not u.down and u.reachable)
    active = f"{len(serve.fronts)} port(s), {in_service}/{len(serve.upstreams)} upstream servers in service"
    if problems:
        return Verdict(Status.DRIFT, "all upstreams in service", None, active, "; ".join(problems),
                       subjects=tuple(u.server for u in serve.upstreams if u.down or not u.reachable))
    return Verdict(Status.OK, "all upstreams in service", None, active)


CHECKS = (
    Check("serve.units", "Deployed units running", Severity.CRITICAL,
          "A stopped or crash-looping engine unit serves nothing, and a stopped probe timer stops taking failing "
          "replicas out of the front.",
          "none by apply: the finding names each unit with its state and the journal's last lines; restart it "
          "(systemctl restart UNIT) or deploy again", False, units),
    Check("serve.health", "Engine ports generate", Severity.CRITICAL,
          "A process that runs but fails /health or cannot generate one token within the gate's timeout answers "
          "users with errors or timeouts.",
          "none by apply: read the unit's journal; deploy again or restart the replica", False, health),
    Check("serve.front", "Host front over all replicas", Severity.WARNING,
          "An nginx front with replicas marked down or refusing connections serves on part of the host's GPUs, "
          "or not at all.",
          "none by apply: the replica probe puts a recovered replica back; check serve.units and serve.health for why "
          "one is out", False, front),
)
