"""The e4m3 bit decode (kernels/e4m3.py) that the FP8-weight kernels take before compute capability 8.9: every
byte as torch converts it, and the FP8 GEMV and W8A16 GEMM with it forced against their references (under the
Triton interpreter on CPU, fp32 and fp16), and on a GPU against the native conversion in bf16."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from hosttune_engine.errors import KernelInputError
from hosttune_engine.kernels import e4m3
from hosttune_engine.kernels.dequant_gemm import w8a16_gemm
from hosttune_engine.kernels.e4m3 import decodes_bits, e4m3_decode, e4m3_decode_ref, native_e4m3
from hosttune_engine.kernels.fp8_gemv import fp8_gemv, fp8_gemv_ref

from .conftest import DEVICE
from .test_kernels_quant import FP8_CASES, _close, _fp8_gemv_config, fp8_weight

GEMM_CONFIG = {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 32, "GROUP_M": 2, "SPLIT_K": 1, "num_warps": 4,
               "num_stages": 1}


def test_the_bit_decode_is_torchs_conversion_for_every_byte():
    """Signed zeros, subnormals (exponent 0), the largest values (+-448) and NaN at 0x7F and 0xFF (e4m3fn has no
    infinities), on this machine's device: by bits also where the native conversion would run."""
    b = torch.arange(256, dtype=torch.uint8, device=DEVICE)
    got, want = e4m3_decode(b).cpu(), e4m3_decode_ref(b).cpu()
    assert torch.equal(got.isnan(), want.isnan()) and got.isnan().nonzero().flatten().tolist() == [0x7F, 0xFF]
    numbers = ~want.isnan()
    assert torch.equal(got[numbers], want[numbers]) and torch.equal(got[numbers].signbit(), want[numbers].signbit())
    assert got[1].item() == 2.0 ** -9 and got[0x7E].item() == 448.0 and got[0x80].item() == 0.0
    with pytest.raises(KernelInputError, match="b has dtype"):
        e4m3_decode(b.float())
    with pytest.raises(KernelInputError, match="b must have 1 dims"):
        e4m3_decode(b.view(16, 16))


def test_the_decode_is_chosen_by_config_or_by_the_gpu(monkeypatch):
    """BITS 1 forces it; a GPU before 8.9 takes it whatever the config says, its capability read once, not at
    every launch."""
    cpu = torch.device("cpu")
    assert native_e4m3(cpu) and not decodes_bits({}, cpu) and decodes_bits({"BITS": 1}, cpu)
    assert not decodes_bits({"BITS": 0}, cpu)
    reads = []
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index: reads.append(index) or (8, 0))
    e4m3._native_on.cache_clear()
    try:
        a100 = torch.device("cuda", 0)
        assert not native_e4m3(a100) and decodes_bits({}, a100) and decodes_bits({"BITS": 0}, a100)
        assert reads == [0]
    finally:
        e4m3._native_on.cache_clear()


@pytest.mark.parametrize("case, dtype", [("block", torch.float32), ("channel", torch.float16)])
@pytest.mark.parametrize("kind", ["plain", "dot"])
def test_fp8_gemv_with_the_bit_decode(case, dtype, kind):
    n, k, block_k, scale_shape, scale_row = FP8_CASES[case]
    w, scale, srow = fp8_weight(n, k, scale_shape, scale_row)
    x, bias = torch.randn(2, k, device=DEVICE).to(dtype), torch.randn(n, device=DEVICE).to(dtype)
    cfg = {**_fp8_gemv_config(kind, 32), "BITS": 1}
    _close(fp8_gemv(x, w, scale, srow, block_k, bias, config=cfg), fp8_gemv_ref(x, w, scale, srow, block_k, bias),
           dtype)


