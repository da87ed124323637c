"""Prefill attention over e4m3 paged KV caches with per-row scales (kernels/kv_quant.py) against references.

The caches are what the model writes (q's dtype), quantized by `kv_quantize_ref`.
"""

import pytest
import torch

from hosttune_engine.errors import KernelInputError
from hosttune_engine.kernels.kv_quant import kv_dequantize_ref, kv_quantize_ref, kv_round_trip_ref
from hosttune_engine.kernels.kv_write import write_kv_ref
from hosttune_engine.kernels.prefill_attention import prefill_attention, prefill_attention_ref
from .conftest import DEVICE
from .kernel_cases import DTYPES, assert_close, block_tables_for, paged_cache, randn, with_dtypes
from .test_kernels_attention import PREFILL_BATCH, SPLIT_BATCH


def fp8_prefill_case(dtype, head_dim, hq, hkv, page, seed, batch):
    """q, the model-dtype caches, their e4m3 forms, the scales and the batch's cu_seqlens_q, seq_lens, tables."""
    gen = torch.Generator().manual_seed(seed)
    qlens, ctx = [q for q, _ in batch], [c for _, c in batch]
    nblocks = sum(-(-c // page) for c in ctx) + 5
    raw = paged_cache(nblocks, page, hkv, head_dim, dtype, gen)
    (k8, k_scale), (v8, v_scale) = kv_quantize_ref(raw[0]), kv_quantize_ref(raw[1])
    q = randn(sum(qlens), hq, head_dim, dtype=dtype, gen=gen)
    cu = torch.tensor([0] + list(torch.tensor(qlens).cumsum(0)), dtype=torch.int32, device=DEVICE)
    lens = torch.tensor(ctx, dtype=torch.int32, device=DEVICE)
    return q, raw, (k8, v8), (k_scale, v_scale), (cu, lens, block_tables_for(ctx, page, nblocks, gen), max(qlens))


def run_fp8_prefill(dtype, head_dim, hq, hkv, page, seed, batch=PREFILL_BATCH, **kw):
    """The kernel's output, the reference over the e4m3 caches, and the reference over the unquantized ones."""
    q, raw, caches, scales, (cu, lens, bt, max_q) = fp8_prefill_case(dtype, head_dim, hq, hkv, page, seed, batch)
    out = prefill_attention(q, *caches, cu, lens, bt, max_q, block_m=32, kv_scales=scales, **kw)
    ref = prefill_attention_ref(q, *caches, cu, lens, bt, kv_scales=scales)
    return out, ref, prefill_attention_ref(q, *raw, cu, lens, bt)


# The interpreter's cost is per program, and the grid has one program per query head. The e4m3 read adds
# nothing that depends on the GQA ratio beyond which KV head's scales a query head reads, so two query heads
# a KV head (and three on one) prove it; test_kernels_attention covers ratios 4 and 7 on model-dtype caches.
FP8_HEADS = [(64, 4, 2), (128, 3, 1)]


@pytest.mark.parametrize("dtype,head_dim,hq,hkv,page,block_n", with_dtypes(FP8_HEADS, [(16, 64), (32, 32)]))
def test_fp8_prefill_attention_matches_ref(dtype, head_dim, hq, hkv, page, block_n):
    """Ragged, chunked and prefix-hit sequences; key tiles across pages and inside one page."""
    out, ref, _ = run_fp8_prefill(dtype, head_dim, hq, hkv, page, seed=hq * head_dim + page, block_n=block_n)
    assert_close(out, ref, dtype, scale=2)


@pytest.mark.parametrize("dtype,head_dim,hq,hkv", with_dtypes(FP8_HEADS))
def test_fp8_prefill_split_k_matches_ref(dtype, head_dim, hq, hkv):
    """Chunks after cached prefixes, split over their keys in three. (One split is the unsplit kernel that
    test_fp8_prefill_attention_matches_ref runs on prefix hits off the page grid.)"""
    out, ref, _ = run_fp8_prefill(dtype, head_dim, hq, hkv, 16, seed=head_dim + 3, batch=SPLIT_BATCH,
                                  block_n=16, num_splits=3)
    assert torch.isfinite(out.float()).all()
    assert_close(out, ref, dtype, scale=2)


def test_fp8_prefill_is_close_to_the_unquantized_caches():
    """e4m3 with one scale a row loses little: the output stays near attention over the model-dtype caches."""
    out, ref, exact = run_fp8_prefill(DTYPES[1], 128, 4, 2, 16, seed=5, block_n=32)
    err = (out.float() - exact.float()).abs()  # an element's rounding is up to max|row| / 28
    assert err.max().item() < 0.05 * exact.float().abs().max().item() and err.mean().item() < 0.02, err.max()
    # and the difference is the cache's rounding, not the kernel's
    assert (ref.float() - exact.float()).abs().max().item() > 10 * (out.float() - ref.float()).abs().max().item()


def test_fp8_prefill_ref_dequantizes_the_caches():
    q, _, caches, scales, (cu, lens, bt, _) = fp8_prefill_case(torch.float32, 32, 4, 2, 16, 3, SPLIT_BATCH)
    dense = [kv_dequantize_ref(c, s) for c, s in zip(caches, scales)]
    torch.testing.assert_close(prefill_attention_ref(q, *caches, cu, lens, bt, kv_scales=scales),
                               prefill_attention_ref(q, *dense, cu, lens, bt), atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("dtype", DTYPES)
def test_fp8_prefill_contiguous_reads_the_cache(dtype):
    """Fresh prompts written to e4m3 caches: `contiguous=True` reads this step's k, v as the cache holds them
    (quantized and scaled back, what rope_kv_write leaves in qkv), so it agrees with the paged read."""
    gen = torch.Generator().manual_seed(2)
    qlens, page, hq, hkv, d = [1, 16, 17, 40, 65], 16, 4, 2, 64
    t, nblocks = sum(qlens), sum(-(-n // page) for n in qlens) + 2
    q, k, v = (randn(t, h, d, dtype=dtype, gen=gen) for h in (hq, hkv, hkv))
    caches = [torch.zeros(nblocks, page, hkv, d, device=DEVICE).to(torch.float8_e4m3fn) for _ in range(2)]
    scales = tuple(torch.zeros(nblocks, page, hkv, device=DEVICE) for _ in range(2))
    bt = block_tables_for(qlens, page, nblocks, gen)
    bt_host = bt.cpu()
    slots = torch.cat([bt_host[b, torch.arange(n) // page].long() * page + torch.arange(n) % page
                       for b, n in enumerate(qlens)])
    write_kv_ref(k, v, *caches, slots.to(DEVICE), kv_scales=scales)
    cu = torch.tensor([0] + list(torch.tensor(qlens).cumsum(0)), dtype=torch.int32, device=DEVICE)
    lens = torch.tensor(qlens, dtype=torch.int32, device=DEVICE)
    args = (q, *caches, cu, lens, bt, max(qlens))
    paged = prefill_attention(*args, block_m=32, block_n=32, kv_scales=scales)
    held = [kv_round_trip_ref(x) for x in (k, v)]
    contig = prefill_attention(*args, block_m=32, block_n=32, kv_scales=scales, contiguous=True, k=held[0], v=held[1])
    assert_close(contig, paged, dtype, scale=2)
    assert_close(paged, prefill_attention_ref(*args, kv_scales=scales), dtype, scale=2)


def bad_scales(k_scale, v_scale):
    return {
        "missing": (None, "e4m3 KV caches need kv_scales"),
        "one": ((k_scale,), "e4m3 KV caches need kv_scales"),
        "shape": ((k_scale[:, :8], v_scale), r"k_scale must be \[num_blocks, block_size, H_kv\]"),
        "strided": ((k_scale, v_scale.transpose(0, 1).contiguous().transpose(0, 1)),
                    "v_scale must be .* and contiguous"),
        "dtype": ((k_scale, v_scale.half()), "v_scale has dtype torch.float16"),
    }


@pytest.mark.parametrize("case", ["missing", "one", "shape", "strided", "dtype"])
def test_fp8_prefill_rejects_missing_or_misshaped_scales(case):
    q, _, caches, scales, (cu, lens, bt, max_q) = fp8_prefill_case(torch.float32, 32, 4, 2, 16, 1, [(4, 20)])
    kv_scales, message = bad_scales(*scales)[case]
    with pytest.raises(KernelInputError, match=message):
        prefill_attention(q, *caches, cu, lens, bt, max_q, kv_scales=kv_scales)


def test_fp8_prefill_rejects_scales_for_a_model_dtype_cache_and_mixed_caches():
    q, raw, caches, scales, (cu, lens, bt, max_q) = fp8_prefill_case(torch.float32, 32, 4, 2, 16, 1, [(4, 20)])
    with pytest.raises(KernelInputError, match="KV scales are only for e4m3 caches"):
        prefill_attention(q, *raw, cu, lens, bt, max_q, kv_scales=scales)
    with pytest.raises(KernelInputError, match="k_cache is e4m3 but v_cache is torch.float32"):
        prefill_attention(q, caches[0], raw[1], cu, lens, bt, max_q, kv_scales=scales)
