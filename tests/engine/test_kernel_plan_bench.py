"""The kernel-plan benchmark (benchmarks/engine/kernel_plan.py): each variant's run reads only its own tables,
and the last table sets every variant beside the shipped one."""

import json
import subprocess
from argparse import Namespace

from benchmarks.engine import kernel_plan


def results(b1: float, awq_b64: float) -> dict:
    return {"decode": [{"batch": 1, "ratio_vs_floor": b1}, {"batch": 64, "ratio_vs_floor": 0.83},
                       {"batch": 64, "sampled": "top_p", "ratio_vs_floor": 0.1}],
            "ttft": [{"prompt_tokens": 4096, "ratio_to_floor": 1.14}],
            "quant": [{"scheme": "awq", "b1": {"tok_s": 405.0}, "batched": {"tok_s": awq_b64}}]}


def test_the_table_sets_each_variant_beside_the_shipped_one(tmp_path, capsys):
    for variant, res in (("shipped", results(0.95, 7400.0)), ("tuned", results(0.95 * 1.02, 7400.0 * 1.05))):
        (tmp_path / variant).mkdir()
        (tmp_path / variant / "results.json").write_text(json.dumps(res))
    (tmp_path / "tuned" / "tune.json").write_text(json.dumps({"wall_s": 71.5, "runs": [
        {"format": "bf16", "wall_s": 9.0, "rc": 0}, {"format": "awq", "wall_s": 62.5, "rc": 0}]}))
    kernel_plan.print_table(tmp_path)
    out = capsys.readouterr().out
    assert "tuned: tune wall 71.5 s (bf16 9.0 s rc 0, awq 62.5 s rc 0)" in out
    assert "| measure | shipped | tuned |" in out
    assert "| bf16 decode b1 / floor | 0.950 | 0.969 (1.020x) |" in out
    assert "| awq decode b64 tok/s | 7400 | 7770 (1.050x) |" in out
    assert "| fp8 decode b1 tok/s | - | - |" in out


def test_each_variant_runs_with_its_own_tables(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(subprocess, "run", lambda cmd, env, check, **kw: calls.append((cmd, env)))
    args = Namespace(commit="abc", budget_s=300.0)
    kernel_plan.run_variant("shipped", tmp_path, args)
    kernel_plan.run_variant("none", tmp_path, args)
    (shipped_cmd, shipped), (_, none) = calls
    assert "HOSTTUNE_ENGINE_SHIPPED_TABLE" not in shipped and none["HOSTTUNE_ENGINE_SHIPPED_TABLE"] == "off"
    assert shipped["HOSTTUNE_ENGINE_CACHE"] == str(tmp_path / "shipped" / "cache")
    assert none["HOSTTUNE_ENGINE_CACHE"] == str(tmp_path / "none" / "cache")
    assert shipped_cmd[shipped_cmd.index("--quant-schemes") + 1:][:2] == ["fp8", "awq"]
