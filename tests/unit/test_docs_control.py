"""What the README and docs/*.md state about the control plane is what its code holds: the monitor's
metrics, alerts and defaults, the layers and dependencies, the example inventory, the check ids, option
defaults, Xid codes and remediation ladders."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from doc_text import CURRENT, DOCS, PLACEHOLDER, ROOT, code_lines, commands, section
from hosttune.cli import app


def test_the_monitor_page_names_every_metric_alert_and_default():
    """docs/monitor.md's tables: the metrics the pass writes, the alert rules the template holds (with their
    severities and `for:`), and the monitor section's defaults."""
    from hosttune.config.monitor_spec import MonitorSpec
    from hosttune.report.status_metrics import _HELP

    page = (ROOT / "docs" / "monitor.md").read_text()
    metrics = set(re.findall(r"^\| `(hosttune_\w+)", section(ROOT / "docs" / "monitor.md", "## Metrics"), re.M))
    assert metrics == set(_HELP)
    rules = (ROOT / "templates" / "hosttune-alerts.yml.j2").read_text()
    shown = re.findall(r"^\| `(Hosttune\w+)` \((\w+)\) \|.*\| ([^|]+) \|$", section(ROOT / "docs" / "monitor.md",
                                                                             "## Alert rules"), re.M)
    templated = re.findall(r"alert: (Hosttune\w+)\n.*?for: ([^\n]+)\n.*?severity: (\w+)", rules, re.S)
    assert {name for name, _, _ in shown} == {name for name, _, _ in templated}
    fors = {"{{ interval_s * 2 }}s": "2 intervals", "{{ interval_s * 3 }}s": "3 intervals", "1m": "1 minute",
            "5m": "5 minutes"}
    assert {(n, s, fors[f]) for n, f, s in templated} == {(n, s, f.strip()) for n, s, f in shown}
    spec = MonitorSpec()
    for key, default in (("interval_s", spec.interval_s), ("active_interval_s", spec.active_interval_s),
                         ("textfile_dir", f"`{spec.textfile_dir}`"), ("enabled", f"`{str(spec.enabled).lower()}`")):
        assert f"| `{key}` | {default} |" in page, key


# -- what docs/design.md says of the layers and the dependencies ------------------------------------------------
def layering(test_file: Path):
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"_layers_of_{test_file.parent.name}", test_file)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.LAYERS


def said_layers(text: str) -> list[set[str]]:
    """The `name`s of a 'bottom to top' / 'bottom first' sentence, one set per ';'-separated layer."""
    sentence = re.split(r"bottom (?:to top|first): ", " ".join(text.split()), maxsplit=1)[1].split(". ", 1)[0]
    return [set(re.findall(r"`(\w+)`", part)) for part in sentence.split(";") if re.search(r"`\w+`", part)]


def test_design_states_each_programs_layers_as_the_architecture_tests_hold_them():
    design = (ROOT / "docs" / "design.md").read_text()
    control, engine = design.split("The control plane never imports", 1)[1], design.split("Imports point one way", 1)[1]
    for text, test_file in ((control, ROOT / "tests" / "unit" / "test_architecture.py"),
                            (engine, ROOT / "tests" / "engine" / "test_architecture.py")):
        held = [set(layer) - {"__init__", "__main__"} for layer in layering(test_file).layers]
        assert said_layers(text) == [layer for layer in held if layer], test_file


def test_design_names_every_dependency_each_program_declares():
    import tomllib

    row = next(line for line in (ROOT / "docs" / "design.md").read_text().splitlines() if line.startswith("| depends on"))
    said = re.sub(r"[^a-z0-9]", "", row.lower())
    for toml in (ROOT / "pyproject.toml", ROOT / "engine" / "pyproject.toml"):
        project = tomllib.loads(toml.read_text())["project"]
        extras = {k: v for k, v in project.get("optional-dependencies", {}).items() if k != "test"}
        for requirement in [*project["dependencies"], *(r for reqs in extras.values() for r in reqs)]:
            name = re.sub(r"[^a-z0-9]", "", re.split(r"[<>=!;\[ ]", requirement, maxsplit=1)[0].lower())
            assert name in said, f"{toml.relative_to(ROOT)}: {requirement}"


