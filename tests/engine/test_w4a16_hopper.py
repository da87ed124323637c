"""The warpgroup 4-bit GEMM (kernels/w4a16_hopper.py): compiled for Hopper without a GPU in every config the tuner
may try, against the fp32 reference on a Hopper GPU, and the dispatch's fallback where it cannot run."""

import os
import subprocess
import sys
import textwrap

import pytest
import torch

from hosttune_engine.kernels.dequant_gemm import w4a16_gemm
from hosttune_engine.kernels.int4_gemv import int4_gemv_ref

from .conftest import DEVICE
from .sass_hazards import mma_loop_spills, operand_hazards
from .test_kernels_quant import _close, int4_weight

gluon = pytest.importorskip("triton.experimental.gluon", reason="a Triton without Gluon has no Hopper 4-bit GEMM")

ON_HOPPER = DEVICE != "cpu" and torch.cuda.get_device_capability() == (9, 0)

COMPILE_FOR_HOPPER = textwrap.dedent("""
    import json, sys
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource
    from hosttune_engine.kernels.w4a16_hopper import _w4a16_wgmma_kernel, register_cap
    from hosttune_engine.tuner.candidates import wgmma_gemm
    sig = {"x_ptr": "*bf16", "q_ptr": "*i32", "s_ptr": "*fp16", "z_ptr": "*u8", "b_ptr": "*bf16", "y_ptr": "*bf16",
           "ws_ptr": "*fp32", "cnt_ptr": "*i32", "M": "i32", "N": "i32", "K": "i32", "stride_xm": "i32",
           "stride_qn": "i32", "stride_ym": "i32",
           "MAGIC": "i32"}
    names = list(sig)
    aligned = ("x_ptr", "q_ptr", "s_ptr", "z_ptr", "b_ptr", "y_ptr", "ws_ptr", "N", "K", "stride_xm", "stride_qn",
               "stride_ym")
    attrs = {(names.index(a),): [["tt.divisibility", 16]] for a in aligned}
    compiled = 0
    rows = int(sys.argv[2])
    for cfg in wgmma_gemm(rows):
        if cfg["SPLIT_K"] > 2 or {**cfg, "num_stages": cfg["num_stages"] + 1} in wgmma_gemm(rows):
            continue  # more splits change nothing compiled; fewer stages take less shared memory
        const = {"HAS_BIAS": True, "GROUP": 128, "BLOCK_M": cfg["BLOCK_M"],
                 "BLOCK_N": cfg["BLOCK_N"], "BLOCK_K": cfg["BLOCK_K"], "SPLIT_K": cfg["SPLIT_K"],
                 "STAGES": cfg["num_stages"], "A_REGS": cfg["REGS"], "SPLIT_SCALE": True,
                 "OVERLAP": cfg.get("OVERLAP", 0)}
        src = GluonASTSource(_w4a16_wgmma_kernel, {**sig, **{k: "constexpr" for k in const}}, constexprs=const,
                             attrs=attrs)
        options = {"num_warps": cfg["num_warps"], "maxnreg": register_cap(cfg) if cfg["REGS"] else None}
        k = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options)
        compiled += 1
        cubin = f"{sys.argv[1]}/{compiled}.cubin"
        with open(cubin, "wb") as f:
            f.write(k.asm["cubin"])
        print(json.dumps({"cfg": cfg, "shared": k.metadata.shared, "cubin": cubin,
                          "wgmma": k.asm["ptx"].count("wgmma.mma_async")}))
""")


