"""e4m3 (torch.float8_e4m3fn) weights decoded by integer operations, for GPUs whose Triton has no e4m3 type.

Triton's e4m3 type (tl.float8e4nv) compiles from compute capability 8.9 (Ada, Hopper) only. Before that, on
Ampere (an A100, A10, A30), the FP8-weight kernels (kernels/fp8_gemv.py, the W8A16 GEMM of
kernels/dequant_gemm.py) take the weights' bytes as uint8 and decode them here, W8A16 as Marlin-class kernels
do: a byte's sign, 4-bit exponent (bias 7) and 3-bit mantissa move into an fp16's fields (exponent bias 15),
which reads the value times 2^-8, e4m3's subnormals (exponent 0) included as fp16 subnormals; converted to
fp32 (exact) and times 2^8 it is the e4m3 value. e4m3fn has no infinities: 0x7F and 0xFF are NaN. From 8.9 on
the kernels keep the native conversion, which converts two weights an instruction.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from hosttune_engine.kernels.checks import check, check_tensor

E4M3 = torch.float8_e4m3fn
NATIVE = (8, 9)  # the first compute capability Triton compiles e4m3 for
BLOCK = 1024


@triton.jit
def e4m3_bits_to_f32(b):
    """e4m3 bytes (uint8, any shape) -> their values in fp32, exactly."""
    b = b.to(tl.int32)  # zero-extended
    h = ((b & 0x80) << 8) | ((b & 0x7F) << 7)  # the fp16 of value * 2^-8: sign; exponent and mantissa, shifted
    v = h.to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32) * 256.0
    return tl.where((b & 0x7F) == 0x7F, float("nan"), v)


@triton.jit
def e4m3_to(w, dtype: tl.constexpr, BITS: tl.constexpr):
    """A weight tile as loaded -> `dtype` (exact in fp32, bf16 and fp16): uint8 bytes decoded with BITS, else
    e4m3 converted natively."""
    if BITS:
        return e4m3_bits_to_f32(w).to(dtype)
    else:
        return w.to(dtype)


@triton.jit
def _decode_kernel(b_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(y_ptr + offs, e4m3_bits_to_f32(tl.load(b_ptr + offs, mask=mask, other=0)), mask=mask)


def native_e4m3(device: torch.device) -> bool:
    """Whether Triton compiles e4m3 for `device` (the CPU's interpreter converts it too)."""
    return device.type != "cuda" or _native_on(torch.cuda.current_device() if device.index is None else device.index)


@functools.cache
def _native_on(index: int) -> bool:  # asked at every launch of an FP8-weight kernel: the capability read once
    return torch.cuda.get_device_capability(index) >= NATIVE


def decodes_bits(config: dict, device: torch.device) -> bool:
    """Whether an FP8-weight kernel decodes its weights by bits: where its config says BITS 1 (the kernel plan's
    choice before 8.9, or a test's), or where e4m3 does not compile whatever the config says."""
    return bool(config.get("BITS")) or not native_e4m3(device)


def weight_operand(w: torch.Tensor, bits: bool) -> torch.Tensor:
    """An e4m3 weight as its kernel takes it: its bytes (uint8, the same storage) for the bit decode."""
    return w.view(torch.uint8) if bits else w


def e4m3_decode(b: torch.Tensor) -> torch.Tensor:
    """e4m3 bytes b [n] (contiguous uint8) -> fp32 values [n], by the kernels' bit decode."""
    check_tensor("b", b, 1, dtypes=(torch.uint8,))
    check(b.is_contiguous(), "b must be contiguous")
    y = torch.empty(b.shape, dtype=torch.float32, device=b.device)
    if b.numel():
        _decode_kernel[(triton.cdiv(b.numel(), BLOCK),)](b, y, b.numel(), BLOCK=BLOCK)
    return y


def e4m3_decode_ref(b: torch.Tensor) -> torch.Tensor:
    """torch's own conversion of the same bytes."""
    return b.view(E4M3).float()
