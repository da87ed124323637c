"""Prefill (varlen, causal, GQA, paged, split-K) and split-K decode attention against references.

The references themselves are checked against a dense causal softmax attention.
"""

import math

import pytest
import torch

from hosttune_engine.errors import KernelInputError
from hosttune_engine.kernels.decode_attention import (
    choose_num_splits, decode_attention, decode_attention_ref, decode_attention_rope, decode_attention_rope_ref,
)
from hosttune_engine.kernels.descriptors import descriptors_fit
from hosttune_engine.kernels.prefill_attention import prefill_attention, prefill_attention_ref
from hosttune_engine.kernels.split_k import MAX_SPLITS, choose_splits
from hosttune_engine.layers.rotary import rope_cos_sin
from .conftest import DEVICE
from .kernel_cases import DTYPES, HEAD_DIMS, HEADS, assert_close, block_tables_for, paged_cache, randn, with_dtypes

# (query tokens, context tokens) per sequence: ragged, block-boundary, chunked and prefix-hit shapes
PREFILL_BATCH = [(1, 1), (16, 16), (17, 17), (15, 47), (33, 33), (8, 120), (64, 64), (65, 81)]
# chunks after cached prefixes of 65, 0, 83, 8 and 37 tokens: off the page and key-tile grid
SPLIT_BATCH = [(5, 70), (40, 40), (17, 100), (1, 9), (24, 61)]
DECODE_LENS = [1, 15, 16, 17, 63, 64, 65, 200, 513]


