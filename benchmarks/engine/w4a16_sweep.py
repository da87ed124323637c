#!/usr/bin/env python3
"""The batched 4-bit (W4A16, AWQ layout, groups of 128) GEMM paths on the Qwen2.5-7B projections, per batch size:
bf16 cuBLAS on the same shape (what the 4-bit weight should beat), the weight dequantized then cuBLAS ("dequant",
kernels/dequant_gemm.py DEQUANT), and the fused kernels over a sweep of their launch configs ("fused", the fastest
of them): the Triton GEMM that takes one dot a nibble position (NIBBLES 1) and, on Hopper, the Gluon GEMM on the
warpgroup MMA (WGMMA 1, kernels/w4a16_hopper.py, the tuner's grid for it, its weight tile in shared memory or,
REGS 1, in the MMA's registers). Prints one JSON row a projection and batch; with --table, the entries for
kernels/tuned_configs.json: `w4a16_gemm` per projection shape and batch bucket, the fastest fused config (that of
the bucket's largest batch measured) where it beat the dequantizing path at every batch measured in the bucket,
else DEQUANT. Each launch of a timed graph reads the next of several weight copies (three times the L2 together), so
every launch reads its weight from memory, as a model's step does.

Example: python benchmarks/engine/w4a16_sweep.py --out /tmp/w4a16.json --table --precompile 14
         python benchmarks/engine/w4a16_sweep.py --batches 64 --projections gate_up --tiles 32x2 64x4
         python benchmarks/engine/w4a16_sweep.py --kernels regs --batches 128 256 --hopper-split-k 1 2 4 \
             --hopper-block-k 128 --table --precompile 14
"""

from __future__ import annotations

import argparse
import itertools
from dataclasses import dataclass

if not __package__:  # run as a file: this checkout's packages, importable (_checkout.py)
    import _checkout  # noqa: F401

import torch  # noqa: E402
import triton  # noqa: E402

from benchmarks.engine.common import per_launch_us  # noqa: E402
from benchmarks.engine.fp8_gemm_sweep import LAUNCHES, _copies, run_sweep, sweep_arguments  # noqa: E402
from hosttune_engine.kernels.dequant_gemm import hopper_gemm_runs  # noqa: E402
from hosttune_engine.tuner.candidates import wgmma_gemm  # noqa: E402

GROUP = 128
BATCHES = (8, 16, 32, 64, 128)


@dataclass(frozen=True)
class Axes:
    """The launch-config values swept, every combination of them. tiles: (BLOCK_N, num_warps), BLOCK_N the weight
    rows a program (fewer than 64, which Hopper runs on Ampere's MMA, lost everywhere in the first sweeps: each
    program reads all of x, so the activations' traffic grows as the tiles shrink)."""
    tiles: tuple = ((64, 4), (128, 4), (128, 8), (256, 8))
    block_k: tuple = (128, 256)
    stages: tuple = (3, 4)
    split_k: tuple = (1, 2, 4)
    swap: tuple = (1, 0)  # 1: the weights the MMA's register operand (W x^T); 0: both from shared memory (x W^T)
    # wgmma: the Hopper GEMM's tile in shared memory, regs: in the MMA's registers (REGS 1); only where they run
    # (an sm_90 GPU, a Triton with Gluon)
    kernels: tuple = ("nibbles", "wgmma", "regs")
    # the Hopper GEMM's grid narrowed to these SPLIT_K and BLOCK_K values (None: its whole grid)
    hopper_split_k: tuple | None = None
    hopper_block_k: tuple | None = None


def configs(m: int, axes: Axes = Axes(), hopper: bool = False):
    block_m = max(16, min(128, 1 << (m - 1).bit_length()))
    if "nibbles" in axes.kernels:
        for (bn, warps), bk, stages, split, swap in itertools.product(axes.tiles, axes.block_k, axes.stages,
                                                                      axes.split_k, axes.swap):
            if swap == 0 and block_m < 64:  # the warpgroup MMA's first dimension is 64 rows: x's would be padding
                continue
            yield {"NIBBLES": 1, "SWAP": swap, "BLOCK_M": block_m, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": 8,
                   "SPLIT_K": split, "num_warps": warps, "num_stages": stages}
    if hopper:
        yield from (c for c in wgmma_gemm(m) if ("regs" if c["REGS"] else "wgmma") in axes.kernels
                    and c["SPLIT_K"] in (axes.hopper_split_k or (c["SPLIT_K"],))
                    and c["BLOCK_K"] in (axes.hopper_block_k or (c["BLOCK_K"],)))


