"""Checks on who may call the engine deployed on a host."""

from __future__ import annotations

from hosttune.checks.base import Check, none_found
from hosttune.probes.facts import EngineEndpoint, Facts
from hosttune.checks.findings import Severity, Status, Verdict
from hosttune.config.profile import Profile

DESIRED = "401 without a key, or loopback only"


def _describe(e: EngineEndpoint) -> str:
    port = f"{e.role} port {e.port} ({e.scheme})"
    if e.status == "closed":
        return f"{port}: not listening (serve.units says why)"
    answer = f"answers {e.status}" if e.status.isdigit() else f"no answer ({e.status})"
    return f"{port} on {','.join(e.listen)}: {answer} without a key"


def api_key(facts: Facts, profile: Profile) -> Verdict:
    """An engine (or its nginx front) that listens beyond loopback must refuse a request without a key."""
    endpoints = facts.engine_endpoints
    if not endpoints:
        return none_found(facts, "a deployed engine's state", "no engine deployed by hosttune on this host")
    open_to_all = [e for e in endpoints if e.status == "200" and e.is_exposed]
    active = "; ".join(_describe(e) for e in endpoints)
    if open_to_all:
        ports = ", ".join(f"{e.role} port {e.port}" for e in open_to_all)
        return Verdict(Status.DRIFT, DESIRED, None, active,
                       f"{ports} answers /v1/models to anyone who can reach the host, without an API key")
    return Verdict(Status.OK, DESIRED, None, active)


CHECKS = (
    Check("serve.api_key", "Engine port needs an API key", Severity.CRITICAL,
          "An engine port that answers without a key lets anyone who reaches the host spend its GPUs and read "
          "what it generates.",
          "none by apply: deploy again with deploy.api_key: true (and deploy.nginx, so the engine listens on "
          "127.0.0.1 behind the host's nginx)", False, api_key),
)
