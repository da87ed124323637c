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
sys.path.insert(0, str(REPO / "engine"))

QWEN25_7B = {
    "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 3584,
    "intermediate_size": 18944, "num_hidden_layers": 28, "num_attention_heads": 28, "num_key_value_heads": 4,
    "max_position_embeddings": 32768, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "vocab_size": 152064,
    "tie_word_embeddings": False, "use_sliding_window": False, "torch_dtype": "bfloat16", "eos_token_id": 151645,
}
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


def compare_7b(config: dict, prompt_lens: list[int], dtype: str = "bfloat16") -> dict:
    import torch
    from hosttune_engine import Engine, EngineConfig
    from hosttune_engine.layers.backend import set_kernel_backend

    folder = Path(tempfile.mkdtemp())
    (folder / "config.json").write_text(json.dumps(config))
    t0 = time.time()
    engine = Engine(EngineConfig(model=str(folder), load_format="dummy", dtype=dtype, kernel_backend="triton",
                                 enable_prefix_caching=False, max_num_batched_tokens=8192, max_model_len=8192,
                                 gpu_memory_utilization=0.8))  # headroom for the reference path's temporaries
    load_s = time.time() - t0
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, config["vocab_size"], (n,), generator=gen).tolist() for n in prompt_lens]
    set_kernel_backend(engine.runner.model, True)
    tri_tokens, tri_lps, tri_s = generate(engine, prompts, "triton-")
    set_kernel_backend(engine.runner.model, False)
    ref_tokens, ref_lps, ref_s = generate(engine, prompts, "torch-")
    rows = []
    for n, a, b, la, lb in zip(prompt_lens, tri_tokens, ref_tokens, tri_lps, ref_lps):
        first_diff = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
        agree = len(a) if first_diff is None else first_diff
        lp_diff = max((abs(x.logprob - y.logprob) for x, y in zip(la[:agree], lb[:agree])), default=0.0)
        margin = None
        if first_diff is not None:  # how close the reference's top two were where the paths split
            top = lb[first_diff].top
            margin = top[0][1] - top[1][1]
        rows.append({"prompt_tokens": n, "match": a == b, "tokens_agreeing": agree, "max_logprob_diff": lp_diff,
                     "ref_margin_at_split": margin})
    return {"load_s": round(load_s, 1), "kv_blocks": engine.runner.num_kv_blocks,
            "kv_tokens": engine.runner.num_kv_blocks * engine.config.block_size,
            "triton_s": round(tri_s, 2), "torch_s": round(ref_s, 2), "rows": rows}


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
    print(f"| 7B dummy: KV pool | {q['kv_blocks']} blocks = {q['kv_tokens']} tokens |")
    print(f"| 7B dummy: wall time Triton / torch ref (eager, not a benchmark) | {q['triton_s']} s / {q['torch_s']} s |")
    for r in q["rows"]:
        split = "" if r["match"] else f", split at {r['tokens_agreeing']} (ref top-2 margin {r['ref_margin_at_split']:.4f})"
        print(f"| 7B dummy greedy, prompt {r['prompt_tokens']} tok | "
              f"{'MATCH' if r['match'] else 'DIFF'} {r['tokens_agreeing']}/{MAX_TOKENS}, "
              f"max logprob diff {r['max_logprob_diff']:.4f}{split} |")


if __name__ == "__main__":
    main()
