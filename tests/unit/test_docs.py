"""The documents name only what exists: every repository path in their code, and every
`hosttune` / `hosttune-engine` command, subcommand and option they show."""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import re
import shlex
from functools import lru_cache
from pathlib import Path

import pytest
from typer.testing import CliRunner

from hosttune.cli import app

ROOT = Path(__file__).resolve().parents[2]


def markdown_files(root: Path) -> list[Path]:
    """Every Markdown file of the repository (READMEs, docs/, the benchmark notes, the fixtures'
    provenance), without walking hidden folders such as .git and .venv."""
    found = []
    for folder, subfolders, files in os.walk(root):
        subfolders[:] = sorted(d for d in subfolders if not d.startswith(".") and d != "__pycache__")
        found += [Path(folder) / f for f in files if f.endswith(".md")]
    return sorted(found)


DOCS = markdown_files(ROOT)
HISTORY = ROOT / "benchmarks" / "history"
CURRENT = [d for d in DOCS if HISTORY not in d.parents]  # the history records scripts and options since removed
# Where a relative path in a document may start: the repository, the document's folder, the
# engine's distribution and package, the control plane's package.
BASES = [ROOT, ROOT / "engine", ROOT / "engine" / "hosttune_engine", ROOT / "hosttune"]
EXTENSIONS = (".py", ".md", ".yaml", ".yml", ".sh", ".json", ".j2", ".toml", ".txt", ".jinja")
OUTPUT_OPTIONS = {"--out", "-o", "--output", "--junit-xml", "--json"}  # what follows them is made, not read
PLACEHOLDER = re.compile(r"^[A-Z][A-Z_]*$")  # NAME, DIR, PATH: a part the reader fills in
# Files that documents name but that live elsewhere: in a model folder, a wheelhouse entry or a release,
# in a bench run's --out folder, or in a live test's own folder.
NOT_IN_REPO = {"config.json", "tokenizer.json", "tokenizer_config.json", "manifest.json", "release.json",
               "build.log", "results.json", "inventory.yaml", "inv.yaml"}
FIRST_COMMANDS = ["bash scripts/setup.sh && .venv/bin/hosttune check", "bash scripts/test.sh"]
HELP_ENV = {"COLUMNS": "250"}


# -- what the documents show -------------------------------------------------------------------------------
def code_lines(text: str) -> list[str]:
    """Lines of fenced code blocks and inline code spans outside them.

    In a block, a line ending in a backslash continues on the next, and an indented line
    continues a layout line (`scripts/   a.py, b.py`) inside the same folder.
    """
    lines, fenced, rest, folder = [], False, [], ""
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced, folder = not fenced, ""
        elif not fenced:
            rest.append(line)
        elif lines and lines[-1].endswith("\\"):
            lines[-1] = lines[-1][:-1] + " " + line.strip()
        elif line[:1].isspace() and folder:
            lines.append(f"{folder} {line.strip()}")
        else:
            first = line.split()[0] if line.split() else ""
            folder = first if first.endswith("/") else ""
            lines.append(line.strip())
    spans = re.findall(r"`([^`]+)`", "\n".join(rest))  # a span may wrap onto the next line
    return lines + [span.replace("\n", " ") for span in spans]


def commands(line: str) -> list[list[str]]:
    """Each `hosttune ...` or `hosttune-engine ...` in one line of code, as words."""
    out = []
    for part in re.split(r"&&|\|\||;|\|", line):
        try:
            words = [w.strip("[]") for w in shlex.split(part, comments=True)]
        except ValueError:  # prose in a span, not a command
            continue
        words = [w for w in words if w]
        if words[:3] == ["python", "-m", "hosttune_engine"]:
            words = ["hosttune-engine", *words[3:]]
        if words and words[0] in ("hosttune", ".venv/bin/hosttune", "hosttune-engine"):
            out.append([Path(words[0]).name, *words[1:]])
    return out


