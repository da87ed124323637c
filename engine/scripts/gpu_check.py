#!/usr/bin/env python3
"""Engine correctness on a GPU, in one run: kernel tests in bf16/fp16, the tiny-model
oracle tests on compiled Triton kernels, and a Qwen2.5-7B-shaped dummy model
generating greedily with the Triton path and with the torch reference path.

Prints a short Markdown table last and writes gpu_check.json (and junit.xml)
into --out. Example: python engine/scripts/gpu_check.py --out /tmp/out --commit abc123
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO / "engine"), str(REPO)]

from benchmarks.engine.qwen25_7b import QWEN25_7B  # noqa: E402  (shared with the benchmarks)
PROMPT_LENS = [7, 64, 500, 1500, 3000, 6000]  # 11K tokens: the 8K step budget chunks the last prefill
MAX_TOKENS = 32


def run_pytest(out: Path) -> dict:
    tests = ["tests/engine/test_kernels_elementwise.py", "tests/engine/test_kernels_attention.py",
             "tests/engine/test_oracle.py", "tests/engine/test_triton_engine.py"]
    env = {**os.environ, "PYTHONPATH": f"{REPO / 'engine'}:{REPO}"}
    junit = out / "junit.xml"
    t0 = time.time()
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "8", "-p", "no:cacheprovider",
                           f"--junitxml={junit}", *tests], cwd=REPO, env=env, capture_output=True, text=True)
    print(proc.stdout[-4000:], proc.stderr[-2000:], flush=True)
    counts = {"rc": proc.returncode, "seconds": round(time.time() - t0, 1)}
    if junit.is_file():
        suite = ET.parse(junit).getroot()
        suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
        for key in ("tests", "failures", "errors", "skipped"):
            counts[key] = int(suite.get(key, 0))
    return counts


def generate(engine, prompts, tag: str):
    import torch
    from hosttune_engine.core.messages import EngineRequest
    from hosttune_engine.sampling import SamplingParams

    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True, logprobs=2)
    for i, ids in enumerate(prompts):
        engine.add_request(EngineRequest(f"{tag}{i}", ids, params))
    tokens = {f"{tag}{i}": [] for i in range(len(prompts))}
    lps = {f"{tag}{i}": [] for i in range(len(prompts))}
    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    sync()
    t0 = time.time()
    while engine.has_unfinished_requests():
        for out in engine.step():
            tokens[out.request_id].extend(out.new_token_ids)
            lps[out.request_id].extend(out.new_logprobs or ())
    sync()
    return list(tokens.values()), list(lps.values()), time.time() - t0


def _to_float32(engine) -> None:
    """The same weights in fp32, with an fp32 KV pool: the ground truth for the half-precision runs."""
    import torch
    from hosttune_engine.cache.kv_pool import KVCacheShape, KVPool

    runner = engine.runner
    runner.kv_pool = None
    torch.cuda.empty_cache() if torch.cuda.is_available() else None
    runner.model.float()
    runner.dtype = torch.float32
    shape = KVCacheShape(**{**runner.kv_shape.__dict__, "dtype_bytes": 4})
    runner.kv_pool = KVPool(shape, runner.num_kv_blocks, runner.device, torch.float32)
    runner.kv_pool.bind(runner.model)


def compare_7b(config: dict, prompt_lens: list[int], dtype: str = "bfloat16") -> dict:
    """Greedy tokens of the Triton and torch-reference paths, in `dtype` and in fp32 (same weights)."""
    import torch
    from hosttune_engine import Engine, EngineConfig
    from hosttune_engine.layers.backend import set_kernel_backend

    folder = Path(tempfile.mkdtemp())
    (folder / "config.json").write_text(json.dumps(config))
    t0 = time.time()
    engine = Engine(EngineConfig(model=str(folder), load_format="dummy", dtype=dtype, kernel_backend="triton",
                                 enable_prefix_caching=False, max_num_batched_tokens=8192, max_model_len=8192,
                                 num_kv_blocks=2048))
    load_s = time.time() - t0
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, config["vocab_size"], (n,), generator=gen).tolist() for n in prompt_lens]
    engine.runner.graphs = engine.runner.prefill_graphs = None  # both paths eager: graphs hold Triton kernels
    runs, seconds = {}, {}
    for precision in ("half", "fp32"):
        if precision == "fp32":
            _to_float32(engine)
        for path, use_triton in (("triton", True), ("torch", False)):
            set_kernel_backend(engine.runner.model, use_triton)
            key = f"{path}-{precision}"
            toks, lps, secs = generate(engine, prompts, key + "-")
            runs[key], seconds[key] = (toks, lps), round(secs, 2)
    rows = [_row(n, i, runs) for i, n in enumerate(prompt_lens)]
    return {"load_s": round(load_s, 1), "dtype": dtype, "seconds": seconds, "rows": rows}


def _agreement(a, b):
    """(tokens agreeing before the first difference, max |logprob diff| over them, b's top-2 margin there)."""
    (ta, la), (tb, lb) = a, b
    split = next((i for i, (x, y) in enumerate(zip(ta, tb)) if x != y), None)
    n = len(ta) if split is None else split
    diff = max((abs(x.logprob - y.logprob) for x, y in zip(la[:n], lb[:n])), default=0.0)
    margin = None if split is None else lb[split].top[0][1] - lb[split].top[1][1]
    return n, diff, margin


def _row(prompt_tokens: int, i: int, runs: dict) -> dict:
    pick = {k: (v[0][i], v[1][i]) for k, v in runs.items()}
    row = {"prompt_tokens": prompt_tokens}
    for name, a, b in (("fp32_triton_vs_torch", "triton-fp32", "torch-fp32"),
                       ("half_triton_vs_torch", "triton-half", "torch-half"),
                       ("half_triton_vs_fp32", "triton-half", "torch-fp32"),
                       ("half_torch_vs_fp32", "torch-half", "torch-fp32")):
        n, diff, margin = _agreement(pick[a], pick[b])
        row[name] = {"agree": n, "max_logprob_diff": round(diff, 5),
                     "margin_at_split": None if margin is None else round(margin, 5)}
    return row


def env_info(commit: str) -> dict:
    import torch
    import triton

    try:
        smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                             capture_output=True, text=True).stdout.strip()
    except FileNotFoundError:
        smi = "no nvidia-smi"
    return {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "gpu": smi, "torch": torch.__version__, "cuda": torch.version.cuda, "triton": triton.__version__,
            "python": sys.version.split()[0], "commit": commit}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=".")
    parser.add_argument("--commit", default="unknown")
    parser.add_argument("--skip-tests", action="store_true")
    parser.add_argument("--small", action="store_true", help="a small model, for a dry run on CPU")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    result = {"env": env_info(args.commit)}
    print(json.dumps(result["env"]), flush=True)
    result["tests"] = {} if args.skip_tests else run_pytest(out)
    print(json.dumps(result["tests"]), flush=True)
    try:
        if args.small:
            small = {**QWEN25_7B, "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2,
                     "num_attention_heads": 4, "num_key_value_heads": 1, "vocab_size": 1000}
            result["qwen7b"] = compare_7b(small, [5, 40, 70], dtype="float16")  # interpreter bf16 dots are wrong
        else:
            result["qwen7b"] = compare_7b(QWEN25_7B, PROMPT_LENS)
    except Exception as e:  # report, do not lose the test results above
        import traceback

        traceback.print_exc()
        result["qwen7b"] = {"error": repr(e)}
    (out / "gpu_check.json").write_text(json.dumps(result, indent=2))
    print_table(result)


