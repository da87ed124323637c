"""The FP8 KV cache: its format, the kernels that write it, the pool that holds it and the engine option."""

import pytest
import torch

from hosttune_engine import EngineConfig
from hosttune_engine.cache.kv_pool import KVCacheShape, KVPool
from hosttune_engine.errors import ConfigError, KernelInputError
from hosttune_engine.kernels.kv_quant import (KV_FP8, KV_FP8_MAX, kv_dequantize_ref, kv_quantize_ref,
                                              kv_round_trip_ref)
from hosttune_engine.kernels.kv_write import write_kv_ref
from hosttune_engine.kernels.paged import gather_pages
from hosttune_engine.kernels.rope_kv import rope_kv_write, rope_kv_write_ref
from hosttune_engine.layers.attention import Attention
from hosttune_engine.layers.rotary import rope_cos_sin
from .conftest import DEVICE
from .kernel_cases import DTYPES, e4m3_rounding_as_on_the_gpu, randn

pytestmark = pytest.mark.usefixtures(e4m3_rounding_as_on_the_gpu.__name__)

GEN = torch.Generator().manual_seed(7)


def assert_e4m3_rows_match(got, want):
    """e4m3 caches written by a kernel and by the reference: equal but for values one e4m3 step apart where the
    rotated row itself rounded differently (under 1%)."""
    g, w = got.float(), want.float()
    bad = g != w
    assert bad.float().mean() < 0.01
    assert ((g - w).abs() <= torch.maximum(g.abs(), w.abs()) / 8)[bad].all()


def fp8_caches(nblocks, page, hkv, d):
    caches = [torch.zeros(nblocks, page, hkv, d, dtype=KV_FP8, device=DEVICE) for _ in range(2)]
    scales = tuple(torch.zeros(nblocks, page, hkv, device=DEVICE) for _ in range(2))
    return caches, scales


def test_rows_keep_their_range_and_lose_at_most_e4m3_rounding():
    """Each row is scaled to e4m3's full range: rows of very different magnitudes (keys with large biases beside
    small ones) come back within e4m3's relative rounding of their own largest value; a zero row stays zero."""
    x = torch.randn(5, 3, 64, generator=GEN) * torch.tensor([1e-3, 1.0, 300.0])[None, :, None]
    x[4, 0] = 0
    q, scale = kv_quantize_ref(x)
    assert q.dtype == KV_FP8 and scale.shape == (5, 3) and scale.dtype == torch.float32
    assert q.float().abs().amax(-1)[:4].eq(KV_FP8_MAX).all()
    back = kv_dequantize_ref(q, scale)
    err = (back - x).abs().amax(-1) / x.abs().amax(-1).clamp_min(1e-30)
    assert err[:4].max() <= 2 ** -4
    assert torch.equal(back[4, 0], torch.zeros(64))
    assert kv_round_trip_ref(x.half()).dtype == torch.float16


def test_write_kv_ref_stores_rows_and_scales_and_skips_padding():
    k, v = torch.randn(3, 2, 16, generator=GEN).to(DEVICE), (torch.randn(3, 2, 16, generator=GEN) * 50).to(DEVICE)
    (kc, vc), scales = fp8_caches(2, 4, 2, 16)
    write_kv_ref(k, v, kc, vc, torch.tensor([5, -1, 0], device=DEVICE), scales)
    for x, cache, s in ((k, kc, scales[0]), (v, vc, scales[1])):
        got = kv_dequantize_ref(cache.view(-1, 2, 16), s.view(-1, 2))
        torch.testing.assert_close(got[[5, 0]], kv_round_trip_ref(x[[0, 2]]).float())
        assert cache.view(-1, 2, 16)[[1, 2, 3, 4, 6, 7]].float().count_nonzero() == 0


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("head_dim,hq,hkv", [(128, 28, 4), (64, 7, 1), (48, 2, 2)])
def test_rope_kv_write_into_an_fp8_cache_matches_its_reference(dtype, head_dim, hq, hkv):
    """The fused RoPE + write quantizes each rotated k row and each v row with its own scale, as the reference
    does, and leaves the written tokens' k and v in qkv as the cache holds them; q is rotated in place either
    way, and a padding slot writes nothing."""
    page, nblocks, t = 16, 6, 9
    cos_sin = rope_cos_sin(head_dim, 4096, 1e6).to(DEVICE)
    qkv = randn(t, (hq + 2 * hkv) * head_dim, dtype=dtype, gen=GEN) * 20
    pos = torch.tensor([0, 1, 15, 16, 1000, 4095, 7, 8, 9], dtype=torch.int32, device=DEVICE)
    slots = torch.tensor([0, 15, 16, 17, 40, -1, 95, 3, 50], device=DEVICE)
    (kc, vc), scales = fp8_caches(nblocks, page, hkv, head_dim)
    (kr, vr), ref_scales = fp8_caches(nblocks, page, hkv, head_dim)
    got, want = qkv.clone(), qkv.clone()
    rope_kv_write(got, pos, cos_sin, kc, vc, slots, hq, hkv, kv_scales=scales)
    rope_kv_write_ref(want, pos, cos_sin, kr, vr, slots, hq, hkv, kv_scales=ref_scales)
    q_heads = got.view(t, -1, head_dim)[:, :hq]
    torch.testing.assert_close(q_heads.float(), want.view(t, -1, head_dim)[:, :hq].float(), atol=2e-3, rtol=2e-3)
    kv_got, kv_want = got.view(t, -1, head_dim)[:, hq:], want.view(t, -1, head_dim)[:, hq:]
    held = torch.cat([kv_dequantize_ref(kc.view(-1, hkv, head_dim), scales[0].view(-1, hkv)),
                      kv_dequantize_ref(vc.view(-1, hkv, head_dim), scales[1].view(-1, hkv))], 1)[slots[slots >= 0]]
    keep = (slots >= 0).cpu()
    torch.testing.assert_close(kv_got[keep].float(), held.to(dtype).float(), atol=0, rtol=0)  # the cache's values
    torch.testing.assert_close(kv_got[~keep].float(), kv_want[~keep].float(), atol=2e-3, rtol=2e-3)  # as rotated
    for cache, ref, s, rs in ((kc, kr, scales[0], ref_scales[0]), (vc, vr, scales[1], ref_scales[1])):
        torch.testing.assert_close(s, rs, rtol=1e-5, atol=0)
        assert_e4m3_rows_match(cache, ref)
    assert scales[1].count_nonzero() == 8 * hkv  # the -1 slot wrote no scale