def paths(line: str) -> list[str]:
    """The words of a line of code that name a file or folder of this repository.

    A word with a slash is one when its first part is a folder or file of the repository; a
    bare file name always is (unless it lives in a model folder, a wheelhouse or a host), and
    must be the name of some file here. On a layout line (`scripts/   make_tiny_models.py, ...`)
    bare names are inside the line's folder.
    """
    found, words = [], line.replace("=", " ").split()
    folder = words[0] if words and words[0].endswith("/") else ""
    for before, word in zip(["", *words], words):
        word = word.strip("\"'()[],;:*").rstrip(".").removeprefix("./")
        if word.split("/")[0] == ".venv":  # made by scripts/setup.sh
            continue
        if before in OUTPUT_OPTIONS or not re.fullmatch(r"[\w.\-/]+", word) or word.startswith(("-", "/", "...")):
            continue
        if any(PLACEHOLDER.match(part.split(".")[0]) for part in word.split("/")):
            continue
        if "/" in word and any((base / word.split("/")[0]).exists() for base in BASES):
            found.append(word)
        elif "/" not in word and word.endswith(EXTENSIONS) and word not in NOT_IN_REPO:
            found.append(folder + word)
    return found


def exists(path: str, doc: Path) -> bool:
    """A path from one of the bases; a bare file name anywhere in the repository."""
    if "/" not in path:
        return path in repository_file_names()
    return any((base / path).exists() for base in [doc.parent, *BASES])


@lru_cache(maxsize=1)
def repository_file_names() -> frozenset[str]:
    tops = [p for p in ROOT.iterdir() if not p.name.startswith(".")]
    return frozenset(f.name for top in tops for f in [top, *top.rglob("*")] if "__pycache__" not in f.parts)


# -- what the programs offer ----------------------------------------------------------------------------
def hosttune_help(*args: str) -> str:
    result = CliRunner().invoke(app, [*args, "--help"], env=HELP_ENV)
    assert result.exit_code == 0, f"hosttune {' '.join(args)} --help: {result.output}"
    return result.output


@lru_cache(maxsize=None)
def hosttune_commands() -> frozenset[str]:
    panel = hosttune_help().split("Commands", 1)[1]
    return frozenset(re.findall(r"^│ (\w[\w-]*) ", panel, re.M))


@lru_cache(maxsize=None)
def engine_help(*args: str) -> str:
    from hosttune_engine.server.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as done:
        main([*args, "--help"])
    assert done.value.code == 0, f"hosttune-engine {' '.join(args)} --help failed"
    return out.getvalue()


def has_option(help_text: str, option: str) -> bool:
    return re.search(rf"(?<![\w-]){re.escape(option)}(?![\w-])", help_text) is not None


def command_faults(words: list[str]) -> list[str]:
    program, rest = words[0], words[1:]
    if not rest:  # the program's name alone
        return []
    if program == "hosttune":
        if rest and rest[0].startswith("-"):
            return [] if rest[0] == "--version" else [f"hosttune has no option {rest[0]}"]
        if rest and PLACEHOLDER.match(rest[0]):  # `hosttune COMMAND --help`
            return []
        if not rest or rest[0] not in hosttune_commands():
            return [f"hosttune has no command {rest[:1]}"]
        help_text = hosttune_help(rest[0])
    else:
        if rest[:1] not in (["serve"], ["plan"], ["tune"]):
            return [f"hosttune-engine has no command {rest[:1]}"]
        help_text = engine_help(rest[0])
    options = [w.split("=", 1)[0] for w in rest[1:] if w.startswith("-") and w != "-"]
    return [f"{program} {rest[0]} has no option {o}" for o in options if not has_option(help_text, o)]


# -- the tests -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("doc", CURRENT, ids=[str(d.relative_to(ROOT)) for d in CURRENT])
def test_every_path_a_document_names_exists(doc):
    named = {p for line in code_lines(doc.read_text()) for p in paths(line)}
    missing = sorted(p for p in named if not exists(p, doc))
    assert not missing, f"{doc.relative_to(ROOT)} names paths that do not exist: {missing}"


@pytest.mark.parametrize("doc", DOCS, ids=[str(d.relative_to(ROOT)) for d in DOCS])
def test_every_command_a_document_shows_exists(doc):
    shown = [c for line in code_lines(doc.read_text()) for c in commands(line)]
    faults = sorted({f for words in shown for f in command_faults(words)})
    assert not faults, f"{doc.relative_to(ROOT)}: {faults}"


