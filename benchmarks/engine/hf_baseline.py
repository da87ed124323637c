#!/usr/bin/env python3
"""Hugging Face transformers on the same Qwen2.5-7B shape (random bf16 weights, SDPA attention):
`generate` at batch 1, and continuous batching `generate_batch` on a slice of a workload.

Run as a subprocess by run_all.py under a time limit; it rewrites --out after every stage, so a
run cut short still reports what finished. Example:
python benchmarks/engine/hf_baseline.py --out /tmp/hf.json --cb-requests 32 --cb-in 1024 --cb-out 32
"""

from __future__ import annotations

import argparse
import inspect
import json
import time
import traceback
from pathlib import Path

from common import QWEN25_7B, sync


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--prompt", type=int, default=128)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--cb-requests", type=int, default=32)
    parser.add_argument("--cb-in", type=int, default=1024)
    parser.add_argument("--cb-out", type=int, default=32)
    args = parser.parse_args()
    out, result = Path(args.out), {}
    t0 = time.perf_counter()
    model = build_model()
    result["load_s"] = time.perf_counter() - t0
    for name, fn in (("generate_batch1", lambda: generate_batch1(model, args.prompt, args.new_tokens)),
                     ("generate_batch_cb", lambda: generate_batch_cb(model, args.cb_requests, args.cb_in, args.cb_out))):
        try:
            result[name] = fn()
        except Exception as e:  # report, and still try the next stage
            traceback.print_exc()
            result[name] = {"error": f"{type(e).__name__}: {e}"[:500]}
        out.write_text(json.dumps(result, indent=1))
        print(name, result[name], flush=True)


if __name__ == "__main__":
    main()