def test_the_example_inventory_shows_every_field_it_says_it_shows():
    """inventories/example.yaml opens with 'Every inventory field': each key the inventory and its `deploy:` vars
    take is there, as a key or, where two exclude each other, in a comment beside the other."""
    from hosttune.config.inventory import VARS_SCHEMA
    from hosttune.deploy.access import NGINX_KEYS
    from hosttune.deploy.settings import KNOWN_KEYS

    text = (ROOT / "inventories" / "example.yaml").read_text()
    assert text.startswith("# Every inventory field")
    keys = {"defaults", "groups", "hosts", "vars", *KNOWN_KEYS, *NGINX_KEYS}
    keys |= set(VARS_SCHEMA) | {k for v in VARS_SCHEMA.values() if isinstance(v, dict) for k in v}
    assert not sorted(k for k in keys if not re.search(rf"(?<![\w-]){k}:", text))


def test_the_readme_names_each_package_the_test_script_installs_as_root():
    script = (ROOT / "scripts" / "test.sh").read_text()
    packages = re.search(r"for pkg in ([\w -]+); do", script).group(1).split()
    readme = (ROOT / "README.md").read_text().split("## What it does", 1)[0]
    assert packages and not [p for p in packages if f"`{p}`" not in readme]


def test_design_names_every_cli_module_that_registers_commands():
    sentence = " ".join((ROOT / "docs" / "design.md").read_text().split()).split("one module per command family", 1)[1]
    named = set(re.findall(r"`(\w+\.py)`", sentence.split(")", 1)[0]))
    registering = {p.name for p in (ROOT / "hosttune" / "cli").glob("*.py") if "@app.command" in p.read_text()}
    assert named == registering


def test_every_check_and_remediation_step_the_documents_name_exists():
    """A `prefix.name` in a document whose prefix is a check area is a check `hosttune explain` knows, a
    remediation step, or a profile setting (`monitor.interval_s`); file names and Python names are not."""
    import dataclasses

    from hosttune.checks import BY_ID
    from hosttune.config.profile import _SECTION_TYPES
    from hosttune.remediate.rungs import Rung

    areas = {check_id.split(".")[0] for check_id in BY_ID}
    known = set(BY_ID) | {f"remediate.{r}" for r in Rung}
    known |= {f"{s}.{f.name}" for s, spec in _SECTION_TYPES.items() for f in dataclasses.fields(spec)}
    named = {(doc.relative_to(ROOT), word) for doc in CURRENT for word in re.findall(r"`([a-z]+\.[a-z_]+)`", doc.read_text())
             if word.split(".")[0] in areas | {"remediate"} and not word.endswith(".py") and word != "sys.argv"}
    assert named and not sorted((str(d), w) for d, w in named if w not in known)
    explained = {words[2] for doc in DOCS for line in code_lines(doc.read_text()) for words in commands(line)
                 if words[1:2] == ["explain"] and len(words) > 2 and not PLACEHOLDER.match(words[2])}
    assert "remediate.reset" in explained and not explained - known


# Defaults the documents state, as (document, its words with {} for the value, command, option's parameter name).
STATED_DEFAULTS = [
    ("README.md", "(`--forks`, default {})", "check", "forks"),
    ("docs/remediate.md", "`--xid-window` hours ({} by default)", "remediate", "xid_window"),
    ("docs/remediate.md", "(`--drain-wait`, {} s)", "remediate", "drain_wait"),
    ("docs/remediate.md", "`--breaker-window` minutes ({})", "remediate", "breaker_window"),
    ("docs/remediate.md", "`--max-cordoned-percent` ({})", "remediate", "max_cordoned_percent"),
    ("docs/deploy.md", "`--canary-rate` ({} req/s)", "deploy", "canary_rate"),
    ("docs/deploy.md", "`--canary-duration` ({})", "deploy", "canary_duration"),
    ("docs/deploy.md", "(`{}` by default", "deploy", "nginx_dir"),
    ("docs/deploy.md", "`--health-timeout` ({} s)", "deploy", "health_timeout_s"),
    ("docs/deploy.md", "`--warmup` ({})", "deploy", "warmup"),
    ("docs/deploy.md", "`--gate-timeout` ({} s)", "deploy", "gate_timeout_s"),
    ("docs/deploy.md", "`--keep-releases` ({})", "deploy", "keep_releases"),
]