def test_the_documents_show_commands_and_paths():
    """The extraction finds what the documents hold (a parser that found nothing would pass everything)."""
    readme = code_lines((ROOT / "README.md").read_text())
    assert sum(len(commands(line)) for line in readme) >= 10
    assert "scripts/setup.sh" in {p for line in readme for p in paths(line)}
    assert command_faults(["hosttune", "chek"]) and command_faults(["hosttune", "check", "--inventroy", "x"])
    assert command_faults(["hosttune-engine", "serve", "--max-batch", "4"])
    assert not exists("inventories/prod.yaml", ROOT / "README.md")
    assert paths("as in `...-205c4ff.json`") == []  # an abbreviated name, not a file
    assert {"templates/README.md", "benchmarks/README.md", "tests/live/README.md"} <= {str(d.relative_to(ROOT)) for d in DOCS}


def test_readme_starts_with_the_two_commands_a_fresh_machine_runs():
    first_block = (ROOT / "README.md").read_text().split("```bash\n", 1)[1].split("```", 1)[0]
    assert first_block.splitlines() == FIRST_COMMANDS


# -- what docs/deploy.md and the README promise about changing hosts and a deployment's shape -----------------
def section(doc: Path, title: str) -> str:
    text = doc.read_text()
    start = text.index(title)
    end = text.find("\n#", start + len(title))
    return text[start:end if end > 0 else None]


def test_every_command_that_changes_hosts_confirms_one_way_and_the_docs_name_each():
    """The commands with --yes are exactly those the docs' grammar names, and each also has --dry-run."""
    grammar = section(ROOT / "docs" / "deploy.md", "### Confirming changes")
    named = set(re.findall(r"`(\w+)(?: --rollback)?`", grammar.split("\n\n")[1]))
    confirming = {c for c in hosttune_commands() if has_option(hosttune_help(c), "--yes")}
    assert named == confirming == {"apply", "rollback", "remediate", "uncordon", "deploy"}
    assert all(has_option(hosttune_help(c), "--dry-run") for c in confirming)
    readme = (ROOT / "README.md").read_text()
    assert "`--dry-run` stops there, `--yes` goes ahead" in readme and "without a terminal nothing changes" in readme
    assert "without a terminal (a pipe, CI), nothing changes" in grammar


def test_the_shape_the_docs_declare_is_what_the_inventory_takes(tmp_path):
    from hosttune.config.inventory import load_inventory
    from hosttune.deploy.settings import KNOWN_KEYS
    from hosttune.deploy.shape import SHAPE_KEYS, Shape, declared

    block = section(ROOT / "docs" / "deploy.md", "### The deployment's shape").split("```yaml\n")[1].split("```")[0]
    import yaml

    doc = yaml.safe_load(block)["deploy"]
    assert set(SHAPE_KEYS) | {"port"} <= set(doc) <= KNOWN_KEYS
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(yaml.safe_dump({"hosts": {"h": {"deploy": {k: doc[k] for k in (*SHAPE_KEYS, "port")}}}}))
    assert declared(load_inventory(inventory).hosts[0]) == Shape("custom", "/models/qwen2.5-7b", "2", 1, 8000, 1)
    example = load_inventory(ROOT / "inventories" / "example.yaml").hosts[0]
    assert declared(example).engine == "vllm" and declared(example).replicas == "per-gpu"


def test_the_shape_is_layered_as_the_docs_say_and_they_name_every_option_that_overrides_it(tmp_path):
    """defaults < group < host in the inventory, the options that override it for one run, and the --yes a plan
    that takes something away needs: said in docs/deploy.md and the README, and true of the code."""
    import yaml

    from hosttune.config.inventory import load_inventory
    from hosttune.deploy.shape import SHAPE_KEYS, Shape, declared

    shape_doc = section(ROOT / "docs" / "deploy.md", "### The deployment's shape")
    readme = (ROOT / "README.md").read_text()
    assert "(defaults < group < host)" in shape_doc and "(defaults < group <\nhost)" in readme
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(yaml.safe_dump({
        "defaults": {"deploy": {"engine": "vllm", "model": "/models/a", "replicas": 1, "port": 9000}},
        "groups": {"g": {"vars": {"deploy": {"replicas": 2, "model": "/models/g"}},
                         "hosts": {"h": {"deploy": {"model": "/models/h"}}}}}}))
    assert declared(load_inventory(inventory).hosts[0]) == Shape("vllm", "/models/h", "2", None, 9000, None)

    named = set(re.findall(r"`(--[\w-]+)`", shape_doc.split("An option (", 1)[1].split(")", 1)[0]))
    overriding = {"--" + key.replace("_", "-") for key in (*SHAPE_KEYS, "port")} | {"--router", "--set"}
    assert named == overriding and all(has_option(hosttune_help("deploy"), o) for o in named)
    assert "keeps what the host serves now" in shape_doc and "keeps what the host serves now" in readme
    assert "needs\n`--yes` itself" in shape_doc and "needs\n`--yes`" in readme


