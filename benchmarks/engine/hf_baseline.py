#!/usr/bin/env python3
"""Hugging Face transformers on the same Qwen2.5-7B shape (random bf16 weights, SDPA attention):
`generate` at batch 1, and continuous batching `generate_batch` on whole workloads (all requests at once).

Run as a subprocess by run_all.py under a time limit; it rewrites --out after every stage, so a
run cut short still reports what finished. Example:
python benchmarks/engine/hf_baseline.py --out /tmp/hf.json --workload 256:1024:128 --workload 256:256:512
"""

from __future__ import annotations

import argparse
import inspect
import json
import time
import traceback
from pathlib import Path

if not __package__:  # run as a file: this checkout's packages, importable (_checkout.py)
    import _checkout  # noqa: F401

from benchmarks.engine.common import QWEN25_7B, sync


def build_model():
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.for_model("qwen2", **{k: v for k, v in QWEN25_7B.items() if k not in ("architectures", "model_type")})
    torch.set_default_dtype(torch.bfloat16)
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa")
    return model.eval()


def generate_batch1(model, prompt_len: int, new_tokens: int) -> dict:
    import torch

    ids = torch.randint(0, QWEN25_7B["vocab_size"], (1, prompt_len), device="cuda")
    kw = {"do_sample": False, "pad_token_id": 0}
    model.generate(ids, max_new_tokens=4, min_new_tokens=4, **kw)  # warm-up
    sync()
    t0 = time.perf_counter()
    out = model.generate(ids, max_new_tokens=new_tokens, min_new_tokens=new_tokens, **kw)
    sync()
    seconds = time.perf_counter() - t0
    n = out.shape[1] - prompt_len
    return {"prompt_tokens": prompt_len, "new_tokens": n, "seconds": seconds, "tok_s": n / seconds}


def generate_batch_cb(model, n_req: int, n_in: int, n_out: int) -> dict:
    import torch
    from transformers import GenerationConfig

    if not hasattr(model, "generate_batch"):
        return {"error": "this transformers has no generate_batch"}
    gen = torch.Generator().manual_seed(1)
    inputs = torch.randint(0, QWEN25_7B["vocab_size"], (n_req, n_in), generator=gen).tolist()
    params = inspect.signature(model.generate_batch).parameters

    def config(max_new):
        return GenerationConfig(max_new_tokens=max_new, min_new_tokens=max_new, do_sample=False, pad_token_id=0,
                                eos_token_id=QWEN25_7B["eos_token_id"])
    model.generate_batch(inputs=inputs[:2], generation_config=config(2))  # warm-up (graphs, allocator)
    sync()
    kw = {"progress_bar": False} if "progress_bar" in params else {}
    t0 = time.perf_counter()
    results = model.generate_batch(inputs=inputs, generation_config=config(n_out), **kw)
    sync()
    seconds = time.perf_counter() - t0
    tokens = sum(len(getattr(r, "generated_tokens", []) or []) for r in results.values())
    return {"requests": n_req, "in": n_in, "out": n_out, "seconds": seconds, "output_tokens": tokens,
            "output_tok_s": tokens / seconds}


def workload(text: str) -> tuple[int, int, int]:
    """REQUESTS:IN:OUT, e.g. 256:1024:128."""
    try:
        n_req, n_in, n_out = (int(x) for x in text.split(":"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected REQUESTS:IN:OUT such as 256:1024:128, got {text!r}") from None
    return n_req, n_in, n_out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--prompt", type=int, default=128)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--workload", type=workload, action="append", default=[],
                        help="REQUESTS:IN:OUT for generate_batch; repeat for several (default 256:1024:128)")
    args = parser.parse_args()
    out, result = Path(args.out), {"generate_batch_cb": []}
    t0 = time.perf_counter()
    model = build_model()
    result["load_s"] = time.perf_counter() - t0
    stages = [("generate_batch1", lambda: generate_batch1(model, args.prompt, args.new_tokens))]
    workloads = args.workload or [(256, 1024, 128)]
    stages += [("generate_batch_cb", lambda w=w: generate_batch_cb(model, *w)) for w in workloads]
    for name, fn in stages:
        try:
            row = fn()
        except Exception as e:  # report, and still try the next stage
            traceback.print_exc()
            row = {"error": f"{type(e).__name__}: {e}"[:500]}
        if name == "generate_batch_cb":
            result[name].append(row)
        else:
            result[name] = row
        out.write_text(json.dumps(result, indent=1))
        print(name, row, flush=True)


if __name__ == "__main__":
    main()
