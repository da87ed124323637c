"""Reading the repository's documents: its Markdown files, the code they show (fenced blocks and inline
spans), the `hosttune` / `hosttune-engine` commands in that code, and a section by its title."""

from __future__ import annotations

import os
import re
import shlex
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PLACEHOLDER = re.compile(r"^[A-Z][A-Z_]*$")  # NAME, DIR, PATH: a part the reader fills in


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


def section(doc: Path, title: str) -> str:
    text = doc.read_text()
    start = text.index(title)
    end = text.find("\n#", start + len(title))
    return text[start:end if end > 0 else None]
