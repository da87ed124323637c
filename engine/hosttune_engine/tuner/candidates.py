"""Each tunable kernel's candidate launch configs: grids swept on the H200 (the configs that won there and the
ones near them), the kernel's default, and every config a shipped table holds for it on any GPU, first, so a
short budget on a new GPU starts from what is fast elsewhere."""

from __future__ import annotations

import json

from hosttune_engine.kernels import tuning

def _grid(keys, rows) -> list[dict]:
    return [dict(zip(keys, r)) for r in rows]


_GEMV_KEYS = ("BLOCK_N", "BLOCK_K", "num_warps", "num_stages", "FUSE")  # FUSE 0: the prologue's own kernels first


def _variants(rows, unrolls=(1, 2), xb: int = 1) -> list[dict]:
    """GEMV configs with the K loop unrolled; for the FP8 GEMV also the input in the weight tile's layout (XB: what
    the unfused FUSE 0 GEMVs can take)."""
    extra = {"XB": 1} if xb else {}
    return [{**c, **extra, "UNROLL": u} for c in _grid(_GEMV_KEYS, rows) for u in unrolls]


def _split(rows, unrolls, splits=(2, 4)) -> list[dict]:
    """GEMV configs with K split across programs (kernels/gemv_splits.py): for the projections with few rows."""
    return [{**c, "SPLIT": k} for c in _variants(rows, unrolls, xb=0) for k in splits]


def _piped(rows, xb: int, stages=(3, 4)) -> list[dict]:
    """GEMV configs whose K loop is software-pipelined (PIPE: every load of the loop, not only a dot's, through
    shared memory that many tiles ahead)."""
    return [{**c, "PIPE": p} for c in _variants(rows, (1,), xb=xb) for p in stages]


_FP8_SPLIT = [(4, 1024, 4, 3, 0), (8, 512, 4, 3, 0), (16, 512, 8, 3, 0)]
_FP8_ROWS = [(16, 512, 8, 3, 1), (8, 512, 4, 4, 1), (4, 1024, 4, 3, 1), (4, 512, 4, 4, 1), (16, 256, 4, 3, 1),
             (8, 1024, 8, 3, 1), (16, 512, 8, 3, 0), (4, 1024, 4, 3, 0)]
_FP8_PLAIN = [(16, 512, 8, 3, 0), (4, 1024, 4, 3, 0), (8, 512, 4, 3, 0), (8, 1024, 8, 3, 0), (32, 256, 8, 3, 0),
              (16, 1024, 8, 3, 0), (4, 2048, 8, 3, 0), (32, 512, 8, 3, 0)]
_FP8_PACKED = [(32, 512, 4, 3, 0), (64, 256, 4, 3, 0), (16, 1024, 4, 3, 0), (32, 512, 8, 3, 0), (16, 512, 4, 3, 0),
               (32, 1024, 8, 3, 0), (64, 512, 8, 3, 0), (16, 256, 4, 3, 0), (32, 512, 4, 3, 1), (16, 512, 4, 3, 1)]
FP8_GEMV = ([{**c, "DOT": 0} for c in (
    _grid(_GEMV_KEYS, _FP8_ROWS) + _variants(_FP8_PLAIN) + _variants(_FP8_PLAIN[:3], unrolls=(4,))
    + _variants(_FP8_ROWS[:2], xb=0) + _split(_FP8_SPLIT, (1,)))]
    + [{**c, "DOT": 1} for c in _grid(_GEMV_KEYS, [(32, 256, 4, 3, 1)])]
    + [{**c, "DOT": 0, "PACKED": 1}
       for c in _variants(_FP8_PACKED, xb=0) + _split(_FP8_PACKED[:2] + [(16, 512, 4, 3, 0)], (1,))]
    + [{**c, "DOT": 0} for c in _piped(_FP8_PLAIN[:3] + [(4, 512, 4, 3, 0)], xb=1)]
    + [{**c, "DOT": 0, "PACKED": 1} for c in _piped(_FP8_PACKED[:4], xb=0)])
_INT4_ROWS = [(4, 1024, 4, 2, 1), (4, 512, 4, 3, 1), (8, 1024, 8, 2, 1), (8, 512, 4, 3, 1), (16, 512, 4, 2, 1),
              (16, 1024, 4, 2, 1), (8, 128, 1, 4, 1), (16, 128, 2, 4, 1), (32, 128, 4, 3, 1), (4, 1024, 4, 3, 1),
              (4, 1024, 4, 2, 0), (8, 512, 4, 3, 0), (16, 1024, 4, 2, 0), (8, 128, 1, 4, 0)]
