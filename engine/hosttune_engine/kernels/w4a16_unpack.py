"""How the Hopper 4-bit GEMM (kernels/w4a16_hopper.py) turns a tile's packed words, zeros and scales into weights:
in fp32 for a tile stored to shared memory (`dequantized`), or two weights an instruction straight into the
warpgroup MMA's register operand (`unpacked_step`), rounding as `dequantize_ref` does either way."""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl


@gluon.constexpr_function
def unpack_layout(block_k, num_warps):
    """[rows, blocks, nibble i, word j]: a thread owns a row's whole pack block (64 consecutive columns)."""
    blocks = block_k // 64
    return gl.BlockedLayout([1, 1, 8, 8], [32 // blocks, blocks, 1, 1], [num_warps, 1, 1, 1], [3, 2, 1, 0])


@gluon.jit
def group_params(z_ptr, s_ptr, rows_g, n_mask, k0, K, GROUP: gl.constexpr, BLOCK_K: gl.constexpr,
                 layout: gl.constexpr):
    """(2^23 + zero, scale) per row and pack block of the tile, fp32 [BLOCK_N, BLOCKS] (`tile_params`' loads)."""
    z, s = tile_params(z_ptr, s_ptr, rows_g, n_mask, k0, K, GROUP, BLOCK_K, layout)
    return 8388608.0 + z.to(gl.float32), s.to(gl.float32)


@gluon.jit
def dequantized(words, c, s, magic, dtype: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr,
                layout: gl.constexpr):
    """words [BLOCK_N, BLOCKS, 8] -> W [BLOCK_N, BLOCK_K] in `dtype`, column order: nibble i of word j is column
    64 b + 8 i + j. As kernels/int4_gemv.py's `_magic`, with no shifts: nibble i = 4 h + e, masked in place in
    the word (h = 0) or its top half (h = 1) and ORed into 2^23's mantissa, is the fp32 2^23 + q 16^e; less
    c 16^e (c = 2^23 + zero) that is (q - zero) 16^e exactly, and times scale / 16^e the value the reference
    rounds, rounded once. `magic` is 0x4B000000 (2^23's bits), passed at run time so the mask and the OR are one
    LOP3 (two constants would be two)."""
    nib = gl.arange(0, 8, layout=gl.SliceLayout(0, gl.SliceLayout(1, gl.SliceLayout(3, layout))))
    nib = gl.expand_dims(gl.expand_dims(gl.expand_dims(nib, 0), 1), 3)  # [1, 1, 8, 1], constant a register
    e = (nib % 4) * 4
    p = gl.expand_dims(words, 2)  # [BLOCK_N, BLOCKS, 1, 8]
    q = (gl.where(nib >= 4, p >> 16, p) & (15 << e)) | magic  # [BLOCK_N, BLOCKS, 8, 8]
    pow16 = (1 << e).to(gl.float32)
    c4 = gl.expand_dims(gl.expand_dims(c, 2), 2)  # [BLOCK_N, BLOCKS, 1, 1]
    s4 = gl.expand_dims(gl.expand_dims(s, 2), 2)
    zero = 8388608.0 + (c4 - 8388608.0) * pow16
    w = ((q.to(gl.float32, bitcast=True) - zero) * (s4 * (1.0 / pow16))).to(dtype)
    return gl.reshape(w, [BLOCK_N, BLOCK_K])


@gluon.constexpr_function
def step_layout(block_n, num_warps):
    """[rows, nibble i's low bit, word j] of one 16-column step of a pack block (its columns 16 s + 8 i' + j hold
    nibble 2 s + i' of word j), laid out so that its reshape to [rows, 16] is the warpgroup MMA's register operand
    for a [16 * num_warps, 16] instruction: per thread a pair of columns (j's low bit) of rows r and r + 8, and
    both nibbles, in registers; lanes over j's other bits (the quad's t) and r; warps over 16-row slices; then
    further 16 * num_warps-row repetitions in registers."""
    def log2(v):
        return v.bit_length() - 1

    warp_rows = 16 * num_warps
    regs = [[0, 0, 1], [8, 0, 0], [0, 1, 0]] + [[warp_rows << r, 0, 0] for r in range(log2(block_n // warp_rows))]
    lanes = [[0, 0, 2], [0, 0, 4], [1, 0, 0], [2, 0, 0], [4, 0, 0]]
    warps = [[16 << w, 0, 0] for w in range(log2(num_warps))]
    return gl.DistributedLinearLayout(regs, lanes, warps, [], [block_n, 2, 8])


@gluon.constexpr_function
def params_layout(block_n, block_k, num_warps):
    """[rows, pack blocks] of a tile's zeros or scales: the rows as `step_layout` holds them, a thread's rows'
    blocks all in its registers."""
    def log2(v):
        return v.bit_length() - 1

    warp_rows = 16 * num_warps
    regs = [[0, 1 << b] for b in range(log2(block_k // 64))] + [[8, 0]]
    regs += [[warp_rows << r, 0] for r in range(log2(block_n // warp_rows))]
    lanes = [[0, 0], [0, 0], [1, 0], [2, 0], [4, 0]]
    warps = [[16 << w, 0] for w in range(log2(num_warps))]
    return gl.DistributedLinearLayout(regs, lanes, warps, [], [block_n, block_k // 64])


@gluon.jit
def tile_params(z_ptr, s_ptr, rows_g, n_mask, k0, K, GROUP: gl.constexpr, BLOCK_K: gl.constexpr,
                layout: gl.constexpr):
    """The zeros and scales [BLOCK_N, BLOCKS] of the tile at k0 as stored (a tile past K reads the last group's)."""
    blocks = gl.arange(0, BLOCK_K // 64, layout=gl.SliceLayout(0, layout))
    groups = gl.minimum(k0 + blocks * 64, K - 1) // GROUP
    offs = rows_g[:, None] + groups[None, :]
    return gl.load(z_ptr + offs, mask=n_mask[:, None], other=0), gl.load(s_ptr + offs, mask=n_mask[:, None], other=0.0)


@gluon.jit
def block(v, b: gl.constexpr, layout: gl.constexpr, rows_l: gl.constexpr):
    """Column b of the int32 v [BLOCK_N, BLOCKS] (`layout`: a thread holds its rows' every column), [BLOCK_N]: the
    sum of the one column the mask keeps, which the compiler reduces to that column's registers."""
    blocks = gl.arange(0, v.shape[1], layout=gl.SliceLayout(0, layout))
    col = gl.sum(gl.where((blocks == b)[None, :], v, 0), axis=1)
    return gl.convert_layout(col, rows_l, assert_trivial=True)


@gluon.jit
def pair_params(z, s, dtype: gl.constexpr):
    """Zeros and scales as stored [BLOCK_N, BLOCKS] -> each twice in one int32: `dtype`'s MAGIC + zero (what a
    nibble ORed into MAGIC's mantissa is, less its zero), and the scale split into a `dtype` high part and the low
    part the high part misses (zero where the scale is already `dtype`)."""
    s = s.to(gl.float32)
    s_hi = s.to(dtype)
    magic: gl.constexpr = 128.0 if dtype == gl.bfloat16 else 1024.0
    return twice(magic + z.to(gl.float32), dtype), twice(s_hi, dtype), twice(s - s_hi.to(gl.float32), dtype)


@gluon.jit
def twice(v, dtype: gl.constexpr):
    """v as `dtype`, in both halves of an int32 (the packed instructions' operand)."""
    h = v.to(dtype).to(gl.int16, bitcast=True).to(gl.int32) & 0xFFFF
    return h | (h << 16)


# Two weights an instruction. Words 2 t and 2 t + 1 of a pack block hold, at nibble i, columns 8 i + 2 t and
# 8 i + 2 t + 1: the pair the MMA's operand keeps in one register. `_HALVES` puts the two words' low halves in one
# word and their high halves in the other, once a block; then for nibble i = 4 h + e, `_PAIRS` takes half h's word
# ($1 or $2), shr brings nibble e to the bottom of each half ($3), lop3 masks it into MAGIC's mantissa (bf16 0x4300 =
# 128 + q, fp16 0x6400 = 1024 + q, exact), sub takes MAGIC + zero ($5, exact: small integers), and the product with
# the scale rounds once as the reference's fp32 (q - zero) * scale does: t * high ($7) plus t * low ($9), whose
# product is exact (a 4-bit t times the 3 bits a 16-bit scale keeps past the high part).
_HALVES = gl.constexpr("prmt.b32 $0, $2, $3, 0x5410;\nprmt.b32 $1, $2, $3, 0x7632;")
_PAIRS = """{
.reg .b32 t, u;
shr.u32 t, HALF, $3;
lop3.b32 t, t, 0x000F000F, MAGIC2, 0xea;
sub.rn.TY t, t, $5;
PRODUCT
}"""


_PAIRS_ASM = {(ty, split, h): _PAIRS.replace("PRODUCT", product).replace("MAGIC2", magic).replace("TY", ty)
              .replace("HALF", "$2" if h else "$1")
              for ty, magic in (("bf16x2", "0x43004300"), ("f16x2", "0x64006400"))
              for split, product in ((False, "mul.rn.TY $0, t, $7;"),
                                     (True, "mul.rn.TY u, t, $9;\nfma.rn.TY $0, t, $7, u;"))
              for h in (0, 1)}


@gluon.constexpr_function
def pairs_asm(dtype, split_scale, half):
    return _PAIRS_ASM["bf16x2" if dtype == gl.bfloat16 else "f16x2", bool(split_scale), half]


@gluon.jit
def halves(words):
    """words [BLOCK_N, 8] of a pack block -> at word 2 t both words' low halves, at 2 t + 1 their high halves."""
    return gl.inline_asm_elementwise(_HALVES, "=r,=r,r,r", [words], dtype=gl.int32, is_pure=True, pack=2)


@gluon.jit
def unpacked_step(halves, c, s_hi, s_lo, STEP: gl.constexpr, dtype: gl.constexpr, SPLIT_SCALE: gl.constexpr,
                  BLOCK_N: gl.constexpr, layout: gl.constexpr, operand: gl.constexpr):
    """Columns 16 STEP to 16 STEP + 15 of a pack block (nibbles 2 STEP and 2 STEP + 1 of its words) -> W [BLOCK_N,
    16] in `dtype`, in the MMA's register operand layout, by `_PAIRS`."""
    low = gl.arange(0, 2, layout=gl.SliceLayout(0, gl.SliceLayout(2, layout)))
    shift = gl.expand_dims(gl.expand_dims((2 * (STEP % 2) + low) * 4, 0), 2)  # [1, 2, 1], constant a register
    halves = gl.expand_dims(halves, 1)
    c = gl.expand_dims(gl.expand_dims(c, 1), 1)  # [BLOCK_N, 1, 1]
    s_hi = gl.expand_dims(gl.expand_dims(s_hi, 1), 1)
    s_lo = gl.expand_dims(gl.expand_dims(s_lo, 1), 1)
    asm: gl.constexpr = pairs_asm(dtype, SPLIT_SCALE, STEP // 2)
    args = [halves, shift, c, s_hi, s_lo]
    if dtype == gl.bfloat16:  # (the op takes a dtype, not a constexpr holding one)
        w = gl.inline_asm_elementwise(asm, "=r" + ",r" * 10, args, dtype=gl.bfloat16, is_pure=True, pack=2)
    else:
        w = gl.inline_asm_elementwise(asm, "=r" + ",r" * 10, args, dtype=gl.float16, is_pure=True, pack=2)
    return gl.convert_layout(gl.reshape(w, [BLOCK_N, 16]), operand, assert_trivial=True)