@pytest.mark.parametrize("rows", [8, 64, 256])  # x's tile of 8, 64 and 128 rows
def test_every_tuner_config_compiles_for_hopper_and_fits(tmp_path, rows):
    """What only the compiler rejects (a layout it cannot lower, shared memory past the SM's 227 KB) would first
    fail in a tune on the GPU, and what it accepts but gets wrong (registers spilled, an MMA's register operand
    overwritten while it runs) would be slow or wrong there. Compiling and reading the SASS need no GPU. Each
    tile shape at the most stages the grid takes, with and without split K, with and without REGS, in one child
    (its imports once)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", COMPILE_FOR_HOPPER, str(tmp_path), str(rows)], env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    import json

    kernels = [json.loads(line) for line in done.stdout.splitlines()]
    assert {k["cfg"]["REGS"] for k in kernels} == {0, 1}
    for k in kernels:
        assert k["wgmma"] > 0, k
        assert k["shared"] <= 227 * 1024, k
        if k["cfg"]["REGS"]:
            sass, usage = _cuobjdump(k["cubin"], "-sass"), _cuobjdump(k["cubin"], "-res-usage")
            assert "HGMMA" in sass and not operand_hazards(sass), (k, [str(h) for h in operand_hazards(sass)][:5])
            # under the register cap the compiler may spill, but only outside the K loop (once an output tile)
            assert mma_loop_spills(sass) == 0, (k, usage)


def _cuobjdump(cubin: str, what: str) -> str:
    import triton

    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    return subprocess.run([tool, what, cubin], capture_output=True, text=True, check=True).stdout


def test_operand_hazards_reads_a_write_under_an_mma_in_flight():
    """The SASS reader on a loop that rewrites the MMA's operand registers after a wait that leaves one group
    in flight (what ptxas made of the register-operand kernel before its wait came first), and on the same loop
    waiting for all."""
    loop = """
        /*0100*/                   HFMA2.BF16_V2 R40, R40, R111, R14 ;
        /*0110*/                   WARPGROUP.ARRIVE ;
        /*0120*/                   HGMMA.64x16x16.F32.BF16 R32, R40, gdesc[UR12], R32 ;
        /*0130*/                   HGMMA.64x16x16.F32.BF16 R32, R44, gdesc[UR16], R32, gsb0 ;
        /*0140*/                   WARPGROUP.DEPBAR.LE gsb0, 0x{keep} ;
        /*0150*/              @P5 BRA 0x100 ;
        /*0160*/                   EXIT ;"""
    found = operand_hazards(loop.format(keep=1))
    assert [(h.address, h.opcode, h.registers) for h in found] == [(0x100, "HFMA2.BF16_V2", (40,))]
    assert operand_hazards(loop.format(keep=0)) == []


def test_operand_hazards_walks_a_loop_inside_a_loop():
    """An MMA left in flight by an inner loop meets the write at the top of the outer loop's next pass; waited
    for before the inner loop exits, nothing is in flight there."""
    loop = """
        /*0100*/                   IMAD R40, R2, R3, RZ ;
        /*0110*/                   HFMA2.BF16_V2 R41, R41, R111, R14 ;
        /*0120*/                   WARPGROUP.ARRIVE ;
        /*0130*/                   HGMMA.64x16x16.F32.BF16 R32, R40, gdesc[UR12], R32, gsb0 ;
        /*0140*/                   WARPGROUP.DEPBAR.LE gsb0, 0x1 ;
        /*0150*/              @P5 BRA 0x110 ;
        /*0160*/                   WARPGROUP.DEPBAR.LE gsb0, 0x{keep} ;
        /*0170*/              @P6 BRA 0x100 ;
        /*0180*/                   EXIT ;"""
    found = operand_hazards(loop.format(keep=1))
    assert {(h.address, h.opcode) for h in found} == {(0x100, "IMAD"), (0x110, "HFMA2.BF16_V2")}
    assert {(h.address, h.opcode) for h in operand_hazards(loop.format(keep=0))} == {(0x110, "HFMA2.BF16_V2")}


def test_wgmma_config_off_hopper_takes_the_dequantizing_path():
    """A table tuned on a Hopper GPU, read on a machine where the kernel cannot run: the same result, through
    the weight dequantized and multiplied by torch."""
    if ON_HOPPER:
        pytest.skip("on Hopper the kernel itself runs")
    q, s, z, perm = int4_weight(40, 256, 64, True)
    x = torch.randn(5, 256, device=DEVICE)
    cfg = {"WGMMA": 1, "BLOCK_M": 16, "BLOCK_N": 128, "BLOCK_K": 128, "SPLIT_K": 1, "num_warps": 4, "num_stages": 3}
    got = w4a16_gemm(x, q, s, z, perm, 64, config=cfg)
    assert torch.equal(got, w4a16_gemm(x, q, s, z, perm, 64, config={"DEQUANT": 1}))
    _close(got, int4_gemv_ref(x, q, s, z, perm, 64), torch.float32)


def test_overlap_configs_copy_at_least_one_tile_ahead():
    """The next tile started under the last one's MMA copies STAGES - 2 tiles ahead: the tuner offers it only with
    the register operand and three stages or more, and a table that asks it at two stages is refused at launch,
    before anything runs, rather than copied zero tiles ahead."""
    from hosttune_engine.errors import KernelInputError
    from hosttune_engine.kernels.w4a16_hopper import launch
    from hosttune_engine.tuner.candidates import wgmma_gemm

    overlap = [c for rows in (64, 128, 256) for c in wgmma_gemm(rows) if c.get("OVERLAP")]
    assert overlap and all(c["REGS"] and c["num_stages"] >= 3 and c["BLOCK_M"] >= 64 for c in overlap)
    assert not any(c.get("OVERLAP") for c in wgmma_gemm(16))
    assert any(c["BLOCK_M"] == 256 for c in overlap)  # the whole-batch tile too
    q, s, z, _ = int4_weight(64, 256, 64, False)
    x = torch.zeros(4, 256, dtype=torch.bfloat16)
    cfg = {"WGMMA": 1, "REGS": 1, "BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 128, "SPLIT_K": 1, "num_warps": 4,
           "num_stages": 2, "OVERLAP": 1}
    with pytest.raises(KernelInputError, match="OVERLAP copies STAGES - 2 tiles ahead: it needs 3 stages or more, "
                                               "got 2"):
        launch(x, q, s.to(torch.bfloat16), z, 64, None, torch.empty(4, 64, dtype=torch.bfloat16), None, cfg)


BF16, F16 = torch.bfloat16, torch.float16


@pytest.mark.skipif(not ON_HOPPER, reason="the warpgroup MMA needs an sm_90 GPU")
@pytest.mark.parametrize("n, k, m, group, act_order, dtype, cfg", [
    (200, 512, 16, 128, False, BF16, (16, 128, 128, 1, 4, 3)),  # a ragged last weight tile
    (256, 1024, 37, 64, True, BF16, (64, 128, 128, 3, 4, 4)),  # two groups a tile, split K, act-order
    (4608, 3584, 64, 128, False, BF16, (64, 256, 128, 2, 8, 3)),  # two warpgroups
    (1024, 3584, 48, 128, False, BF16, (64, 128, 256, 1, 4, 3)),  # a tile of two groups
    (384, 2048, 200, 128, True, F16, (128, 128, 128, 1, 4, 3)),  # two row tiles, the last ragged; fp16
    (128, 1536, 5, 256, False, BF16, (8, 64, 128, 4, 4, 4)),  # a tile inside a group; splits of unequal tiles
    (96, 640, 24, 128, False, BF16, (32, 64, 128, 8, 4, 2)),  # more splits than the program has tiles
    (640, 1024, 64, 128, False, BF16, (64, 128, 128, 2, 8, 4)),  # a warpgroup each 64 of 128 weight rows
    (384, 1024, 200, 128, True, BF16, (256, 128, 128, 1, 8, 2)),  # every row of x in one program's tile, ragged
    (320, 2048, 128, 128, False, BF16, (128, 64, 128, 4, 4, 2)),  # 64 accumulator registers a thread, split K
    (384, 3072, 100, 128, True, BF16, (128, 128, 128, 4, 8, 2)),  # the same on two warpgroups, act-order, ragged
    (320, 2048, 128, 128, False, BF16, (128, 64, 128, 1, 4, 3, 1)),  # the next tile under the last one's MMA
    (384, 3072, 256, 128, True, BF16, (256, 128, 128, 2, 8, 3, 1)),  # the same, whole batch, two warpgroups, split
    (256, 1024, 96, 128, False, F16, (128, 128, 128, 1, 8, 4, 1)),  # the same, two tiles copied ahead, fp16
])
@pytest.mark.parametrize("regs, scales", [(0, "x"), (1, "x"), (1, "fp16")])  # fp16 scales: bf16's split in two
def test_wgmma_gemm_on_hopper(n, k, m, group, act_order, dtype, cfg, regs, scales):
    q, s, z, perm = int4_weight(n, k, group, act_order)
    q = torch.randint(-2**31, 2**31 - 1, q.shape, device=DEVICE, dtype=torch.int32)  # every nibble value, sign bit
    x = torch.randn(m, k, device=DEVICE).to(dtype)
    bias = torch.randn(n, device=DEVICE).to(dtype)
    block_m, block_n, block_k, split, warps, stages, *overlap = cfg
    if overlap and not regs:
        pytest.skip("OVERLAP is a variant of the register-operand loop")
    config = {"WGMMA": 1, "REGS": regs, "BLOCK_M": block_m, "BLOCK_N": block_n, "BLOCK_K": block_k, "SPLIT_K": split,
              "num_warps": warps, "num_stages": stages, "OVERLAP": overlap[0] if overlap else 0}
    s = s.to(dtype if scales == "x" else F16)
    got = w4a16_gemm(x, q, s, z, perm, group, bias, config=config)
    _close(got, int4_gemv_ref(x, q, s, z, perm, group, bias), F16)


def test_paired_unpacking_rounds_as_the_reference():
    """The register-operand kernel's arithmetic for bf16 activations and fp16 scales (`_PAIRS`: t = q - zero,
    then t * high + (t * low), each instruction rounding once), over every finite fp16 scale and every t: the low
    product is exact, the sum is t * scale exactly, so the one rounding left is the reference's."""
    bits = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16)
    s = bits.view(F16).float()
    s = s[torch.isfinite(s)]
    t = torch.arange(-15, 16).float()[:, None]
    high = s.to(BF16).float()
    low = (s - high).to(BF16).float()
    assert torch.equal(low, s - high)  # the scale is exactly high + low
    product = t * low
    assert torch.equal(product.to(BF16).float(), product)  # mul.rn: exact
    total = t * high + product
    assert torch.equal(total.double(), t.double() * s.double())  # fma's exact sum, before its one rounding
    assert torch.equal(total.to(BF16), (t * s).to(BF16))  # bit for bit but a zero's sign: the same products
