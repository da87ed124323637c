"""The W4A16 GEMM sweep (benchmarks/engine/w4a16_sweep.py) on made-up measurements: the nibble kernel's config
(of the bucket's largest batch) where it beat the dequantizing path at every batch of a bucket, else DEQUANT;
and its configs (the Hopper kernel's only where it runs) and timing weights."""

import pytest
import torch

from benchmarks.engine import w4a16_sweep as bench

CFG16, CFG32 = ({"NIBBLES": 1, "BLOCK_M": m, "BLOCK_N": 128} for m in (16, 32))


@pytest.fixture
def sweep():
    return bench


def _row(m, n, nibbles, dequant, cfg):
    return {"m": m, "n": n, "k": 3584, "fused_us": nibbles, "dequant_us": dequant, "config": cfg}


def test_table_takes_the_nibble_kernel_only_where_it_won_every_batch_of_a_bucket(sweep):
    rows = [_row(16, 37888, 50.0, 190.0, CFG16), _row(32, 37888, 60.0, 191.0, CFG32),  # le32: won both
            _row(16, 4608, 9.0, 20.0, CFG16), _row(32, 4608, 25.0, 21.0, CFG32)]  # le32: lost at 32 rows
    assert sweep.table(rows) == {"w4a16_gemm": {"bfloat16-le32-37888x3584": CFG32,
                                                "bfloat16-le32-4608x3584": {"DEQUANT": 1}}}


def test_table_keys_256_rows_by_the_decode_bucket_and_more_by_prefills():
    whole = {"WGMMA": 1, "REGS": 1, "BLOCK_M": 256, "BLOCK_N": 128}
    rows = [_row(256, 37888, 160.0, 260.0, whole), _row(1024, 37888, 1600.0, 880.0, CFG32)]
    assert bench.table(rows) == {"w4a16_gemm": {"bfloat16-le256-37888x3584": whole,
                                                "bfloat16-gt128-37888x3584": {"DEQUANT": 1}}}


def test_configs_sweep_every_combination_with_a_row_tile_for_the_batch(sweep):
    axes = sweep.Axes(tiles=((32, 2), (64, 4)), block_k=(128,), stages=(2, 3), split_k=(1, 2), swap=(1, 0))
    cfgs = list(sweep.configs(40, axes))
    assert len({tuple(sorted(c.items())) for c in cfgs}) == 16 and all(c["NIBBLES"] == 1 for c in cfgs)
    assert len(list(sweep.configs(20, axes))) == 8  # x's rows too few to lead the MMA: the weights lead
    assert {c["BLOCK_M"] for c in cfgs} == {64}
    assert {(c["BLOCK_N"], c["num_warps"]) for c in cfgs} == {(32, 2), (64, 4)}
    assert {c["BLOCK_M"] for c in sweep.configs(5, axes)} == {16}  # the smallest dot tile
    assert {c["BLOCK_M"] for c in sweep.configs(500, axes)} == {128}  # the largest swept
    on_hopper = list(sweep.configs(40, axes, hopper=True))
    assert on_hopper[:16] == cfgs and on_hopper[16:] and all(c["WGMMA"] == 1 for c in on_hopper[16:])
    assert not list(sweep.configs(40, sweep.Axes(kernels=("nibbles",)), hopper=True))[-1].get("WGMMA")
    regs = list(sweep.configs(40, sweep.Axes(kernels=("regs",)), hopper=True))
    assert regs and all(c["WGMMA"] == 1 and c["REGS"] == 1 for c in regs)
    narrowed = list(sweep.configs(256, sweep.Axes(kernels=("regs",), hopper_split_k=(1, 4), hopper_block_k=(128,)),
                                  hopper=True))
    assert narrowed and {(c["SPLIT_K"], c["BLOCK_K"]) for c in narrowed} == {(1, 128), (4, 128)}
    assert any(c.get("OVERLAP") for c in narrowed) and any(c["BLOCK_M"] == 256 for c in narrowed)


def test_timing_weights_are_in_the_kernels_layout(sweep):
    from hosttune_engine.kernels.int4_layout import check_int4_weight

    q, s, z = sweep.weight(64, 512, seed=0, device="cpu")
    check_int4_weight(q, s, z, None, sweep.GROUP, 512, q.device)
    nibbles = (q[:, :, None] >> torch.arange(0, 32, 4, dtype=torch.int32)) & 0xF
    assert (nibbles == nibbles[:, :, :1]).all() and len(torch.unique(nibbles)) > 1
