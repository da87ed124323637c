"""Decode attention over e4m3 paged KV caches with per-row scales (kernels/kv_quant.py) against references.

The caches are what a bf16 model writes, quantized by `kv_quantize_ref`; q runs in the kernel tests' dtypes.
"""

import pytest
import torch

from hosttune_engine.errors import KernelInputError
from hosttune_engine.kernels.decode_attention import (
    decode_attention, decode_attention_ref, decode_attention_rope, decode_attention_rope_ref,
)
from hosttune_engine.kernels.kv_quant import KV_FP8, kv_quantize_ref
from hosttune_engine.layers.rotary import rope_cos_sin
from .conftest import DEVICE
from .kernel_cases import (
    DTYPES, assert_close, block_tables_for, e4m3_rounding_as_on_the_gpu, paged_cache, randn, with_dtypes,
)

pytestmark = pytest.mark.usefixtures(e4m3_rounding_as_on_the_gpu.__name__)

PAGE = 16
LENS = [1, 15, 16, 17, 65, 200, 513]
ROPE_LENS = [1, 2, 16, 17, 65, 200, 1]  # the last row pads the batch


def fp8_case(lens, hkv, d, gen, page=PAGE):
    """bf16 caches (what the model writes), their e4m3 forms, the scales, block tables and seq_lens."""
    nblocks = sum(-(-n // page) for n in lens) + 3
    raw = paged_cache(nblocks, page, hkv, d, torch.bfloat16, gen)
    (k8, k_scale), (v8, v_scale) = kv_quantize_ref(raw[0]), kv_quantize_ref(raw[1])
    bt = block_tables_for(lens, page, nblocks, gen)
    return raw, (k8, v8), (k_scale, v_scale), bt, torch.tensor(lens, dtype=torch.int32, device=DEVICE)


def run_fp8_decode(dtype, head_dim, hq, hkv, num_splits, seed, page=PAGE, lens=LENS):
    """-> (kernel output, reference over the e4m3 caches, reference over the bf16 caches, bf16 caches)."""
    gen = torch.Generator().manual_seed(seed)
    raw, caches, scales, bt, seq_lens = fp8_case(lens, hkv, head_dim, gen, page)
    q = randn(len(lens), hq, head_dim, dtype=dtype, gen=gen)
    out = decode_attention(q, *caches, bt, seq_lens, num_splits=num_splits, block_n=32, kv_scales=scales)
    ref = decode_attention_ref(q, *caches, bt, seq_lens, kv_scales=scales)
    return out, ref, decode_attention_ref(q, *raw, bt, seq_lens), raw


@pytest.mark.parametrize("dtype,head_dim,hq,hkv,num_splits", with_dtypes([64, 128], [(8, 2), (7, 1)], [1, 5]))
def test_fp8_decode_attention_matches_ref(dtype, head_dim, hq, hkv, num_splits):
    out, ref, _, _ = run_fp8_decode(dtype, head_dim, hq, hkv, num_splits, seed=hq + head_dim + num_splits)
    assert_close(out, ref, dtype, scale=2)


@pytest.mark.parametrize("num_splits", [1, 3])
def test_fp8_decode_attention_with_tiles_inside_a_page(num_splits):
    """Pages of 64 hold whole key tiles of 32: the kernel's one-block-per-tile addressing."""
    out, ref, _, _ = run_fp8_decode(DTYPES[1], 64, 4, 2, num_splits, seed=11, page=64)
    assert_close(out, ref, DTYPES[1], scale=2)


def test_fp8_decode_attention_is_close_to_the_unquantized_caches():
    """e4m3 with one scale a row loses little: the output stays near attention over the bf16 caches."""
    out, _, exact, raw = run_fp8_decode(DTYPES[0], 128, 8, 2, 5, seed=7)
    err = (out.float() - exact.float()).abs().max().item()
    assert err < 0.05 * raw[1].float().abs().max().item(), err


def rope_case(dtype, head_dim, hq, hkv, seed):
    gen = torch.Generator().manual_seed(seed)
    _, caches, scales, bt, seq_lens = fp8_case(ROPE_LENS, hkv, head_dim, gen)
    pos = seq_lens - 1
    slots = (bt.gather(1, (pos // PAGE).long()[:, None])[:, 0] * PAGE + pos % PAGE).long()
    qkv = randn(len(ROPE_LENS), (hq + 2 * hkv) * head_dim, dtype=dtype, gen=gen)
    return qkv, pos, rope_cos_sin(head_dim, 1024, 1e6).to(DEVICE), slots, caches, scales, bt, seq_lens


def flat_rows(x):
    """A cache or scale tensor as one row per slot (bytes for e4m3, so equality is bit for bit)."""
    x = x.view(torch.uint8) if x.dtype == KV_FP8 else x
    return x.reshape(x.shape[0] * x.shape[1], -1)


@pytest.mark.parametrize("dtype,head_dim,hq,hkv,num_splits", with_dtypes([(128, 8, 2), (64, 7, 1)], [1, 5]))
def test_fp8_decode_attention_rope_is_rope_kv_write_then_decode_attention(dtype, head_dim, hq, hkv, num_splits):
    """The fused kernel writes this token's k and v as e4m3 with their scales and attends it as the cache holds
    it: the same output, cache bytes and scales as the references; a padding row (slot -1) writes nothing."""
    qkv, pos, cos_sin, slots, caches, scales, bt, seq_lens = rope_case(dtype, head_dim, hq, hkv, seed=head_dim + hq)
    pad_slot = slots[-1].item()
    slots[-1] = -1
    before = qkv.clone(), [c.clone() for c in caches], [s.clone() for s in scales]
    ref_caches, ref_scales = [c.clone() for c in caches], tuple(s.clone() for s in scales)
    out = decode_attention_rope(qkv, pos, cos_sin, slots, *caches, bt, seq_lens, hq, num_splits, block_n=32,
                                kv_scales=scales)
    ref = decode_attention_rope_ref(qkv, pos, cos_sin, slots, *ref_caches, bt, seq_lens, hq, num_splits,
                                    kv_scales=ref_scales)
    assert torch.equal(qkv, before[0])
    assert_close(out[:-1], ref[:-1], dtype, scale=2)
    assert torch.isfinite(out.float()).all()
    for got, want in zip(caches, ref_caches):
        assert torch.equal(flat_rows(got), flat_rows(want))
    for got, want in zip(scales, ref_scales):
        torch.testing.assert_close(got, want, rtol=1e-6, atol=0)
    for got, old in zip([*caches, *scales], [*before[1], *before[2]]):  # the padding row's own slot
        assert torch.equal(flat_rows(got)[pad_slot], flat_rows(old)[pad_slot])


def tiny_inputs(cache_dtype=KV_FP8):
    q = torch.randn(2, 4, 32, device=DEVICE)
    kc = torch.zeros(4, 16, 2, 32, device=DEVICE).to(cache_dtype)
    bt = torch.zeros(2, 1, dtype=torch.int32, device=DEVICE)
    lens = torch.ones(2, dtype=torch.int32, device=DEVICE)
    return q, kc, bt, lens


@pytest.mark.parametrize("make_scales,match", [
    (lambda kc: None, "need kv_scales"),
    (lambda kc: (torch.ones(kc.shape[:3], device=DEVICE),), "need kv_scales"),
    (lambda kc: (torch.ones(4, 16, 1, device=DEVICE),) * 2, r"k_scale must be \[num_blocks, block_size, H_kv\]"),
    (lambda kc: (torch.ones(4, 16, 2, device=DEVICE), torch.ones(4, 8, 2, device=DEVICE)), "v_scale must be"),
    (lambda kc: (torch.ones(kc.shape[:3], dtype=torch.float16, device=DEVICE),) * 2, "dtype"),
    (lambda kc: (torch.ones(4, 2, 16, device=DEVICE).transpose(1, 2),) * 2, "contiguous"),
])
def test_fp8_decode_attention_rejects_missing_or_misshaped_scales(make_scales, match):
    q, kc, bt, lens = tiny_inputs()
    with pytest.raises(KernelInputError, match=match):
        decode_attention(q, kc, kc, bt, lens, kv_scales=make_scales(kc))


def test_decode_attention_rejects_scales_for_unquantized_caches_and_mixed_caches():
    q, kc, bt, lens = tiny_inputs(torch.float32)
    scales = (torch.ones(kc.shape[:3], device=DEVICE),) * 2
    with pytest.raises(KernelInputError, match="only for e4m3"):
        decode_attention(q, kc, kc, bt, lens, kv_scales=scales)
    with pytest.raises(KernelInputError, match="v_cache is"):
        decode_attention(q, kc.to(KV_FP8), kc, bt, lens, kv_scales=scales)


def test_fp8_decode_attention_rope_needs_scales():
    _, kc, bt, lens = tiny_inputs()
    one = torch.zeros(2, dtype=torch.int32, device=DEVICE)
    with pytest.raises(KernelInputError, match="need kv_scales"):
        decode_attention_rope(torch.zeros(2, 8 * 32, device=DEVICE), one, rope_cos_sin(32, 64, 1e4).to(DEVICE),
                              one, kc, kc, bt, lens, 4)
