"""The documents name only what exists: every repository path in their code, and every
`hosttune` / `hosttune-engine` command, subcommand and option they show."""

from __future__ import annotations

import contextlib
import io
import re
from functools import lru_cache
from pathlib import Path

import pytest
from typer.testing import CliRunner

from doc_text import CURRENT, DOCS, PLACEHOLDER, ROOT, code_lines, commands, section
from hosttune.cli import app

# Where a relative path in a document may start: the repository, the document's folder, the
# engine's distribution and package, the control plane's package.
BASES = [ROOT, ROOT / "engine", ROOT / "engine" / "hosttune_engine", ROOT / "hosttune"]
EXTENSIONS = (".py", ".md", ".yaml", ".yml", ".sh", ".json", ".j2", ".toml", ".txt", ".jinja")
OUTPUT_OPTIONS = {"--out", "-o", "--output", "--junit-xml", "--json"}  # what follows them is made, not read
# Files that documents name but that live elsewhere: in a model folder, a wheelhouse entry or a release,
# in a bench run's --out folder, or in a live test's own folder.
NOT_IN_REPO = {"config.json", "tokenizer.json", "tokenizer_config.json", "manifest.json", "release.json",
               "build.log", "results.json", "inventory.yaml", "inv.yaml"}
FIRST_COMMANDS = ["bash scripts/setup.sh && .venv/bin/hosttune check", "bash scripts/test.sh"]
HELP_ENV = {"COLUMNS": "250"}


# -- what the documents show -------------------------------------------------------------------------------
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
@lru_cache(maxsize=None)  # once a command: the documents show some dozens of times each
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