_INT4_PACKED = [(16, 1024, 4, 2, 0), (8, 512, 4, 3, 0), (16, 512, 4, 2, 0), (32, 512, 8, 2, 0), (8, 1024, 4, 2, 0),
                 (4, 1024, 4, 2, 0), (32, 256, 4, 2, 0), (16, 1024, 4, 2, 1), (8, 512, 4, 3, 1)]
_INT4_PACKED_MORE = [(16, 512, 4, 2, 0), (32, 512, 4, 2, 0), (16, 256, 4, 2, 0), (64, 256, 8, 2, 0), (8, 256, 2, 2, 0)]
INT4_GEMV = (_grid(_GEMV_KEYS, _INT4_ROWS) + _variants(_INT4_ROWS[-4:-1], xb=0)
             + [{**c, "PACKED": 1} for c in _variants(_INT4_PACKED, xb=0) + _variants(_INT4_PACKED_MORE, (2, 4), xb=0)
                + _split(_INT4_PACKED_MORE[:2] + [(8, 512, 4, 3, 0)], (4,))
                + _piped(_INT4_PACKED_MORE[:3] + [(16, 1024, 4, 2, 0)], xb=0)
                + [{**c, "PIPE": 3} for c in _split(_INT4_PACKED_MORE[:2], (1,))]])
_GEMM_KEYS = ("BLOCK_M", "BLOCK_N", "BLOCK_K", "SPLIT_K", "num_warps", "num_stages")
GEMM_FEW_ROWS = [{**c, "GROUP_M": 8} for c in _grid(_GEMM_KEYS, [  # 64 rows: memory-bound, few output tiles
    (64, 64, 128, 1, 4, 3), (64, 128, 64, 1, 4, 4), (32, 64, 128, 1, 4, 4), (64, 64, 128, 2, 4, 3),
    (64, 32, 128, 2, 4, 4), (16, 64, 128, 2, 4, 4), (64, 64, 64, 4, 4, 4), (64, 128, 128, 2, 8, 3)])] + [
    {"DEQUANT": 1}]  # the W4A16 GEMM only: the weight dequantized, then cuBLAS
GEMM_MANY_ROWS = [{**c, "GROUP_M": 8} for c in _grid(_GEMM_KEYS, [  # a 4K-token prefill: compute-bound
    (128, 128, 64, 1, 4, 3), (128, 128, 64, 1, 8, 3), (128, 256, 64, 1, 8, 3), (64, 128, 64, 1, 4, 4),
    (128, 128, 128, 1, 8, 3), (128, 64, 64, 1, 4, 4), (256, 128, 64, 1, 8, 3)])] + [{"DEQUANT": 1}]


DECODE_ATTENTION = [{"BLOCK_N": n, "num_warps": w, "num_stages": s}
                    for n, w, s in ((64, 4, 3), (32, 4, 3), (128, 4, 3), (64, 4, 4), (128, 8, 3), (64, 2, 3), (128, 4, 4))]
GEMV = [{"BLOCK_N": n, "BLOCK_K": k, "num_warps": w, "num_stages": s}
        for n, k, w, s in ((4, 512, 4, 4), (8, 512, 4, 4), (4, 1024, 4, 3), (2, 1024, 4, 3), (8, 256, 4, 4))]
FP8_GEMM = [{"BLOCK_M": m, "BLOCK_N": n, "BLOCK_K": k, "num_warps": w, "num_stages": s, "FAST_ACC": 1}
            for m, n, k, w, s in ((64, 64, 256, 4, 4), (64, 32, 256, 4, 6), (64, 64, 256, 4, 6), (64, 128, 128, 4, 3),
                                  (32, 64, 128, 4, 3), (128, 128, 64, 8, 3), (128, 128, 128, 8, 3))]
GRIDS = {"gemv": GEMV, "fp8_gemv": FP8_GEMV, "int4_gemv": INT4_GEMV, "decode_attention": DECODE_ATTENTION,
         "fp8_gemm": FP8_GEMM}


