#!/usr/bin/env python3
"""FP8 decode at one batch size with the RMSNorm / SwiGLU per-token quantization fused into one kernel (the
engine's default) and without it (each norm and SwiGLU, then quantize_per_token), beside quant_bench.py's FP8
linear-layer floor, on the Qwen2.5-7B-shaped dummy model (FP8 quantized at load). Also the activation
kernels alone at that batch: the fused ones against the pair each replaces.

Example: python benchmarks/engine/fp8_fused_inputs.py --batch 64 --out /tmp/fp8-fused.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

if not __package__:  # run as a file: this checkout's packages, importable (_checkout.py)
    import _checkout  # noqa: F401

import torch  # noqa: E402

from benchmarks.engine.common import QWEN25_7B, per_launch_us  # noqa: E402
from benchmarks.engine.quant_bench import Plan, build, fp8_linear_floor  # noqa: E402


def decode_row(batch: int, fused: bool) -> dict:
    from benchmarks.engine import engine_bench as eb
    from hosttune_engine.planner import prepare

    keep = prepare.apply_plan
    if not fused:  # the model on its plan without fusion: every projection quantizes its own input
        prepare.apply_plan = lambda model, plan: keep(model, plan.unfused())
    try:
        engine = build(Plan(), "fp8")
    finally:
        prepare.apply_plan = keep
    row = {"fused": fused, **eb.decode_rate(engine, batch), **fp8_linear_floor(engine.runner.model, batch)}
    row["ratio_vs_floor"] = row["tok_s"] / (batch / row["floor_ms"] * 1e3)
    del engine
    torch.cuda.empty_cache()
    return row


def kernel_rows(batch: int, launches: int = 28) -> dict:
    """Microseconds per launch at `batch` rows, 7B shapes (hidden 3584, intermediate 18944), bf16: `launches`
    launches in one graph (one layer's worth of a 28-layer step each), so the replay's own cost is shared."""
    from hosttune_engine.kernels.fp8_inputs import rms_norm_fp8, swiglu_fp8
    from hosttune_engine.kernels.fp8_scaled_mm import quantize_per_token
    from hosttune_engine.kernels.rmsnorm import rms_norm
    from hosttune_engine.kernels.swiglu import swiglu

    h, inter = QWEN25_7B["hidden_size"], QWEN25_7B["intermediate_size"]
    x, r = (torch.randn(batch, h, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    w, r_out = torch.ones(h, device="cuda", dtype=torch.bfloat16), torch.empty_like(x)
    gate_up = torch.randn(batch, 2 * inter, device="cuda", dtype=torch.bfloat16)
    cases = {
        "rms_norm_residual+quantize": lambda: quantize_per_token(rms_norm(x, w, 1e-6, residual=r)[0]),
        "rms_norm_fp8_residual": lambda: rms_norm_fp8(x, w, 1e-6, r, r_out),
        "swiglu+quantize": lambda: quantize_per_token(swiglu(gate_up)),
        "swiglu_fp8": lambda: swiglu_fp8(gate_up),
    }
    return {name: per_launch_us(fn, launches) for name, fn in cases.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--out", default="fp8-fused-inputs.json")
    args = parser.parse_args()
    res = {"kernels_us": kernel_rows(args.batch)}
    print(json.dumps(res["kernels_us"]), flush=True)
    res["decode"] = []
    for fused in (True, False):
        res["decode"].append(decode_row(args.batch, fused))
        print(json.dumps(res["decode"][-1], default=str), flush=True)
    Path(args.out).write_text(json.dumps(res, indent=1, default=str))


if __name__ == "__main__":
    main()
