"""What engine/README.md and docs/kernel-plans.md state about the engine is what the engine does: the kernel
plans it prints, `serve`'s defaults, its graph sizes, its modules, its loop messages and its metrics."""

from __future__ import annotations

import argparse
import contextlib
import io
import re
import shlex

from doc_text import ROOT


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
    tables, each whole; a refusal is its one line on stderr, exit 2. The model is the Qwen2.5-7B shape of
    tests/fixtures, with the shipped table only."""
    from hosttune_engine.kernels import tuning
    from hosttune_engine.server.cli import main

    monkeypatch.setenv(tuning.CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.setenv(tuning.USER_ENV, str(tmp_path / "none.json"))
    monkeypatch.delenv(tuning.SHIPPED_ENV, raising=False)
    plans = shown_plans((ROOT / "docs" / "kernel-plans.md").read_text())
    assert len(plans) >= 4 and any(out.startswith("Kernel plan for") for _, out in plans)
    for args, shown in plans:
        args = [str(ROOT / "tests" / "fixtures" / a) if a == "qwen2.5-7b" else a for a in args]
        printed, refused = io.StringIO(), shown.startswith("hosttune-engine: error: ")
        with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(printed):
            try:
                main(args)
            except SystemExit as exit_:
                assert refused and exit_.code == 2, args
        printed = printed.getvalue().strip("\n")
        if refused or shown.startswith("Kernel plan for"):
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


def test_the_architectures_the_docs_say_the_engine_loads_are_its_own():
    """engine/README.md, docs/deploy.md and the custom preset (whose list deploy checks a model against) name
    the architectures the engine's loader builds, no more and no fewer."""
    import yaml

    from hosttune_engine.model.model_config import SUPPORTED_ARCHITECTURES

    preset = yaml.safe_load((ROOT / "hosttune" / "presets" / "custom.yaml").read_text())["serve"]["architectures"]
    assert tuple(preset) == SUPPORTED_ARCHITECTURES
    deploy = " ".join((ROOT / "docs" / "deploy.md").read_text().split())
    named = re.search(r"\(the bundled engine: ([^;]+);", deploy).group(1)
    assert re.findall(r"`(\w+)`", named) == list(SUPPORTED_ARCHITECTURES)
    families = " and ".join(a.removesuffix("ForCausalLM") for a in SUPPORTED_ARCHITECTURES)
    assert f"It runs {families} checkpoints" in " ".join((ROOT / "engine" / "README.md").read_text().split())