def nibble_gemm(rows: int) -> list[dict]:
    """The 4-bit GEMM that takes one dot a nibble position (kernels/dequant_gemm.py), for `rows` rows: weight
    tiles of 64-128 rows (fewer lost in every sweep on the H200), split K or not, the weights as the MMA's
    register operand (SWAP 1) or both operands from shared memory (SWAP 0, where x fills the MMA's 64 rows)."""
    block_m = max(16, min(128, 1 << (rows - 1).bit_length()))
    swaps = (1, 0) if block_m >= 64 else (1,)
    return [{"NIBBLES": 1, "SWAP": swap, "BLOCK_M": block_m, "BLOCK_N": n, "BLOCK_K": k, "GROUP_M": 8, "SPLIT_K": split,
             "num_warps": w, "num_stages": 3}
            for n, w in ((64, 4), (128, 4), (128, 8)) for k in (128, 256) for split in (1, 4) for swap in swaps]


def wgmma_gemm(rows: int) -> list[dict]:
    """The 4-bit GEMM on Hopper's warpgroup MMA (kernels/w4a16_hopper.py) for `rows` rows: x's rows the MMA's
    narrow side (8 to 128 a program), 64-256 weight rows (128 on one warpgroup or two), K tiles of one or two
    groups, split K or not (up to eight ways where x's tile is 64 rows or more, whose traffic wants wide weight
    tiles, which leave fewer programs to share K among), the unpacked tile stored to shared memory for the MMA or
    kept in its registers (REGS: where the accumulator takes at most 64 registers a thread, 32 with K tiles of 256
    columns, past which ptxas spills inside the K loop; split K too, whose final sum is a loop after it), as many tiles in flight as the SM's shared memory holds (per stage
    the words and x's, and without REGS the weight tile in bf16; with REGS up to eight where x's tile is small,
    `_stages`), and where few programs share an SM the next tile started under the last one's MMA
    (`_with_overlap`). Past 128 rows also one program for all 256 (`_whole_batch`)."""
    block_m = max(8, min(128, 1 << (rows - 1).bit_length()))
    configs = [{"WGMMA": 1, "REGS": regs, "BLOCK_M": block_m, "BLOCK_N": n, "BLOCK_K": k, "GROUP_M": 8,
                "SPLIT_K": split, "num_warps": w, "num_stages": stages}
               for n, w, k in ((64, 4, 128), (64, 4, 256), (128, 4, 128), (128, 4, 256), (128, 8, 128),
                               (256, 8, 128))
               for regs in (0, 1) for split in _splits(regs, block_m) for stages in _stages(regs, block_m)]
    configs = [c for c in configs if wgmma_shared_bytes(c) <= 220 * 1024 and (not c["REGS"] or (
        c["BLOCK_N"] * block_m <= (32 if c["BLOCK_K"] > 128 else 64) * 32 * c["num_warps"]))]
    return _with_overlap(configs + (_whole_batch() if rows > 128 else []))


def _with_overlap(configs: list[dict]) -> list[dict]:
    """Each REGS config of 64 rows of x or more and three stages or more, also with OVERLAP (the next tile's
    unpacking under the last tile's last MMA, one tile less copied ahead): where one or two programs fill an SM, the
    MMA pipe drained at every tile start is time no other program fills."""
    return configs + [{**c, "OVERLAP": 1} for c in configs
                      if c["REGS"] and c["BLOCK_M"] >= 64 and c["num_stages"] >= 3]


def _splits(regs: int, block_m: int) -> tuple[int, ...]:
    return (1, 2, 4, 8) if regs and block_m >= 64 else (1, 2, 4)


def _whole_batch() -> list[dict]:
    """256 rows of x a program on two warpgroups of 64 weight rows each: every weight unpacked once for the whole
    batch, the MMA at its widest (64 x 256 x 16). Its accumulator takes 128 registers a thread (about 240 in all,
    checked compiled; split K's sum, a loop after the K loop, spills a few bytes there and none inside it), and
    x's tile of 64 KB a stage allows at most three. One program fills an SM, so split K evens out the last wave
    (gate_up's 296 tiles are 2.2 waves of an H100's or H200's 132 SMs)."""
    return [{"WGMMA": 1, "REGS": 1, "BLOCK_M": 256, "BLOCK_N": 128, "BLOCK_K": 128, "GROUP_M": 8, "SPLIT_K": split,
             "num_warps": 8, "num_stages": stages} for stages in (2, 3) for split in (1, 2, 4)]