@pytest.mark.parametrize("doc,words,command,name", STATED_DEFAULTS, ids=[f"{c} {n}" for _, _, c, n in STATED_DEFAULTS])
def test_each_default_the_documents_state_is_the_commands(doc, words, command, name):
    """What the option defaults to; deploy's gate timings, which default to the inventory's, fall back to
    ServeSettings'."""
    import dataclasses

    import typer.main

    from hosttune.deploy.settings import ServeSettings

    params = {p.name: p.default for p in typer.main.get_command(app).commands[command].params}
    value = params.get(name)
    if value is None:
        value = next(f.default for f in dataclasses.fields(ServeSettings) if f.name == name)
    if isinstance(value, str):
        value = re.sub(r"^(\d+)s$", r"\1 s", value)  # a duration option's '30s', as prose writes it
    text = " ".join((ROOT / doc).read_text().split())
    assert words.format(f"{value:g}" if isinstance(value, float) else value) in text


def test_the_xid_codes_remediate_md_names_recover_as_it_says():
    from hosttune.checks.xid_codes import Recovery, recovery

    text = " ".join(section(ROOT / "docs" / "remediate.md", "### Xid events").split())

    def codes(after: str) -> set[int]:
        return {int(c) for c in re.findall(r"\d+", text.split(after, 1)[1].split(")", 1)[0])}

    assert codes("restart the application (") and all(recovery(c) is Recovery.RESTART_APP for c in codes("restart the application ("))
    assert codes("reset the GPU (") and all(recovery(c) is Recovery.RESET_GPU for c in codes("reset the GPU ("))
    assert codes("reboot (") and all(recovery(c) is Recovery.REBOOT for c in codes("reboot ("))
    assert recovery(45) is Recovery.IGNORE and "45 (cleanup after an earlier error)" in text


def test_the_ladders_remediate_md_states_are_the_code_s():
    from hosttune.remediate import faults, xid

    def said(ladder) -> str:
        return " → ".join(map(str, ladder))

    text = " ".join((ROOT / "docs" / "remediate.md").read_text().split())
    policy = xid.XidPolicy()
    assert f"within `--xid-window` hours ({policy.window_s / 3600:g} by default)" in text
    assert f"{policy.fatal_repeats} times in the window on one GPU: the GPU keeps failing after recovery: {said(xid.RETIRE_LADDER)};" in text
    assert f"otherwise a fatal Xid: {said(xid.GPU_LADDER)}" in text
    assert f"an application Xid twice on the same GPU: {said(xid.DIAGNOSE_LADDER)};" in text and policy.app_repeats == 2
    for row, ladder in (("`gpu.count` |", faults.MISSING_LADDER), ("pending | `gpu.memory_health` |", xid.GPU_LADDER),
                        ("unrepairable memory | `gpu.memory_health` |", xid.RETIRE_LADDER),
                        ("`gpu.nvlink` |", xid.GPU_LADDER), ("`gpu.clocks_power` |", xid.GPU_LADDER)):
        assert f"{row} {said(ladder)}" in text, row


def test_every_result_file_is_cited_and_every_cited_one_is_kept():
    """benchmarks/results holds the JSON BENCHMARKS.md cites (and what the history's pages cite there);
    each file BENCHMARKS.md names as a result is in it, or is what a command it shows writes (--out)."""
    results = ROOT / "benchmarks" / "results"
    page = (ROOT / "BENCHMARKS.md").read_text()
    citing = page + "".join(p.read_text() for p in (ROOT / "benchmarks" / "history").glob("*.md"))
    assert not sorted(f.name for f in results.iterdir() if f.name not in citing)
    written = set(re.findall(r"--out benchmarks/results/([\w.-]+\.json)", " ".join(page.split())))
    named = set(re.findall(r"`(?:benchmarks/results/)?([\w.-]+-\d{4}-\d\d-\d\d[\w.-]*\.json)`", page))
    assert named and not sorted(n for n in named - written if not (results / n).exists())
