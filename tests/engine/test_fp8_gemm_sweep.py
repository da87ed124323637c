"""The FP8 GEMM sweep's table rule (benchmarks/engine/fp8_gemm_sweep.py), on made-up measurements: the
Triton GEMM where it beat both cuBLAS paths at every batch of a bucket, with the config of the bucket's
largest batch, and SWIGLU 1 where the fused SwiGLU was faster at every one of them too."""

import pytest

from benchmarks.engine import fp8_gemm_sweep as bench

CFG16, CFG32, CFG64 = ({"BLOCK_M": m, "BLOCK_N": 64} for m in (16, 32, 64))


@pytest.fixture
def sweep():
    return bench


def _row(m, n, triton, unit=10.0, rowwise=20.0, cfg=None, fused=None, apart=None):
    row = {"m": m, "n": n, "k": 3584, "triton_us": triton, "unit_us": unit, "rowwise_us": rowwise, "config": cfg}
    if fused is not None:
        row.update(swiglu_fused_us=fused, swiglu_apart_us=apart)
    return row


def test_table_takes_the_triton_gemm_where_it_won_every_batch_and_fuses_swiglu_where_that_won_too(sweep):
    rows = [_row(16, 37888, 9.0, cfg=CFG16, fused=12.0, apart=11.0),  # le32: fused slower at 16 rows
            _row(32, 37888, 9.5, cfg=CFG32, fused=10.0, apart=11.0),
            _row(64, 37888, 9.0, cfg=CFG64, fused=10.0, apart=11.0),  # le64: fused faster
            _row(64, 4608, 11.0, cfg=CFG64),  # cuBLAS with unit scales faster: no entry
            _row(64, 3584, 9.0, cfg=CFG64)]  # no SwiGLU after it: no SWIGLU key
    table = sweep.table(rows)
    assert table["fp8_mm"] == {"bfloat16-le32-37888x3584": {"METHOD": "triton"},
                               "bfloat16-le64-37888x3584": {"METHOD": "triton"},
                               "bfloat16-le64-3584x3584": {"METHOD": "triton"}}
    assert table["fp8_gemm"] == {"bfloat16-le32-37888x3584": CFG32, "bfloat16-le64-37888x3584": {**CFG64, "SWIGLU": 1},
                                 "bfloat16-le64-3584x3584": CFG64}
    assert "SWIGLU" not in CFG64  # the rows' configs are not changed


def test_configs_sweep_every_combination_of_the_axes(sweep):
    axes = sweep.Axes(block_n=(32, 64), block_k=(256, 512), stages=(3,), warps=(4, 8), fast_acc=(1,))
    cfgs = list(sweep.configs(64, axes))
    assert len(cfgs) == 2 * 2 * 2 and len({tuple(sorted(c.items())) for c in cfgs}) == 8
    assert all(c["BLOCK_M"] == 64 and c["FAST_ACC"] == 1 for c in cfgs) and {c["num_warps"] for c in cfgs} == {4, 8}
    assert [c["BLOCK_M"] for c in sweep.configs(5, axes)][:1] == [16]  # the smallest FP8 dot tile


def test_only_gate_up_with_tiles_of_32_or_more_is_timed_with_swiglu(sweep):
    n, k = sweep.PROJECTIONS["gate_up"]
    assert sweep.takes_swiglu(n, k, {"BLOCK_N": 32}) and not sweep.takes_swiglu(n, k, {"BLOCK_N": 16})
    assert not any(sweep.takes_swiglu(*sweep.PROJECTIONS[p], {"BLOCK_N": 64}) for p in ("qkv", "o", "down"))