def _stages(regs: int, block_m: int) -> tuple[int, ...]:
    """Tiles in flight: with REGS and 64 or more rows of x, x's tile (16-32 KB a stage) is most of the shared
    memory, so fewer stages let more programs share an SM, which hides the unpacking's latency."""
    if not regs:
        return (3, 4)
    return (4, 8) if block_m <= 32 else (2, 3, 4)


def wgmma_shared_bytes(cfg: dict) -> int:
    """The shared memory a config of that GEMM takes (what the compiler allocates, checked on its output)."""
    tile = 0 if cfg.get("REGS") else cfg["BLOCK_N"] * cfg["BLOCK_K"] * 2
    return tile + cfg["num_stages"] * (cfg["BLOCK_N"] * cfg["BLOCK_K"] // 2 + cfg["BLOCK_M"] * cfg["BLOCK_K"] * 2)


def candidates(kernel: str, default: dict, rows: int = 1) -> tuple[list[dict], int]:
    """(shipped winners for `kernel`, then its default, then its grid (GEMMs: the grid for `rows`), no repeats;
    how many of them are the first two kinds, which every sweep tries). The Hopper 4-bit GEMM's configs, shipped
    or not, only where that kernel runs, up to 256 rows."""
    grid = GRIDS.get(kernel) or (GEMM_FEW_ROWS if rows <= 128 else GEMM_MANY_ROWS)
    if kernel == "w8a16_gemm":
        grid = [c for c in grid if "DEQUANT" not in c]
    if kernel == "w4a16_gemm" and rows <= 128:
        grid = grid + nibble_gemm(rows)
    hopper = kernel == "w4a16_gemm" and rows <= 256 and _hopper_gemm_runs()
    if hopper:
        grid = grid + wgmma_gemm(rows)
    seeds = _unique([c for c in shipped_configs(kernel) if hopper or not c.get("WGMMA")] + [default])
    if kernel == "fp8_gemv" and not _e4m3_native():  # PACKED converts e4m3 natively: without it, the same launch
        seeds, grid = _unique([_unpacked(c) for c in seeds]), [_unpacked(c) for c in grid]
    return _unique(seeds + grid), len(seeds)


def _unpacked(cfg: dict) -> dict:
    return {k: v for k, v in cfg.items() if k != "PACKED"}


def _e4m3_native() -> bool:
    """Whether the GPU the tune runs on compiles e4m3 (the CPU's interpreter converts it too)."""
    import torch

    from hosttune_engine.kernels.e4m3 import native_e4m3

    return not torch.cuda.is_available() or native_e4m3(torch.device("cuda"))


def _hopper_gemm_runs() -> bool:
    import torch

    from hosttune_engine.kernels.dequant_gemm import hopper_gemm_runs

    return torch.cuda.is_available() and hopper_gemm_runs(torch.device("cuda"))


def _unique(configs: list[dict]) -> list[dict]:
    seen, out = set(), []
    for cfg in configs:
        key = json.dumps(cfg, sort_keys=True)
        if key not in seen:
            seen.add(key)
            out.append(cfg)
    return out


def shipped_configs(kernel: str) -> list[dict]:
    """Every config the shipped table holds for `kernel`, on any GPU, most used first."""
    counts: dict = {}
    for kernels in json.loads(tuning.SHIPPED.read_text()).values():
        for cfg in kernels.get(kernel, {}).values():
            key = json.dumps(cfg, sort_keys=True)
            counts[key] = counts.get(key, 0) + 1
    return [json.loads(k) for k in sorted(counts, key=lambda k: -counts[k])]


def tiny_candidates(cands: list[dict]) -> list[dict]:
    """One config of each kernel kind for the CPU test: the widest output tile of the kind, since the Triton
    interpreter's cost is per program, nearly whatever the tile."""
    kinds = {}
    for c in (c for c in cands if not c.get("PACKED") and not c.get("WGMMA")):  # CUDA only
        key = (c.get("DOT"), c.get("FUSE", 1), bool(c.get("DEQUANT")), c.get("SPLIT_K", c.get("SPLIT", 1)) > 1,
               c.get("XB", 0), c.get("NIBBLES", 0), c.get("SWAP", 1))
        kinds.setdefault(key, []).append(c)  # (UNROLL changes nothing the CPU can see)
    return [max(group, key=lambda c: c.get("BLOCK_N", 0)) for group in kinds.values()]


