"""JUnit XML: a test suite per host, a test case per check (CI dashboards read this)."""

from __future__ import annotations

import xml.etree.ElementTree as ET

from hosttune.checks.findings import Status
from hosttune.fleet import HostReport


def _suite(r: HostReport) -> ET.Element:
    suite = ET.Element("testsuite", name=r.host.name, time=f"{r.timings.total_s:.3f}")
    failures = errors = skipped = 0
    problems = [r.error or "unreachable"] if not r.reachable or r.error else list(r.facts.probe_errors if r.facts else ())
    if problems:  # what makes check exit 2 without a finding in error: a probe that failed, or parts of it
        case = ET.SubElement(suite, "testcase", classname=r.host.name, name="probe")
        ET.SubElement(case, "error", message="; ".join(problems))
        errors += 1
    for f in r.findings:
        case = ET.SubElement(suite, "testcase", classname=r.host.name, name=f.check_id)
        message = f"desired {f.desired}; configured {f.configured or '-'}; active {f.active or '-'}"
        if f.is_failing:
            el = ET.SubElement(case, "failure", message=f"{f.status.value}: {message}", type=f.status.value)
            el.text = f"{f.detail}\nfix: {f.remediation}"
            failures += 1
        elif f.status is Status.ERROR:
            ET.SubElement(case, "error", message=f.detail or message)
            errors += 1
        elif f.status is Status.NOT_APPLICABLE:
            ET.SubElement(case, "skipped", message=f.detail)
            skipped += 1
    suite.set("tests", str(len(suite)))
    suite.set("failures", str(failures))
    suite.set("errors", str(errors))
    suite.set("skipped", str(skipped))
    return suite


def render(reports: list[HostReport]) -> str:
    root = ET.Element("testsuites", name="hosttune check")
    for r in reports:
        root.append(_suite(r))
    ET.indent(root)
    return ET.tostring(root, encoding="unicode", xml_declaration=True)