def test_fp8_writes_need_matching_scales():
    cos_sin = rope_cos_sin(16, 64, 1e4).to(DEVICE)
    qkv = torch.zeros(2, 4 * 16, device=DEVICE)
    one = torch.zeros(2, dtype=torch.int32, device=DEVICE)
    (kc, vc), scales = fp8_caches(4, 16, 1, 16)
    with pytest.raises(KernelInputError, match="need kv_scales"):
        rope_kv_write(qkv, one, cos_sin, kc, vc, one, 2, 1)
    with pytest.raises(KernelInputError, match="k_scale must be"):
        rope_kv_write(qkv, one, cos_sin, kc, vc, one, 2, 1, kv_scales=(scales[0][:2], scales[1]))
    plain = torch.zeros(4, 16, 1, 16, device=DEVICE)
    with pytest.raises(KernelInputError, match="only for e4m3 caches"):
        rope_kv_write(qkv, one, cos_sin, plain, plain, one, 2, 1, kv_scales=scales)


def test_gather_pages_dequantizes_with_the_scales():
    q, s = kv_quantize_ref(torch.randn(3, 4, 2, 8, generator=GEN))
    table = torch.tensor([2, 0], dtype=torch.int32)
    rows = gather_pages(q, table, 6, s)
    assert rows.dtype == torch.float32 and rows.shape == (6, 2, 8)
    torch.testing.assert_close(rows, kv_dequantize_ref(torch.cat([q[2], q[0, :2]]), torch.cat([s[2], s[0, :2]])))


def test_an_fp8_pool_holds_twice_the_blocks_and_binds_scales():
    bf16 = KVCacheShape(num_layers=2, block_size=16, num_kv_heads=4, head_dim=128, dtype_bytes=2)
    fp8 = KVCacheShape(num_layers=2, block_size=16, num_kv_heads=4, head_dim=128, dtype_bytes=1, fp8=True)
    assert fp8.bytes_per_block == 2 * 2 * 16 * 4 * (128 + 4)
    assert bf16.bytes_per_block / fp8.bytes_per_block == pytest.approx(256 / 132)
    layers = torch.nn.ModuleList(Attention(8, 4, 128, 1.0) for _ in range(2))
    pool = KVPool(fp8, 3, torch.device("cpu"), torch.bfloat16)
    pool.bind(layers)
    assert pool.cache.dtype == KV_FP8 and pool.scales.shape == (2, 2, 3, 16, 4)
    k_scale, v_scale = layers[1].kv_scales
    assert k_scale.data_ptr() == pool.scales[1, 0].data_ptr() and v_scale.is_contiguous()
    plain = KVPool(bf16, 3, torch.device("cpu"), torch.bfloat16)
    plain.bind(layers)
    assert plain.scales is None and layers[0].kv_scales is None


def test_kv_cache_dtype_is_checked():
    assert EngineConfig(model="m", kv_cache_dtype="fp8").kv_cache_dtype == "fp8"
    with pytest.raises(ConfigError, match="kv_cache_dtype must be one of auto, fp8"):
        EngineConfig(model="m", kv_cache_dtype="int8")


def test_an_fp8_cache_engine_decodes_the_same_through_the_graph_buffers(tiny_models):
    """The e4m3 cache through a whole engine: the decode graphs' padded buffers (captured on a GPU, run eagerly
    elsewhere) give the greedy tokens of the packed eager steps, and the pool holds e4m3 rows and their scales."""
    from hosttune_engine import Engine, SamplingParams
    from hosttune_engine.core.messages import EngineRequest

    from .oracle import prompt_ids
    from .test_oracle import run

    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    prompts = {"a": prompt_ids(5, seed=1), "b": prompt_ids(21, seed=2), "c": prompt_ids(3, seed=3)}
    schedule = {0: [EngineRequest(r, ids, params) for r, ids in prompts.items() if r != "c"],
                2: [EngineRequest("c", prompts["c"], params)]}
    results = []
    for padded in (False, True):
        eng = Engine(EngineConfig(model=str(tiny_models["qwen2"]), dtype="float32", block_size=4, max_num_seqs=4,
                                  num_kv_blocks=64, enable_prefix_caching=False, kv_cache_dtype="fp8",
                                  enforce_eager=not padded))
        if padded and eng.runner.graphs is None:
            eng.runner.graphs = eng.runner.build_decode_graphs(use_graphs=False, max_batch=4)
        results.append(run(eng, schedule))
        pool = eng.runner.kv_pool
        assert pool.cache.dtype == KV_FP8 and pool.scales.count_nonzero() > 0
    assert results[0] == results[1] and all(len(t) == 6 for t in results[0].values())
