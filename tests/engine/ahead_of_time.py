"""Compiles the FP8-weight kernels for a GPU this machine need not have (Triton's ahead-of-time path: PTX, then
ptxas, no driver), with the e4m3 bit decode and with the native e4m3 type, and prints what built as JSON.

It runs in its own interpreter: the engine tests import the kernels under TRITON_INTERPRET=1, where `triton.jit`
makes functions that only the interpreter runs.
Example: python -m tests.engine.ahead_of_time 80
"""

from __future__ import annotations

import json
import sys

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from hosttune_engine.kernels import dequant_gemm, e4m3, fp8_gemv
from hosttune_engine.kernels.gemv import RMSNORM_RESIDUAL

ACTIVATIONS = {name: "*bf16" for name in ("x_ptr", "b_ptr", "y_ptr", "r_ptr", "nw_ptr", "res_out_ptr")}
SCALES = {"s_ptr": "*fp32", "srow_ptr": "*i32", "part_ptr": "*fp32", "cnt_ptr": "*i32", "ws_ptr": "*fp32",
          "eps": "fp32"}


def _kernels(bits: bool) -> dict[str, tuple]:
    """name -> (kernel, pointer and float argument types, constexprs): each FP8-weight kernel as the engine
    launches it in bf16 (the GEMV with its RMSNorm prologue and split K too)."""
    w = {"w_ptr": "*u8" if bits else "*fp8e4nv"}
    gemv = dict(M=1, HAS_BIAS=True, SCALE_K=0, SUB=1, EVEN_K=True, PROLOGUE=0, XB=False, UNROLL=1, PIPE=None, SPLIT=1,
                PACKED=False, BITS=bits, BLOCK_N=8, BLOCK_K=512)
    return {
        "fp8_gemv": (fp8_gemv._fp8_gemv_kernel, w, gemv),
        "fp8_gemv block scales, RMSNorm, split": (fp8_gemv._fp8_gemv_kernel, w, {
            **gemv, "SCALE_K": 128, "SUB": 4, "PROLOGUE": RMSNORM_RESIDUAL, "XB": True, "SPLIT": 2, "UNROLL": 2}),
        "fp8_gemv on the tensor cores": (fp8_gemv._fp8_gemv_dot_kernel, w, dict(
            M=2, HAS_BIAS=False, ROW_SCALE=False, EVEN_K=True, PROLOGUE=0, BITS=bits, BLOCK_N=16, BLOCK_K=128,
            PRECISION="tf32")),
        "w8a16_gemm": (dequant_gemm._w8a16_kernel, w, dict(
            HAS_BIAS=False, ROW_SCALE=False, BITS=bits, BLOCK_M=64, BLOCK_N=128, BLOCK_K=64, GROUP_M=8, SPLIT_K=1,
            PRECISION="tf32")),
    }


def _compile(fn, types: dict, constexprs: dict, capability: int) -> str:
    """'' where it builds, else the compiler's last line."""
    types = {**ACTIVATIONS, **SCALES, **types}
    signature = {a: "constexpr" if a in constexprs else types.get(a, "i32") for a in fn.arg_names}
    try:
        triton.compile(ASTSource(fn, signature, constexprs=constexprs), target=GPUTarget("cuda", capability, 32))
    except Exception as e:  # noqa: BLE001 (a compile error of any kind is the answer)
        return (str(e).strip().splitlines() or [type(e).__name__])[-1]
    return ""


def compile_all(capability: int) -> dict[str, dict[str, str]]:
    """{"bits" | "native": {kernel: '' or why it did not build}}."""
    decode = (e4m3._decode_kernel, {"b_ptr": "*u8", "y_ptr": "*fp32"}, {"BLOCK": 1024})
    out = {"bits": {"e4m3 decode": _compile(*decode, capability)}, "native": {}}
    for bits, key in ((True, "bits"), (False, "native")):
        for name, (fn, types, constexprs) in _kernels(bits).items():
            out[key][name] = _compile(fn, types, constexprs, capability)
    return out


if __name__ == "__main__":
    print(json.dumps(compile_all(int(sys.argv[1]))))