def print_table(result: dict) -> None:
    t = result["tests"]
    print("\n| check | result |\n| --- | --- |")
    if t:
        print(f"| pytest (kernels bf16/fp16, oracle fp32, Triton engine) | {t.get('tests')} tests, "
              f"{t.get('failures')} failed, {t.get('errors')} errors, {t.get('skipped')} skipped, {t.get('seconds')} s |")
    q = result["qwen7b"]
    if "error" in q:
        print(f"| Qwen2.5-7B-shaped dummy | ERROR {q['error']} |")
        return
    print(f"| 7B dummy ({q['dtype']}): wall seconds per run (eager, not a benchmark) | {q['seconds']} |")
    for r in q["rows"]:
        cells = []
        for name, label in (("fp32_triton_vs_torch", "fp32 Triton=torch"), ("half_triton_vs_torch", "half Triton=torch"),
                            ("half_triton_vs_fp32", "half Triton=fp32"), ("half_torch_vs_fp32", "half torch=fp32")):
            c = r[name]
            split = "" if c["margin_at_split"] is None else f" (split, margin {c['margin_at_split']:.4f})"
            cells.append(f"{label} {c['agree']}/{MAX_TOKENS} dlp {c['max_logprob_diff']:.4f}{split}")
        print(f"| 7B dummy greedy, prompt {r['prompt_tokens']} tok | {'; '.join(cells)} |")

if __name__ == "__main__":
    main()