def weight(n: int, k: int, seed: int, device: str = "cuda"):
    """A random 4-bit weight in the kernels' layout: (qweight, scales, zeros)."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randint(0, 16, (n, k // 8), generator=g, dtype=torch.int64)
    words = (q * 0x11111111) & 0xFFFFFFFF  # every nibble of a word the same value: any value will do for timing
    words = torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)
    scales = (torch.rand(n, k // GROUP, generator=g) * 0.02).to(torch.float16)
    zeros = torch.randint(0, 16, (n, k // GROUP), generator=g).to(torch.uint8)
    return tuple(t.to(device).contiguous() for t in (words, scales, zeros))


def measure(m: int, n: int, k: int, axes: Axes = Axes()) -> dict:
    from hosttune_engine.kernels.dequant_gemm import w4a16_gemm
    from hosttune_engine.kernels.int4_gemv import int4_gemv_ref

    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    weights = [weight(n, k, i) for i in range(_copies(n * k // 2))]
    dense = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) for _ in range(_copies(n * k * 2))]
    row = {"m": m, "n": n, "k": k, "weight_copies": len(weights)}

    def launches(fn, copies):
        calls = itertools.cycle(copies)
        return per_launch_us(lambda: fn(next(calls)), LAUNCHES)

    row["bf16_us"] = launches(lambda w: torch.nn.functional.linear(x, w), dense)
    del dense
    row["dequant_us"] = launches(lambda w: w4a16_gemm(x, *w, None, GROUP, config={"DEQUANT": 1}), weights)
    swept = []
    for i, c in enumerate(configs(m, axes, hopper_gemm_runs(x.device))):
        try:
            swept.append((launches(lambda w: w4a16_gemm(x, *w, None, GROUP, config=c), weights), i, c))
        except triton.runtime.errors.OutOfResources:  # too much shared memory or too many registers
            continue
    swept.sort()
    row["fused_us"], _, row["config"] = swept[0]
    row["runners_up"] = [{"us": us, "config": c} for us, _, c in swept[1:4]]
    want = int4_gemv_ref(x, *weights[0], None, GROUP).float()
    got = w4a16_gemm(x, *weights[0], None, GROUP, config=row["config"]).float()
    row["rel_error"] = ((got - want).norm() / want.norm()).item()
    return row


def _compile(m: int, n: int, k: int, cfg: dict) -> None:
    from hosttune_engine.kernels.dequant_gemm import w4a16_gemm

    w4a16_gemm(torch.randn(m, k, device="cuda", dtype=torch.bfloat16), *weight(n, k, 0), None, GROUP, config=cfg)


def table(rows: list[dict]) -> dict:
    """tuned_configs.json entries (bf16 activations) per projection shape and the kernel plan's row bucket (256
    rows: le256, the decode steps of 129-256 rows)."""
    from hosttune_engine.plan.kinds import row_bucket

    groups: dict = {}
    for r in rows:
        groups.setdefault(f"bfloat16-{row_bucket(r['m']).table}-{r['n']}x{r['k']}", []).append(r)
    return {"w4a16_gemm": {key: dict(max(rs, key=lambda r: r["m"])["config"])
                           if all(r["fused_us"] < r["dequant_us"] for r in rs) else {"DEQUANT": 1}
                           for key, rs in groups.items()}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sweep_arguments(parser, "w4a16-sweep.json", BATCHES, Axes.block_k, Axes.stages)
    parser.add_argument("--tiles", nargs="+", default=[f"{n}x{w}" for n, w in Axes.tiles], metavar="NxW",
                        help="(BLOCK_N, num_warps) pairs, as BLOCK_NxWARPS")
    parser.add_argument("--split-k", type=int, nargs="+", default=list(Axes.split_k), help="SPLIT_K values")
    parser.add_argument("--swap", type=int, nargs="+", default=list(Axes.swap), choices=(0, 1), help="SWAP values")
    parser.add_argument("--kernels", nargs="+", default=list(Axes.kernels), choices=Axes.kernels,
                        help="the fused kernels swept (wgmma, regs: the Hopper GEMM's tuner grid without and with "
                             "REGS, on Hopper only)")
    parser.add_argument("--hopper-split-k", type=int, nargs="+", help="only the Hopper GEMM's configs of these "
                        "SPLIT_K values (default: its whole grid)")
    parser.add_argument("--hopper-block-k", type=int, nargs="+", help="only the Hopper GEMM's configs of these "
                        "BLOCK_K values (default: its whole grid)")
    args = parser.parse_args()
    tiles = tuple(tuple(int(v) for v in t.split("x")) for t in args.tiles)
    axes = Axes(tiles, tuple(args.block_k), tuple(args.stages), tuple(args.split_k), tuple(args.swap),
                tuple(args.kernels), args.hopper_split_k and tuple(args.hopper_split_k),
                args.hopper_block_k and tuple(args.hopper_block_k))
    # the configs --precompile compiles: the Hopper GEMM's too where it runs, as measure() times them
    hopper = hopper_gemm_runs(torch.device("cuda"))
    run_sweep(args, axes, lambda m, a: configs(m, a, hopper), measure, table, _compile)


if __name__ == "__main__":
    main()