def run_prefill(fn, dtype, head_dim, hq, hkv, page, seed, batch=PREFILL_BATCH, **kw):
    gen = torch.Generator().manual_seed(seed)
    qlens = [q for q, _ in batch]
    ctx = [c for _, c in batch]
    nblocks = sum(-(-c // page) for c in ctx) + 5
    kc, vc = paged_cache(nblocks, page, hkv, head_dim, dtype, gen)
    q = randn(sum(qlens), hq, head_dim, dtype=dtype, gen=gen)
    cu = torch.tensor([0] + list(torch.tensor(qlens).cumsum(0)), dtype=torch.int32, device=DEVICE)
    lens = torch.tensor(ctx, dtype=torch.int32, device=DEVICE)
    bt = block_tables_for(ctx, page, nblocks, gen)
    out = fn(q, kc, vc, cu, lens, bt, max(qlens), **kw)
    ref = prefill_attention_ref(q, kc, vc, cu, lens, bt)
    return out, ref


@pytest.mark.parametrize("dtype,head_dim,hq,hkv,page,block_n",
                         with_dtypes(HEAD_DIMS, HEADS, [(16, 64), (16, 16), (32, 32)]))
def test_prefill_attention(dtype, head_dim, hq, hkv, page, block_n):
    out, ref = run_prefill(prefill_attention, dtype, head_dim, hq, hkv, page, seed=hq * head_dim + page,
                           block_m=32, block_n=block_n)
    assert_close(out, ref, dtype, scale=2)


@pytest.mark.parametrize("dtype,hq,hkv,num_splits", with_dtypes([(8, 2, 2), (7, 1, 3), (2, 2, 16), (4, 1, 1)]))
def test_prefill_split_k_matches_reference(dtype, hq, hkv, num_splits):
    """Chunks after a cached prefix, several sequences of different lengths in one call, split over their
    keys; with 16 splits most splits of the short sequences' tiles see no key at all."""
    out, ref = run_prefill(prefill_attention, dtype, 32, hq, hkv, 16, seed=hq + num_splits, batch=SPLIT_BATCH,
                           block_m=32, block_n=16, num_splits=num_splits)
    assert torch.isfinite(out.float()).all()
    assert_close(out, ref, dtype, scale=2)


def test_prefill_split_k_agrees_with_one_split():
    """Split or not, the same attention (fp32, to rounding), and so is the automatic choice (one split off a
    GPU; on a GPU, splits where the grid leaves SMs idle)."""
    base, _ = run_prefill(prefill_attention, torch.float32, 32, 4, 2, 16, seed=9, batch=SPLIT_BATCH,
                          block_m=32, block_n=32, num_splits=1)
    auto, _ = run_prefill(prefill_attention, torch.float32, 32, 4, 2, 16, seed=9, batch=SPLIT_BATCH,
                          block_m=32, block_n=32, max_context=100)
    split, _ = run_prefill(prefill_attention, torch.float32, 32, 4, 2, 16, seed=9, batch=SPLIT_BATCH,
                           block_m=32, block_n=32, num_splits=4)
    for other in (auto, split):
        torch.testing.assert_close(other, base, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("bad", [0, -1, MAX_SPLITS + 1, 2.0, True])
def test_prefill_attention_rejects_a_bad_split_count(bad):
    q = torch.randn(4, 2, 16, device=DEVICE)
    kc = torch.zeros(2, 16, 2, 16, device=DEVICE)
    cu = torch.tensor([0, 4], dtype=torch.int32, device=DEVICE)
    lens = torch.tensor([4], dtype=torch.int32, device=DEVICE)
    bt = torch.zeros(1, 1, dtype=torch.int32, device=DEVICE)
    with pytest.raises(KernelInputError, match="num_splits must be an int in 1..64"):
        prefill_attention(q, kc, kc, cu, lens, bt, 4, num_splits=bad)


def test_choose_splits_fills_the_sms_with_powers_of_two_and_keeps_full_grids_unsplit():
    assert choose_splits(28, 4160 // 64, 132) == 8  # 64 queries (1 tile x 28 heads) over a 4K prefix
    assert choose_splits(56, 4352 // 64, 132) == 4  # 256 queries: 2 tiles
    assert choose_splits(112, 4608 // 64, 132) == 2
    assert choose_splits(133, 1 << 20, 132) == 1  # more than one program per SM: no scratch, no merge
    assert choose_splits(28, 16, 132) == 2  # a short context: each split keeps 8 key tiles
    assert choose_splits(28, 15, 132) == 1
    assert choose_splits(20, 1000, 132) == 8  # 13 would fit: the power of two below
    assert choose_splits(1, 1 << 20, 132) == MAX_SPLITS


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("head_dim,hq,hkv,aligned", [(64, 8, 2, True), (128, 7, 1, True), (32, 4, 2, False)])
def test_prefill_attention_contiguous_matches_paged(dtype, head_dim, hq, hkv, aligned):
    """Fresh prompts (no cached prefix): reading this step's k, v directly (through tensor descriptors)
    equals reading the cache. A layout descriptors cannot take (base address not 16-byte aligned) is
    read from the cache instead, with the same result."""
    gen = torch.Generator().manual_seed(head_dim + hq)
    qlens, page = [1, 16, 17, 40, 64, 65], 16
    t = sum(qlens)
    flat = randn(t * (hq + 2 * hkv) * head_dim + 1, dtype=dtype, gen=gen)
    qkv = (flat[:-1] if aligned else flat[1:]).view(t, hq + 2 * hkv, head_dim)
    q, k, v = qkv.split([hq, hkv, hkv], dim=1)  # strided views, as the attention layer passes them
    assert descriptors_fit(q, k, v) == aligned
    nblocks = sum(-(-n // page) for n in qlens) + 2
    kc, vc = (torch.zeros(nblocks, page, hkv, head_dim, dtype=dtype, device=DEVICE) for _ in range(2))
    bt = block_tables_for(qlens, page, nblocks, gen)
    cu = torch.tensor([0] + list(torch.tensor(qlens).cumsum(0)), dtype=torch.int32, device=DEVICE)
    lens = torch.tensor(qlens, dtype=torch.int32, device=DEVICE)
    for b, n in enumerate(qlens):  # the KV write of this step
        slots = torch.arange(n, device=DEVICE)
        rows = bt[b, slots // page].long() * page + slots % page
        kc.view(-1, hkv, head_dim)[rows], vc.view(-1, hkv, head_dim)[rows] = k[cu[b]:cu[b + 1]], v[cu[b]:cu[b + 1]]
    out = prefill_attention(q, kc, vc, cu, lens, bt, max(qlens), contiguous=True, k=k, v=v, block_m=32, block_n=32)
    assert_close(out, prefill_attention_ref(q, kc, vc, cu, lens, bt), dtype, scale=2)


def test_prefill_ref_matches_dense_causal_attention():
    gen = torch.Generator().manual_seed(1)
    L, hq, hkv, d, page = 37, 4, 2, 16, 8
    q, k, v = (torch.randn(L, h, d, generator=gen) for h in (hq, hkv, hkv))
    nb = -(-L // page)
    kc, vc = torch.zeros(nb, page, hkv, d), torch.zeros(nb, page, hkv, d)
    kc.view(-1, hkv, d)[:L], vc.view(-1, hkv, d)[:L] = k, v
    bt = torch.arange(nb, dtype=torch.int32)[None]
    cu = torch.tensor([0, L], dtype=torch.int32)
    ref = prefill_attention_ref(q, kc, vc, cu, torch.tensor([L], dtype=torch.int32), bt)
    dense = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(0, 1), k.repeat_interleave(2, 1).transpose(0, 1), v.repeat_interleave(2, 1).transpose(0, 1),
        is_causal=True,
    ).transpose(0, 1)
    torch.testing.assert_close(ref, dense, atol=1e-5, rtol=1e-5)


def run_decode(dtype, head_dim, hq, hkv, page, num_splits, seed, lens=DECODE_LENS):
    gen = torch.Generator().manual_seed(seed)
    nblocks = sum(-(-n // page) for n in lens) + 3
    kc, vc = paged_cache(nblocks, page, hkv, head_dim, dtype, gen)
    q = randn(len(lens), hq, head_dim, dtype=dtype, gen=gen)
    seq_lens = torch.tensor(lens, dtype=torch.int32, device=DEVICE)
    bt = block_tables_for(lens, page, nblocks, gen)
    out = decode_attention(q, kc, vc, bt, seq_lens, num_splits=num_splits, block_n=32)
    return out, decode_attention_ref(q, kc, vc, bt, seq_lens)


@pytest.mark.parametrize("dtype,head_dim,hq,hkv,num_splits", with_dtypes(HEAD_DIMS, HEADS, [1, 5]))
def test_decode_attention(dtype, head_dim, hq, hkv, num_splits):
    out, ref = run_decode(dtype, head_dim, hq, hkv, 16, num_splits, seed=hq + head_dim + num_splits)
    assert_close(out, ref, dtype, scale=2)


@pytest.mark.parametrize("dtype,head_dim,hq,hkv,num_splits",
                         with_dtypes([(128, 8, 2), (64, 7, 1), (64, 2, 2)], [1, 5]))
def test_decode_attention_rope_is_rope_kv_write_then_decode_attention(dtype, head_dim, hq, hkv, num_splits):
    """The fused kernel rotates q and k, writes this token's k and v and attends the cache and the token: the
    same output and caches as the two kernels' references, qkv untouched; a padding row (slot -1) writes nothing."""
    page, lens = 16, [1, 2, 16, 17, 64, 65, 200, 513, 1]  # the last row pads the batch
    gen = torch.Generator().manual_seed(head_dim + hq + num_splits)
    nblocks = sum(-(-n // page) for n in lens) + 3
    kc, vc = paged_cache(nblocks, page, hkv, head_dim, dtype, gen)
    bt = block_tables_for(lens, page, nblocks, gen)
    seq_lens = torch.tensor(lens, dtype=torch.int32, device=DEVICE)
    pos = seq_lens - 1
    slots = (bt.gather(1, (pos // page).long()[:, None])[:, 0] * page + pos % page).long()
    slots[-1] = -1
    qkv = randn(len(lens), (hq + 2 * hkv) * head_dim, dtype=dtype, gen=gen)
    cos_sin = rope_cos_sin(head_dim, 1024, 1e6).to(DEVICE)
    before, caches = qkv.clone(), (kc.clone(), vc.clone())
    out = decode_attention_rope(qkv, pos, cos_sin, slots, kc, vc, bt, seq_lens, hq, num_splits, block_n=32)
    ref = decode_attention_rope_ref(qkv, pos, cos_sin, slots, *caches, bt, seq_lens, hq, num_splits)
    assert torch.equal(qkv, before)
    assert_close(out[:-1], ref[:-1], dtype, scale=2)
    assert torch.isfinite(out.float()).all()
    assert_close(kc, caches[0], dtype)
    assert torch.equal(vc, caches[1])  # v is copied, not computed


def test_decode_attention_rope_rejects_a_mismatched_width():
    kc = torch.zeros(4, 16, 2, 32, device=DEVICE)
    one = torch.zeros(2, dtype=torch.int32, device=DEVICE)
    bt = torch.zeros(2, 1, dtype=torch.int32, device=DEVICE)
    with pytest.raises(KernelInputError, match="qkv width"):
        decode_attention_rope(torch.zeros(2, 7 * 32, device=DEVICE), one, rope_cos_sin(32, 64, 1e4).to(DEVICE),
                              one, kc, kc, bt, one + 1, 4)


def test_decode_more_splits_than_tiles_leaves_empty_splits_harmless(monkeypatch):
    from hosttune_engine.kernels import decode_attention as module
    from hosttune_engine.kernels import split_k

    def poisoned(*args):  # scratch that is not zero: an empty split's output row is never read
        mid_o, mid_lse = split_k.split_scratch(*args)
        mid_o.fill_(float("nan"))
        return mid_o, mid_lse

    monkeypatch.setattr(module, "split_scratch", poisoned)
    out, ref = run_decode(DTYPES[0], 64, 4, 1, 16, num_splits=16, seed=3, lens=[1, 2, 40])
    assert torch.isfinite(out.float()).all()
    assert_close(out, ref, DTYPES[0], scale=2)


def test_decode_ref_agrees_with_prefill_ref_on_last_token():
    gen = torch.Generator().manual_seed(5)
    L, page = 21, 8
    kc, vc = paged_cache(4, page, 2, 16, torch.float32, gen)
    q = randn(1, 4, 16, dtype=torch.float32, gen=gen)
    bt = torch.tensor([[2, 0, 3]], dtype=torch.int32, device=DEVICE)
    lens = torch.tensor([L], dtype=torch.int32, device=DEVICE)
    cu = torch.tensor([0, 1], dtype=torch.int32, device=DEVICE)
    torch.testing.assert_close(decode_attention_ref(q, kc, vc, bt, lens), prefill_attention_ref(q, kc, vc, cu, lens, bt))


def test_attention_wrappers_reject_bad_inputs():
    q = torch.randn(2, 6, 32, device=DEVICE)
    kc = torch.zeros(4, 16, 4, 32, device=DEVICE)
    bt = torch.zeros(2, 1, dtype=torch.int32, device=DEVICE)
    lens = torch.ones(2, dtype=torch.int32, device=DEVICE)
    with pytest.raises(KernelInputError, match="do not group"):
        decode_attention(q, kc, kc, bt, lens)
    with pytest.raises(KernelInputError, match="dtype"):
        decode_attention(q[:, :4], kc, kc, bt.long(), lens)
    with pytest.raises(KernelInputError, match="power of two"):
        decode_attention(torch.randn(2, 4, 48, device=DEVICE), torch.zeros(4, 16, 4, 48, device=DEVICE),
                         torch.zeros(4, 16, 4, 48, device=DEVICE), bt, lens)


def test_choose_num_splits():
    assert choose_num_splits(1, 4, 32768) == 64
    assert choose_num_splits(256, 4, 32768) == 1
    assert choose_num_splits(1, 4, 10) == 1
    assert math.isfinite(choose_num_splits(3, 1, 1000))
