"""The forms a version pin takes: what check's matchers and apply's package names can meet."""

from __future__ import annotations

import re

# driver: a branch (535, met by its releases) or a release, matched by prefix (checks/driver.in_branch);
# CUDA: the X.Y that nvcc and /usr/local/cuda-X.Y report; Python: 3, 3.11 or a release, matched by prefix.
FORMS: dict[str, tuple[re.Pattern, str]] = {
    "driver": (re.compile(r"\d+(\.\d+){0,2}"), "a driver branch such as 535 or a release such as 580.159.04"),
    "cuda": (re.compile(r"\d+\.\d+"), "a CUDA toolkit version such as '12.4'"),
    "python": (re.compile(r"\d+(\.\d+){0,2}"), "a Python version such as '3.11'"),
}


def pin_problem(kind: str, text: str) -> str | None:
    """Why `text` cannot be a `kind` pin (one line, without the value), or None where it can."""
    pattern, form = FORMS[kind]
    return None if pattern.fullmatch(text) else f"must be {form}"
