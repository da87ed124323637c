"""RMSNorm(+residual), SwiGLU, RoPE and KV-cache write against their torch references."""

import pytest
import torch

from hosttune_engine.errors import KernelInputError
from hosttune_engine.kernels.checks import check
from hosttune_engine.kernels.kv_write import write_kv, write_kv_ref
from hosttune_engine.kernels.rmsnorm import rms_norm, rms_norm_ref
from hosttune_engine.kernels.rope import rope, rope_ref
from hosttune_engine.kernels.rope_kv import rope_kv_write, rope_kv_write_ref
from hosttune_engine.kernels.swiglu import swiglu, swiglu_ref
from hosttune_engine.layers.rotary import rope_cos_sin
from .conftest import DEVICE
from .kernel_cases import DTYPES, HEAD_DIMS, assert_close, randn

GEN = torch.Generator().manual_seed(0)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("tokens,hidden", [(1, 64), (7, 96), (33, 3584), (0, 64)])
def test_rms_norm(dtype, tokens, hidden):
    x = randn(tokens, hidden, dtype=dtype, gen=GEN)
    w = randn(hidden, dtype=dtype, gen=GEN)
    assert_close(rms_norm(x, w, 1e-6), rms_norm_ref(x, w, 1e-6), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("tokens,hidden", [(1, 64), (9, 112), (17, 3584)])
def test_rms_norm_fused_residual(dtype, tokens, hidden):
    x = randn(tokens, hidden, dtype=dtype, gen=GEN)
    r = randn(tokens, hidden, dtype=dtype, gen=GEN)
    w = randn(hidden, dtype=dtype, gen=GEN)
    out, res = rms_norm(x, w, 1e-5, residual=r)
    ref_out, ref_res = rms_norm_ref(x, w, 1e-5, residual=r)
    assert_close(res, ref_res, dtype)
    assert_close(out, ref_out, dtype)
    assert_close(res, x.float() + r.float(), dtype)
    into = torch.empty_like(x)  # the new residual written where the caller wants it: the same values
    out2, res2 = rms_norm(x, w, 1e-5, residual=r, residual_out=into)
    assert res2 is into and torch.equal(res2, res) and torch.equal(out2, out)


def test_check_formats_its_message_only_on_failure():
    class Unformattable:
        def __format__(self, spec):
            raise AssertionError("formatted although the check passed")

    check(True, "x {}", Unformattable())
    with pytest.raises(KernelInputError, match=r"^weight has 4 elements, x rows have 8$"):
        check(False, "weight has {} elements, x rows have {}", 4, 8)
    with pytest.raises(KernelInputError, match=r"^kept \{as is\}$"):  # no arguments: not formatted
        check(False, "kept {as is}")


def test_rms_norm_rejects_bad_inputs():
    x = torch.randn(4, 8, device=DEVICE)
    with pytest.raises(KernelInputError, match="weight has 4 elements"):
        rms_norm(x, torch.ones(4, device=DEVICE), 1e-6)
    with pytest.raises(KernelInputError, match="contiguous"):
        rms_norm(x.t(), torch.ones(4, device=DEVICE), 1e-6)
    with pytest.raises(KernelInputError, match="dtype"):
        rms_norm(x, torch.ones(8, device=DEVICE), 1e-6, residual=x.half())
    with pytest.raises(KernelInputError, match="residual_out must be like x"):
        rms_norm(x, torch.ones(8, device=DEVICE), 1e-6, residual=x, residual_out=torch.empty(4, 4, device=DEVICE))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("tokens,inter", [(1, 64), (5, 224), (13, 2500)])
def test_swiglu(dtype, tokens, inter):
    x = randn(tokens, 2 * inter, dtype=dtype, gen=GEN)
    assert_close(swiglu(x), swiglu_ref(x), dtype)


def test_swiglu_matches_definition():
    x = torch.randn(3, 8, device=DEVICE)
    g, u = x[:, :4], x[:, 4:]
    assert_close(swiglu(x), torch.nn.functional.silu(g) * u, torch.float32)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("head_dim", HEAD_DIMS + [16])
@pytest.mark.parametrize("heads", [1, 4, 7, 28])
def test_rope(dtype, head_dim, heads):
    cos_sin = rope_cos_sin(head_dim, 4096, 1e6).to(DEVICE)
    x_full = randn(6, heads + 3, head_dim, dtype=dtype, gen=GEN)
    x = x_full[:, :heads]  # a strided view, like q out of a fused qkv projection
    pos = torch.tensor([0, 1, 15, 16, 1000, 4095], device=DEVICE)
    assert_close(rope(x, pos, cos_sin), rope_ref(x, pos, cos_sin), dtype)


def test_rope_ref_matches_hf_rotate_half():
    d = 16
    cos_sin = rope_cos_sin(d, 64, 10000.0)
    x = torch.randn(5, 3, d, dtype=torch.float64).float()
    pos = torch.arange(5)
    inv = 1.0 / (10000.0 ** (torch.arange(0, d, 2).float() / d))
    ang = torch.outer(pos.float(), inv)
    emb = torch.cat([ang, ang], -1)
    rot = torch.cat([-x[..., d // 2 :], x[..., : d // 2]], -1)
    want = x * emb.cos()[:, None] + rot * emb.sin()[:, None]
    torch.testing.assert_close(rope_ref(x, pos, cos_sin), want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
@pytest.mark.parametrize("hkv", [1, 4])
def test_kv_write(dtype, head_dim, hkv):
    page, nblocks = 16, 6
    kv = randn(9, 2 * hkv, head_dim, dtype=dtype, gen=GEN)
    k, v = kv[:, :hkv], kv[:, hkv:]  # strided views
    slots = torch.tensor([0, 15, 16, 17, 40, -1, 95, 3, 50], device=DEVICE)
    caches = [torch.zeros(nblocks, page, hkv, head_dim, dtype=dtype, device=DEVICE) for _ in range(4)]
    write_kv(k, v, caches[0], caches[1], slots)
    write_kv_ref(k, v, caches[2], caches[3], slots)
    assert torch.equal(caches[0], caches[2]) and torch.equal(caches[1], caches[3])
    assert torch.equal(caches[0].view(-1, hkv, head_dim)[95], k[6])
    assert caches[0].count_nonzero() == 8 * hkv * head_dim  # the -1 slot wrote nothing


def test_kv_write_rejects_mismatched_cache():
    k = torch.randn(2, 2, 16, device=DEVICE)
    cache = torch.zeros(4, 16, 3, 16, device=DEVICE)
    with pytest.raises(KernelInputError, match="does not hold heads"):
        write_kv(k, k, cache, cache, torch.zeros(2, dtype=torch.int64, device=DEVICE))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("head_dim,hq,hkv", [(128, 28, 4), (64, 7, 1), (16, 2, 2)])
def test_rope_kv_write(dtype, head_dim, hq, hkv):
    """Fused RoPE + KV write equals rope then write_kv: q, k rotated in place, k and v in their slots."""
    page, nblocks, t = 16, 6, 9
    cos_sin = rope_cos_sin(head_dim, 4096, 1e6).to(DEVICE)
    qkv = randn(t, (hq + 2 * hkv) * head_dim, dtype=dtype, gen=GEN)
    pos = torch.tensor([0, 1, 15, 16, 1000, 4095, 7, 8, 9], dtype=torch.int32, device=DEVICE)
    slots = torch.tensor([0, 15, 16, 17, 40, -1, 95, 3, 50], device=DEVICE)
    caches = [torch.zeros(nblocks, page, hkv, head_dim, dtype=dtype, device=DEVICE) for _ in range(4)]
    got, want = qkv.clone(), qkv.clone()
    rope_kv_write(got, pos, cos_sin, caches[0], caches[1], slots, hq, hkv)
    rope_kv_write_ref(want, pos, cos_sin, caches[2], caches[3], slots, hq, hkv)
    assert_close(got, want, dtype)
    assert_close(caches[0], caches[2], dtype)
    assert torch.equal(caches[1], caches[3])  # v is copied, not computed
    q = qkv.view(t, -1, head_dim)[:, :hq]
    assert_close(got.view(t, -1, head_dim)[:, :hq], rope_ref(q, pos, cos_sin), dtype)
    assert caches[1].count_nonzero() == 8 * hkv * head_dim  # the -1 slot wrote nothing


def test_rope_kv_write_rejects_a_mismatched_width():
    cos_sin = rope_cos_sin(16, 64, 1e4).to(DEVICE)
    cache = torch.zeros(2, 4, 1, 16, device=DEVICE)
    with pytest.raises(KernelInputError, match="qkv width"):
        rope_kv_write(torch.zeros(3, 5 * 16, device=DEVICE), torch.zeros(3, dtype=torch.int32, device=DEVICE),
                      cos_sin, cache, cache, torch.zeros(3, dtype=torch.int32, device=DEVICE), 2, 1)


@pytest.mark.parametrize("m,n,k,bias,even", [(1, 37, 64, True, True), (3, 16, 96, False, False), (1, 8, 256, False, True)])
def test_gemv(m, n, k, bias, even):
    from hosttune_engine.kernels.gemv import gemv, gemv_ref

    x, w = randn(m, k, dtype=torch.float32, gen=GEN), randn(n, k, dtype=torch.float32, gen=GEN)
    b = randn(n, dtype=torch.float32, gen=GEN) if bias else None
    cfg = {"BLOCK_N": 8, "BLOCK_K": 32 if even else 64, "num_warps": 4, "num_stages": 2}
    assert_close(gemv(x, w, b, config=cfg), gemv_ref(x, w, b), torch.float32, scale=10)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("k,block_k", [(64, 32), (96, 64)])
def test_gemv_prologues_equal_the_unfused_layers(dtype, k, block_k):
    """RMSNorm (+ residual) and SwiGLU computed in the GEMV prologue give what the separate kernels give."""
    from hosttune_engine.kernels.gemv import gemv_rmsnorm, gemv_rmsnorm_ref, gemv_swiglu, gemv_swiglu_ref

    cfg = {"BLOCK_N": 8, "BLOCK_K": block_k, "num_warps": 4, "num_stages": 2}
    x, r, gu = randn(1, k, dtype=dtype, gen=GEN), randn(1, k, dtype=dtype, gen=GEN), randn(1, 2 * k, dtype=dtype, gen=GEN)
    nw, w, b = randn(k, dtype=dtype, gen=GEN), randn(37, k, dtype=dtype, gen=GEN), randn(37, dtype=dtype, gen=GEN)
    res = [torch.empty_like(x), torch.empty_like(x)]
    got = gemv_rmsnorm(x, nw, 1e-6, w, b, residual=r, residual_out=res[0], config=cfg)
    assert_close(got, gemv_rmsnorm_ref(x, nw, 1e-6, w, b, residual=r, residual_out=res[1]), dtype, scale=4)
    assert torch.equal(res[0], res[1])
    assert_close(gemv_rmsnorm(x, nw, 1e-6, w, config=cfg), gemv_rmsnorm_ref(x, nw, 1e-6, w), dtype, scale=4)
    assert_close(gemv_swiglu(gu, w, config=cfg), gemv_swiglu_ref(gu, w), dtype, scale=4)
