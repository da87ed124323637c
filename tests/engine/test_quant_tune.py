"""The quantized-kernel tuner (benchmarks/engine/quant_tune.py) on one tiny shape on the CPU: every candidate is
checked against its reference before it is timed, and the winners come out in the tuned-table format. One
projection is enough: the stage runs the same sweep per shape (the engine's own tuner is tested on every
shape of a tiny model, tests/engine/test_tuner.py)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import HAS_CUDA

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(HAS_CUDA, reason="the tiny run is the CPU's, under the Triton interpreter; a GPU runs the tuner")
def test_gemv_stage_checks_times_and_writes_configs(tmp_path):
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": f"{REPO}:{REPO / 'engine'}"}
    cmd = [sys.executable, str(REPO / "benchmarks" / "engine" / "quant_tune.py"), "--tiny", "--out", str(tmp_path),
           "--stage", "gemv", "--proj", "down", "--budget-s", "1000"]  # no sweep left out past the budget
    subprocess.run(cmd, check=True, env=env, timeout=600)
    res = json.loads((tmp_path / "stage-gemv.json").read_text())
    rows = {(r["kernel"], r["proj"]) for r in res["rows"] if "best" in r}
    assert rows == {("int4_gemv", "down"), ("fp8_gemv", "down")}
    assert all(r["max_err"] < 1e-4 for r in res["rows"])  # fp32 on the CPU
    assert {"FUSE", "BLOCK_N", "BLOCK_K"} <= set(res["table"]["int4_gemv"]["float32-le1-256x512"])
    assert res["lm_head_ms"] > 0