def test_the_preconditions_the_docs_state_are_every_need_an_operation_declares():
    """Each kind of need the plan checks before anything is sent has its row in the README's table and its
    words in docs/deploy.md's step; a new kind fails here until the documents say what it asks of a host."""
    from typing import get_args

    from hosttune.actions import needs

    said = {needs.NeedCommand: "on the host's PATH", needs.NeedVenv: "venv module and ensurepip",
            needs.NeedDir: "its parent directory", needs.NeedSpace: "free space",
            needs.NeedPort: "ports free or held by this deployment's own units",
            needs.NeedModel: "a `config.json` of an architecture the engine loads"}
    assert set(said) == set(get_args(needs.Need))
    table = section(ROOT / "README.md", "### Preconditions: checked before anything is sent")
    assert all(words in table for words in said.values()), [w for w in said.values() if w not in table]
    step = " ".join(section(ROOT / "docs" / "deploy.md", "### A deploy, step by step").split())
    for words in ("makes virtualenvs", "python3-venv", "have room for", "readable `config.json`", "are free or held",
                  "nothing changed: HOST: ...", "nothing is sent"):
        assert words in step, words


def test_the_readme_names_each_extra_a_command_needs():
    """`bench` and `verify` need extras the base install lacks; the README says which, as pyproject names them."""
    import tomllib

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    readme = " ".join((ROOT / "README.md").read_text().split())
    for command in ("bench", "verify"):
        assert command in extras and f"`hosttune {command}`" in readme
        assert f"`{command}` extra" in readme
        assert f"pip install -e '.[{command}]'" in readme


# -- what docs/kernel-plans.md shows is what `hosttune-engine plan` prints ------------------------------------
def shown_plans(text: str) -> list[tuple[list[str], str]]:
    """Each `$ hosttune-engine plan ...` in a code block of the document, as its arguments and the output shown
    under it (up to the next `$` line or the block's end)."""
    found = []
    for block in re.findall(r"```\n(.*?)```", text, re.S):
        for shown in re.split(r"^\$ ", block, flags=re.M)[1:]:
            command, _, output = shown.partition("\n")
            if command.startswith("hosttune-engine plan "):
                found.append((shlex.split(command)[1:], output.strip("\n")))
    return found


