"""The quantized benchmark rows (benchmarks/engine/quant_bench.py) measured end to end on a tiny model on
the CPU: every row is produced, with its floor and ratio."""

import pytest

from benchmarks.engine import quant_bench as bench

from .conftest import HAS_CUDA

TINY = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 128, "intermediate_size": 256,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 1, "vocab_size": 152064,
        "max_position_embeddings": 512, "torch_dtype": "float32"}


@pytest.fixture
def quant_bench():
    return bench


@pytest.mark.skipif(HAS_CUDA, reason="the tiny end-to-end run is the CPU's; on a GPU the benchmark itself runs")
def test_every_row_is_measured_on_a_tiny_model(quant_bench):
    plan = quant_bench.Plan(config=TINY, engine={"dtype": "float32", "kernel_backend": "torch", "max_model_len": 256,
                                                 "num_kv_blocks": 256, "max_num_seqs": 8},
                            batch=4, small_batch=2, ttft_tokens=64, workload=(4, 32, 4), long_context=96)
    logged = []
    res = {"ceilings": {"copy_tb_s": 0.01}}
    res.update(quant_bench.bf16_rows(plan, logged.append))
    quant_bench.run_quant(res, logged.append, plan)
    fp8, awq, kv8 = res["quant"]
    assert (fp8["scheme"], awq["scheme"], kv8["scheme"]) == ("fp8", "awq", "fp8-kv8")
    assert fp8["kv_bytes_per_token"] == 2 * 2 * 1 * 32 * 4 and kv8["kv_bytes_per_token"] == 2 * 2 * 1 * (32 + 4)
    assert kv8["batched_long"]["context_max"] == fp8["batched_long"]["context_max"] > 96
    # The FP8 step reads 1 byte per projection weight (plus a scale and its index per row: 6% at K = 128) and
    # the fp32 LM head; 4-bit a half byte (plus an fp16 scale and a zero per 128).
    layer = 128 * (128 + 2 * 32) + 128 * 128 + 128 * 2 * 256 + 256 * 128
    head = 152064 * 128 * 4  # engine_bench draws prompts from the 7B vocabulary
    assert 2 * layer + head < fp8["b1"]["step_gb"] * 1e9 < 2 * layer * 1.07 + head
    assert 2 * layer / 2 + head < awq["b1"]["step_gb"] * 1e9 < 2 * layer / 2 * 1.2 + head
    assert fp8["batched"]["floor_ms"] > 0 and fp8["batched"]["ratio_vs_floor"] > 0
    assert fp8["ttft"]["ratio_vs_bf16"] > 0
    assert awq["batched"]["batch"] == 4 and awq["batched"]["tok_s"] > 0 and "ttft" not in awq
    assert all(r["batched_small"]["batch"] == 2 and r["batched_small"]["tok_s"] > 0 for r in res["quant"])
    assert all(r["throughput"]["output_tokens"] == 16 for r in res["quant"])
    for runner in (r["throughput"]["runner"] for r in res["quant"]):  # every step timed once, in one phase
        assert runner["prefill_steps"] >= 1 and runner["decode_steps"] >= 1
        assert runner["prefill_steps"] + runner["decode_steps"] == runner["graph_steps"] + runner["eager_steps"]
        assert abs(runner["prefill_s"] + runner["decode_s"] - runner["graph_s"] - runner["eager_s"]) < 1e-6
    rows = quant_bench.table_rows(res)
    assert len(rows) == 16 and all(r.count("|") == 6 for r in rows)
    assert "| fp8-kv8 decode b4, " in rows[13] and "fp8, bf16 KV" in rows[13]
    small = [r for r in rows if " decode b2 " in r]
    assert len(small) == 3 and all("| bf16 " in r and "| 0.00 |" not in r for r in small)
    bf16_b4 = next(r["tok_s"] for r in res["decode"] if r["batch"] == 4)
    assert f"| awq decode b4 | {awq['batched']['tok_s']:.0f} tok/s" in rows[8] and f"bf16 {bf16_b4:.0f}" in rows[8]
    alone = quant_bench.table_rows({"quant": res["quant"]})  # run_all --skip engine: no bf16 rows to compare
    assert len(alone) == 16 and all(r.count("|") == 6 for r in alone)
    assert not any("bf16 0 tok/s" in r or "| 0.00 |" in r for r in alone)
    assert sum("bf16 not measured in this run" in r for r in alone) == 7  # b2 and throughput each, awq b4