@pytest.mark.parametrize("case, dtype", [("block", torch.float32), ("channel", torch.float16)])
def test_w8a16_gemm_with_the_bit_decode(case, dtype):
    n, k, block_k, scale_shape, scale_row = FP8_CASES[case]
    w, scale, srow = fp8_weight(n, k, scale_shape, scale_row)
    x, bias = torch.randn(19, k, device=DEVICE).to(dtype), torch.randn(n, device=DEVICE).to(dtype)
    got = w8a16_gemm(x, w, scale, srow, block_k, bias, config={**GEMM_CONFIG, "BITS": 1})
    _close(got, fp8_gemv_ref(x, w, scale, srow, block_k, bias), dtype)


def test_the_fp8_weight_kernels_compile_for_an_a100_with_the_bit_decode_only(tmp_path):
    """For sm_80, ahead of time on this machine (PTX and ptxas, no GPU): the decode and every FP8-weight kernel
    build with BITS, and none with Triton's e4m3 type, which is why the plan sets BITS before 8.9."""
    pytest.importorskip("triton.backends.nvidia")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(TRITON_CACHE_DIR=str(tmp_path), TRITON_DEFAULT_FP_FUSION="1")
    done = subprocess.run([sys.executable, "-m", "tests.engine.ahead_of_time", "80"], cwd=Path(__file__).parents[2],
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    built = json.loads(done.stdout)
    assert built["bits"] == dict.fromkeys(built["bits"], "") and len(built["bits"]) == 5
    assert all("fp8e4nv not supported in this architecture" in why for why in built["native"].values())


GPU_GEMV = {  # the GEMV's kinds on a GPU; PACKED (native PTX) is left out with BITS
    "plain": {"BLOCK_N": 8, "BLOCK_K": 256, "num_warps": 4, "num_stages": 2},
    "packed-split": {"BLOCK_N": 8, "BLOCK_K": 256, "PACKED": 1, "SPLIT": 2, "num_warps": 4, "num_stages": 2},
    "dot": {"BLOCK_N": 16, "BLOCK_K": 128, "DOT": 1, "num_warps": 4, "num_stages": 2},
}


@pytest.mark.skipif(DEVICE == "cpu", reason="the native and the bit decode compared on a GPU")
@pytest.mark.parametrize("scales", ["block", "channel"])
def test_the_bit_decode_matches_the_native_conversion_on_gpu(scales):
    """On this GPU, bf16, every FP8 kernel with BITS 1 against the same kernel converting e4m3 natively (where the
    GPU has it: 8.9 on) and against the fp32 reference; the decode itself byte for byte against the GPU's cast."""
    b = torch.arange(256, dtype=torch.uint8, device=DEVICE)
    got, cast = e4m3_decode(b), b.view(torch.float8_e4m3fn).float()
    assert torch.equal(got.isnan(), cast.isnan()) and torch.equal(got.nan_to_num(), cast.nan_to_num())
    n, k, block_k = 256, 1024, 128 if scales == "block" else 1024
    rows = torch.arange(n) // 128 if scales == "block" else torch.arange(n)
    w, scale, srow = fp8_weight(n, k, (int(rows.max()) + 1, k // block_k), rows)
    native = native_e4m3(torch.device(DEVICE))
    for m, fn, configs in ((3, fp8_gemv, GPU_GEMV.values()), (40, w8a16_gemm, [GEMM_CONFIG])):
        x = torch.randn(m, k, device=DEVICE, dtype=torch.bfloat16)
        bias = torch.randn(n, device=DEVICE, dtype=torch.bfloat16)
        want = fp8_gemv_ref(x, w, scale, srow, block_k, bias)
        for cfg in configs:
            by_bits = fn(x, w, scale, srow, block_k, bias, config={**cfg, "BITS": 1})
            _close(by_bits, want, torch.float16)
            if native:
                torch.testing.assert_close(by_bits, fn(x, w, scale, srow, block_k, bias, config=cfg), rtol=1e-2,
                                           atol=1e-2 * want.abs().max().item())