def test_the_kernel_plans_shown_are_what_the_engine_prints(tmp_path, monkeypatch):
    """A whole plan shown is the command's whole output; an excerpt (tables without the header) is some of its
    tables, each whole. The model is the Qwen2.5-7B shape of tests/fixtures, with the shipped table only."""
    from hosttune_engine.kernels import tuning
    from hosttune_engine.server.cli import main

    monkeypatch.setenv(tuning.CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.setenv(tuning.USER_ENV, str(tmp_path / "none.json"))
    monkeypatch.delenv(tuning.SHIPPED_ENV, raising=False)
    plans = shown_plans((ROOT / "docs" / "kernel-plans.md").read_text())
    assert len(plans) >= 4 and any(out.startswith("Kernel plan for") for _, out in plans)
    for args, shown in plans:
        args = [str(ROOT / "tests" / "fixtures" / a) if a == "qwen2.5-7b" else a for a in args]
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            main(args)
        printed = printed.getvalue().strip("\n")
        if shown.startswith("Kernel plan for"):
            assert shown == printed, args
        else:
            tables = printed.split("\n\n")
            assert all(t in tables for t in shown.split("\n\n")), args


def test_the_engine_readme_states_serves_defaults_and_graph_sizes():
    """The defaults engine/README.md gives for `serve` are argparse's, and its graph sizes the engine's."""
    from hosttune_engine.core.mixed_graphs import MIXED_GRAPH_SIZES
    from hosttune_engine.core.prefill_graphs import PREFILL_GRAPH_SIZES
    from hosttune_engine.server.cli import _parser

    commands = next(a for a in _parser()._actions if a.choices and "serve" in a.choices).choices
    serve = argparse.Namespace(**{a.dest: a.default for a in commands["serve"]._actions})  # as typed, not parsed
    readme = " ".join((ROOT / "engine" / "README.md").read_text().split())
    said = {f"`--gpu-memory-utilization` (default {serve.gpu_memory_utilization:g})",
            f"`--cpu-kv-cache-gib` (default {serve.cpu_kv_cache_gib:g})",
            f"`--max-step-ms` (default `{serve.max_step_ms}`",
            f"`--header-timeout` ({serve.header_timeout:g} s)", f"`--idle-timeout` ({serve.idle_timeout:g} s)",
            f"`--max-connections` ({serve.max_connections})", f"`--host` defaults to {serve.host}",
            f"({len(MIXED_GRAPH_SIZES)} buckets, {MIXED_GRAPH_SIZES[0]} to {MIXED_GRAPH_SIZES[-1]:,}",
            f"Other steps of up to {MIXED_GRAPH_SIZES[-1]:,} tokens",
            f"({PREFILL_GRAPH_SIZES[0]} to {PREFILL_GRAPH_SIZES[-1]})"}
    assert not [s for s in said if s not in readme]


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


def test_the_engine_layout_lists_every_module():
    """docs/design.md sends the reader to engine/README.md's layout for every module: each module of the package
    (and each engine script) is named on its folder's lines, and each folder there is one of the package's."""
    package = ROOT / "engine" / "hosttune_engine"
    block = (ROOT / "engine" / "README.md").read_text().split("## Layout", 1)[1].split("```")[1]
    said: dict[str, set[str]] = {}
    folder = ""
    for line in filter(str.strip, block.splitlines()):
        if not line[0].isspace():
            first = line.split()[0]
            folder = first if first.endswith("/") else ""
            line = line[len(first):] if folder else line
        said.setdefault(folder, set()).update(re.findall(r"\b[a-z_][a-z0-9_]*(?:\.py|\.sh|\.json)?\b", line))
    modules = {(f"{p.parent.relative_to(package)}/" if p.parent != package else "", p.stem)
               for p in package.rglob("*.py") if p.name != "__init__.py" and "__pycache__" not in p.parts}
    unlisted = sorted(f"{d}{m}" for d, m in modules if m not in said.get(d, set()) and f"{m}.py" not in said.get(d, set()))
    assert not unlisted, f"engine/README.md's layout leaves out {unlisted}"
    scripts = {p.name for p in (ROOT / "engine" / "scripts").iterdir() if p.suffix in (".py", ".sh")}
    assert scripts <= said["scripts/"], scripts - said["scripts/"]
    for folder in (d for d in said if d and d != "scripts/"):
        assert (package / folder).is_dir(), folder
    assert "`engine/README.md` lists every module" in (ROOT / "docs" / "design.md").read_text()


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


def test_the_engine_readme_lists_every_field_of_the_loop_messages():
    import dataclasses

    from hosttune_engine.core import messages

    readme = " ".join((ROOT / "engine" / "README.md").read_text().split())
    for cls in (messages.EngineRequest, messages.AbortRequest, messages.TokenOutput, messages.EngineStats):
        shown = re.search(rf"`{cls.__name__}\(([^)]*)\)`", readme).group(1)
        assert [w.split("=")[0].strip() for w in shown.split(",")] == [f.name for f in dataclasses.fields(cls)], cls


def test_the_engine_readme_names_every_metric_the_server_exports():
    source = (ROOT / "engine" / "hosttune_engine" / "server" / "metrics.py").read_text()
    exported = set(re.findall(r"\"((?:vllm|hosttune):\w+)\"", source))
    said = set(re.findall(r"`((?:vllm|hosttune):\w+)", (ROOT / "engine" / "README.md").read_text()))
    assert exported and not sorted(m for m in exported if m not in said and f"{m}_total" not in said)
    assert not sorted(m for m in said if m not in exported and m.removesuffix("_total") not in exported)


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
