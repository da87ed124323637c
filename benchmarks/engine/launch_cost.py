#!/usr/bin/env python3
"""Host time of one call of each engine kernel wrapper, the part an eager prefill step pays per launch.

An eager step (every prefill) launches about 250 kernels. When the prompt is short, the GPU finishes them
faster than Python enqueues them, and the step's time is the host's. This times N calls back to back with
no sync in between, on inputs small enough that the GPU never holds the host back (the queue stays short),
and reports host microseconds per call next to `F.linear` on the same inputs (the floor of a launch through
torch) and a bare Triton kernel of one argument (the floor of a Triton launch). With --profile, the top
functions of the slowest wrapper by cProfile.
Example: PYTHONPATH=engine python benchmarks/engine/launch_cost.py --calls 2000
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import time
from pathlib import Path

import torch
import torch.nn.functional as F
import triton

if not __package__:  # run as a file: this checkout's packages, importable (_checkout.py)
    import _checkout  # noqa: F401

from benchmarks.engine.common import SHAPE
from hosttune_engine.kernels.decode_attention import decode_attention
from hosttune_engine.kernels.prefill_attention import prefill_attention
from hosttune_engine.kernels.rmsnorm import rms_norm
from hosttune_engine.kernels.rope_kv import rope_kv_write
from hosttune_engine.kernels.swiglu import swiglu
from hosttune_engine.layers.rotary import rope_cos_sin

DEV, DT, PAGE = "cuda", torch.bfloat16, 16
HQ, HKV, D = SHAPE.heads, SHAPE.kv_heads, SHAPE.head_dim


@triton.jit
def _empty_kernel(x_ptr):
    pass


def wrappers(tokens: int) -> dict:
    """name -> a no-argument call of that wrapper on a prompt of `tokens` tokens laid out as the engine has it."""
    h = SHAPE.hidden
    x, r = (torch.randn(tokens, h, device=DEV, dtype=DT) for _ in range(2))
    w = torch.ones(h, device=DEV, dtype=DT)
    lin = torch.randn(256, h, device=DEV, dtype=DT)
    qkv = torch.randn(tokens, HQ + 2 * HKV, D, device=DEV, dtype=DT)
    q, k, v = qkv.split([HQ, HKV, HKV], dim=1)
    blocks = -(-tokens // PAGE)
    kc = torch.zeros(blocks, PAGE, HKV, D, device=DEV, dtype=DT)
    vc = torch.zeros_like(kc)
    bt = torch.arange(blocks, device=DEV, dtype=torch.int32)[None]
    cu = torch.tensor([0, tokens], dtype=torch.int32, device=DEV)
    lens = torch.tensor([tokens], dtype=torch.int32, device=DEV)
    cos_sin = rope_cos_sin(D, 32768, 1e6).to(DEV)
    pos = torch.arange(tokens, device=DEV, dtype=torch.int32)
    slots = torch.arange(tokens, device=DEV, dtype=torch.int32)
    gate_up = torch.randn(tokens, 2 * 64, device=DEV, dtype=DT)
    return {
        "bare Triton launch": lambda: _empty_kernel[(1,)](x),
        "F.linear (torch)": lambda: F.linear(x, lin),
        "rms_norm + residual": lambda: rms_norm(x, w, 1e-6, residual=r),
        "rope_kv_write": lambda: rope_kv_write(qkv.view(tokens, -1), pos, cos_sin, kc, vc, slots, HQ, HKV),
        "prefill_attention (contiguous)": lambda: prefill_attention(q, kc, vc, cu, lens, bt, tokens,
                                                                    contiguous=True, k=k, v=v),
        "prefill_attention (paged)": lambda: prefill_attention(q, kc, vc, cu, lens, bt, tokens),
        "swiglu": lambda: swiglu(gate_up),
        "decode_attention (b1)": lambda: decode_attention(q[:1], kc, vc, bt, lens),
    }


def host_us(fn, calls: int) -> float:
    """Host microseconds per call over `calls` back-to-back calls (after a warm-up that compiles)."""
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    elapsed = time.perf_counter() - t0
    torch.cuda.synchronize()
    return elapsed / calls * 1e6


def profile_top(fn, calls: int, top: int = 14) -> str:
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        fn()
    prof.disable()
    torch.cuda.synchronize()
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(top)
    return out.getvalue()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--tokens", type=int, default=16, help="prompt tokens (small: the GPU keeps up)")
    parser.add_argument("--profile", action="store_true", help="cProfile the slowest wrapper")
    parser.add_argument("--out", default="launch_cost.json")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("launch_cost.py needs a CUDA GPU")
    calls = wrappers(args.tokens)
    rows = [{"call": name, "host_us": host_us(fn, args.calls)} for name, fn in calls.items()]
    result = {"tokens": args.tokens, "calls": args.calls, "rows": rows}
    if args.profile:
        slowest = max(rows[2:], key=lambda r: r["host_us"])["call"]
        result["profile"] = {slowest: profile_top(calls[slowest], args.calls)}
        print(result["profile"][slowest])
    Path(args.out).write_text(json.dumps(result, indent=1))
    print("| call | host µs per call |\n| --- | --- |")
    for r in rows:
        print(f"| {r['call']} | {r['host_us']:.1f} |")


if __name__ == "__main__":
    main()
