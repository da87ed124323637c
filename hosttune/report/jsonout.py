"""Machine-readable report: every host, its findings, timings and the fleet outliers."""

from __future__ import annotations

import dataclasses
import json

from hosttune.fleet import HostReport, outliers
from hosttune.fleet_runner import exit_code


def finding_dict(f) -> dict:
    d = dataclasses.asdict(f)
    d["status"], d["severity"] = f.status.value, f.severity.value
    return d


def host_dict(r: HostReport) -> dict:
    return {
        "host": r.host.name,
        "group": r.host.group,
        "address": r.host.connection.address,
        "profile": r.profile,
        "reachable": r.reachable,
        "error": r.error,
        "timings": dataclasses.asdict(r.timings),
        "findings": [finding_dict(f) for f in r.findings],
        "probe_errors": list(r.facts.probe_errors) if r.facts else [],
    }


def render(reports: list[HostReport]) -> str:
    doc = {
        "hosts": [host_dict(r) for r in reports],
        "outliers": [dataclasses.asdict(o) for o in outliers(reports)],
        "exit_code": exit_code(reports),
    }
    return json.dumps(doc, indent=2)


def facts_json(reports: list[HostReport]) -> str:
    """`hosttune facts`: the raw facts of each host."""
    doc = {
        r.host.name: dataclasses.asdict(r.facts) if r.facts else {"error": r.error, "reachable": r.reachable}
        for r in reports
    }
    return json.dumps(doc, indent=2, default=str)
