"""The 4-bit GEMM on Hopper's warpgroup MMA, for batched decode: y [M, N] = x [M, K] @ W (+ bias), W in the 4-bit
layout of kernels/int4_layout.py (groups a multiple of 64, so pack blocks of 64 columns, eight words a row).

Written in Gluon (Triton's explicit-layout dialect) because what makes it fast is what plain Triton does not let a
kernel say. Each program owns BLOCK_N weight rows and BLOCK_M rows of x, computes acc^T [BLOCK_N, BLOCK_M] = W x^T
(the weights the MMA's 64-row side, so 16 rows of x waste nothing), and per K tile:

- the packed words and x's tile come in by cp.async, STAGES tiles ahead, so the weight stream never waits on the
  unpacking;
- the words are unpacked in registers (a thread owns whole pack blocks: 64 consecutive columns of a row), zero
  subtracted and scale applied in fp32 exactly as `dequantize_ref` rounds, and stored to shared memory in column
  order with 16-byte stores;
- one asynchronous warpgroup MMA takes that tile and x's, and runs while the next tile is unpacked: the kernel
  waits for it only before overwriting its weight tile. (Plain Triton waits after every MMA whose operand it
  computed, which left the nibble kernel of kernels/dequant_gemm.py at twice bf16's time from 32 rows.)

With A_REGS the unpacked weights never touch shared memory: a thread loads the two words of each row and pack
block that hold its pairs of the MMA's register operand (the layout already puts columns 8 i + 2 t and 8 i + 2 t + 1
in words 2 t and 2 t + 1, which is what lane t of a quad holds), unpacks them two weights an instruction in
bf16x2 / f16x2 (kernels/w4a16_unpack.py), 16 columns a step, and each step's MMA reads its operand from those
registers while the next step is unpacked. An MMA reads its register operand while it runs, so the wait after
issuing a step retires the step before, whose registers the step after may take (tests/engine/sass_hazards.py
checks the compiled kernel for a write under an MMA in flight).

With OVERLAP (A_REGS, three stages or more) a tile starts while the last tile's last MMA still runs: the copies
go STAGES - 2 tiles ahead, into the slot whose MMAs the last tile's first wait retired, so the MMA pipe does not
drain at every tile (one tile less in flight for it).

Split K over SPLIT_K programs adds their fp32 partials in the same launch (`_store`). Needs a Triton with
Gluon (3.5 or later) and an sm_90 GPU (dequant_gemm's `wgmma_unfit` says where it cannot run).
"""

from __future__ import annotations

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, warpgroup_mma, warpgroup_mma_wait

from hosttune_engine.kernels.checks import check
from hosttune_engine.kernels.w4a16_unpack import (block, dequantized, group_params, halves, pair_params, params_layout,
                                                  step_layout, tile_params, unpack_layout, unpacked_step)

# cp.async global -> shared: async_load from Triton 3.7 on, async_copy_global_to_shared before (same arguments)
_async_load = getattr(async_copy, "async_load", None) or async_copy.async_copy_global_to_shared
# the CTA's barrier (bar.sync): gl.barrier from Triton 3.7 on, gl.thread_barrier before
_barrier = getattr(gl, "barrier", None) or gl.thread_barrier
PACK = 64  # columns a pack block: eight words, word j holding column 8 i + j at nibble i


@gluon.constexpr_function
def _copy_layout(row_elems, per_thread, num_warps):
    """Rows of `row_elems` copied `per_thread` (16 bytes) a thread, a warp's threads along the row first."""
    along = max(1, min(32, row_elems // per_thread))
    return gl.BlockedLayout([1, per_thread], [32 // along, along], [num_warps, 1], [1, 0])


@gluon.jit
def _tile_sources(q_ptr, x_ptr, offs_n, n_mask, offs_m, m_mask, stride_xm, stride_qn, BLOCK_M: gl.constexpr,
                  BLOCK_K: gl.constexpr, NUM_WARPS: gl.constexpr):
    """Pointers and masks of the program's first K tile: the weight rows' words [BLOCK_N, BLOCK_K / 8] and
    x [BLOCK_M, BLOCK_K], in the layouts their cp.async take (made once: a tile k0 on is k0 / 8 and k0 further)."""
    wl: gl.constexpr = _copy_layout(BLOCK_K // 8, 4, NUM_WARPS)
    rows = gl.convert_layout(offs_n, gl.SliceLayout(1, wl)).to(gl.int64)
    words = gl.arange(0, BLOCK_K // 8, layout=gl.SliceLayout(0, wl))
    w_ptrs = q_ptr + rows[:, None] * stride_qn + words[None, :]  # (K / 8: passed, so its alignment is known)
    # the row masks over the whole tile (a comparison the compiler sees constant along each 16-byte copy)
    w_mask = gl.convert_layout(n_mask, gl.SliceLayout(1, wl))[:, None] & (words < BLOCK_K)[None, :]
    xl: gl.constexpr = _copy_layout(BLOCK_K, 8, NUM_WARPS)
    xm = gl.convert_layout(offs_m, gl.SliceLayout(1, xl)).to(gl.int64)
    cols = gl.arange(0, BLOCK_K, layout=gl.SliceLayout(0, xl))
    x_ptrs = x_ptr + xm[:, None] * stride_xm + cols[None, :]
    x_mask = gl.convert_layout(m_mask, gl.SliceLayout(1, xl))[:, None] & (cols < BLOCK_K)[None, :]
    return w_ptrs, w_mask, x_ptrs, x_mask


@gluon.jit
def _issue_tile(words_smem, x_smem, w_ptrs, w_mask, x_ptrs, x_mask, k0, live):
    """cp.async of the K tile at k0 (a tile past the program's share, live false, copies nothing)."""
    _async_load(words_smem, w_ptrs + k0 // 8, mask=w_mask & live)
    _async_load(x_smem, x_ptrs + k0, mask=x_mask & live)


@gluon.jit
def _w4a16_wgmma_kernel(x_ptr, q_ptr, s_ptr, z_ptr, b_ptr, y_ptr, ws_ptr, cnt_ptr, M, N, K, stride_xm, stride_qn,
                        stride_ym, MAGIC, HAS_BIAS: gl.constexpr, GROUP: gl.constexpr, BLOCK_M: gl.constexpr,
                        BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr, SPLIT_K: gl.constexpr, STAGES: gl.constexpr,
                        A_REGS: gl.constexpr, SPLIT_SCALE: gl.constexpr, OVERLAP: gl.constexpr):
    NUM_WARPS: gl.constexpr = gl.num_warps()
    AHEAD: gl.constexpr = STAGES - 2 if OVERLAP and A_REGS else STAGES - 1  # tiles copied ahead of the one multiplied
    dtype: gl.constexpr = x_ptr.dtype.element_ty
    acc_l: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[NUM_WARPS, 1],
                                                    instr_shape=[16, BLOCK_M, 16])
    num_n = gl.cdiv(N, BLOCK_N)
    pid_n, pid_m = gl.program_id(0) % num_n, gl.program_id(0) // num_n
    rows = pid_n * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, gl.BlockedLayout(
        [1, 1], [32, 1], [NUM_WARPS, 1], [1, 0])))
    offs_m = pid_m * BLOCK_M + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, gl.BlockedLayout(
        [1, 1], [32, 1], [NUM_WARPS, 1], [1, 0])))
    per = gl.cdiv(gl.cdiv(K, BLOCK_K), SPLIT_K) * BLOCK_K
    start = gl.program_id(1) * per
    tiles = gl.cdiv(gl.maximum(gl.minimum(start + per, K) - start, 0), BLOCK_K)

    words_smem = gl.allocate_shared_memory(gl.int32, [STAGES, BLOCK_N, BLOCK_K // 8],
                                           gl.SwizzledSharedLayout(1, 1, 1, [1, 0]))
    x_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_M, BLOCK_K],
                                       gl.NVMMASharedLayout.get_default_for([BLOCK_M, BLOCK_K], dtype))
    w_ptrs, w_mask, x_ptrs, x_mask = _tile_sources(q_ptr, x_ptr, rows, rows < N, offs_m, offs_m < M, stride_xm,
                                                   stride_qn, BLOCK_M, BLOCK_K, NUM_WARPS)
    for t in gl.static_range(AHEAD):
        _issue_tile(words_smem.index(t), x_smem.index(t), w_ptrs, w_mask, x_ptrs, x_mask, start + t * BLOCK_K,
                    t < tiles)
        async_copy.commit_group()
    acc = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, layout=acc_l)
    if A_REGS:
        acc = _mma_from_registers(acc, words_smem, x_smem, z_ptr, s_ptr, rows, N, K, w_ptrs, w_mask, x_ptrs, x_mask,
                                  start, tiles, dtype, GROUP, BLOCK_N, BLOCK_K, STAGES, SPLIT_SCALE, AHEAD)
    else:
        acc = _mma_from_shared(acc, words_smem, x_smem, z_ptr, s_ptr, rows, N, K, w_ptrs, w_mask, x_ptrs, x_mask,
                               start, tiles, MAGIC, dtype, GROUP, BLOCK_N, BLOCK_K, STAGES)
    async_copy.wait_group(0)
    _store(acc, b_ptr, y_ptr, ws_ptr, cnt_ptr, pid_n * BLOCK_N, pid_m * BLOCK_M, M, N, stride_ym, HAS_BIAS, SPLIT_K,
           BLOCK_M, BLOCK_N, NUM_WARPS)


@gluon.jit
def _mma_from_shared(acc, words_smem, x_smem, z_ptr, s_ptr, rows, N, K, w_ptrs, w_mask, x_ptrs, x_mask, start,
                     tiles, MAGIC, dtype: gl.constexpr, GROUP: gl.constexpr, BLOCK_N: gl.constexpr,
                     BLOCK_K: gl.constexpr, STAGES: gl.constexpr):
    """The K loop with the unpacked tile stored to shared memory for the MMA (fp32 unpacking, `dequantized`)."""
    NUM_WARPS: gl.constexpr = gl.num_warps()
    BLOCKS: gl.constexpr = BLOCK_K // 64
    unpack: gl.constexpr = unpack_layout(BLOCK_K, NUM_WARPS)
    words_l: gl.constexpr = gl.SliceLayout(2, unpack)  # [BLOCK_N, BLOCKS, 8 words]
    params_l: gl.constexpr = gl.SliceLayout(2, words_l)  # [BLOCK_N, BLOCKS]
    rows = gl.convert_layout(rows, gl.SliceLayout(1, params_l))
    rows_g, n_mask = rows * (K // GROUP), rows < N
    w_smem = gl.allocate_shared_memory(dtype, [BLOCK_N, BLOCK_K],
                                       gl.NVMMASharedLayout.get_default_for([BLOCK_N, BLOCK_K], dtype))
    c, s = group_params(z_ptr, s_ptr, rows_g, n_mask, start, K, GROUP, BLOCK_K, params_l)
    for t in range(tiles):
        slot = t % STAGES
        async_copy.wait_group(STAGES - 2)
        _barrier()
        words = words_smem.index(slot).reshape([BLOCK_N, BLOCKS, 8]).load(words_l)
        w = dequantized(words, c, s, MAGIC, dtype, BLOCK_N, BLOCK_K, unpack)  # while the last tile's MMA runs
        if t + 1 < tiles:
            c, s = group_params(z_ptr, s_ptr, rows_g, n_mask, start + (t + 1) * BLOCK_K, K, GROUP, BLOCK_K,
                                params_l)
        acc = warpgroup_mma_wait(0, deps=[acc])
        w_smem.store(w)
        fence_async_shared()
        _barrier()
        ahead = t + STAGES - 1
        _issue_tile(words_smem.index(ahead % STAGES), x_smem.index(ahead % STAGES), w_ptrs, w_mask, x_ptrs, x_mask,
                    start + ahead * BLOCK_K, ahead < tiles)
        async_copy.commit_group()
        acc = warpgroup_mma(w_smem, x_smem.index(slot).permute((1, 0)), acc, is_async=True)
        acc = warpgroup_mma_wait(1, deps=[acc])
    return warpgroup_mma_wait(0, deps=[acc])


@gluon.jit
def _mma_from_registers(acc, words_smem, x_smem, z_ptr, s_ptr, rows, N, K, w_ptrs, w_mask, x_ptrs, x_mask, start,
                        tiles, dtype: gl.constexpr, GROUP: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr,
                        STAGES: gl.constexpr, SPLIT_SCALE: gl.constexpr, AHEAD: gl.constexpr):
    """The K loop with the unpacked weights the MMA's register operand, 16 columns a step (`unpacked_step`): the
    MMA of a step runs while the next step is unpacked into other registers, the wait after issuing a step retiring
    the one before (whose registers the step after may take). With copies STAGES - 1 tiles ahead a tile starts once
    the last tile's MMAs are done, which frees x's slot for that copy; STAGES - 2 ahead, the slot copied into is
    the one before the last, whose MMAs every warpgroup retired in the last tile, so the MMA pipe runs on."""
    NUM_WARPS: gl.constexpr = gl.num_warps()
    step_l: gl.constexpr = step_layout(BLOCK_N, NUM_WARPS)
    words_l: gl.constexpr = gl.SliceLayout(1, step_l)  # [BLOCK_N, 8 words] of a pack block
    rows_l: gl.constexpr = gl.SliceLayout(1, words_l)
    operand: gl.constexpr = gl.DotOperandLayout(0, acc.type.layout, 2)
    params_l: gl.constexpr = params_layout(BLOCK_N, BLOCK_K, NUM_WARPS)
    rows = gl.convert_layout(rows, gl.SliceLayout(1, params_l))
    rows_g, n_mask = rows * (K // GROUP), rows < N
    # zeros and scales three tiles ahead, as far as the words: loaded one tile ahead, every tile waited on a round
    # trip to memory longer than the tile's work, where few programs share an SM (64 rows of x and more)
    z, s = tile_params(z_ptr, s_ptr, rows_g, n_mask, start, K, GROUP, BLOCK_K, params_l)
    z1, s1 = tile_params(z_ptr, s_ptr, rows_g, n_mask, start + BLOCK_K, K, GROUP, BLOCK_K, params_l)
    z2, s2 = tile_params(z_ptr, s_ptr, rows_g, n_mask, start + 2 * BLOCK_K, K, GROUP, BLOCK_K, params_l)
    for t in range(tiles):
        slot = t % STAGES
        if AHEAD == STAGES - 1:
            acc = warpgroup_mma_wait(0, deps=[acc])  # the last tile's MMAs done: x's slot is free
        async_copy.wait_group(AHEAD - 1)
        _barrier()  # every thread's copies of tile t landed, every warpgroup done with the slot copied into
        ahead = t + AHEAD
        _issue_tile(words_smem.index(ahead % STAGES), x_smem.index(ahead % STAGES), w_ptrs, w_mask, x_ptrs, x_mask,
                    start + ahead * BLOCK_K, ahead < tiles)
        async_copy.commit_group()
        z3, s3 = tile_params(z_ptr, s_ptr, rows_g, n_mask, start + (t + 3) * BLOCK_K, K, GROUP, BLOCK_K, params_l)
        c, s_hi, s_lo = pair_params(z, s, dtype)
        for b in gl.static_range(BLOCK_K // 64):
            pairs = halves(words_smem.index(slot).slice(8 * b, 8, dim=1).load(words_l))
            for step in gl.static_range(4):
                w = unpacked_step(pairs, block(c, b, params_l, rows_l), block(s_hi, b, params_l, rows_l),
                                  block(s_lo, b, params_l, rows_l), step, dtype, SPLIT_SCALE, BLOCK_N, step_l,
                                  operand)
                x = x_smem.index(slot).slice(64 * b + 16 * step, 16, dim=1).permute((1, 0))
                acc = warpgroup_mma(w, x, acc, is_async=True)
                acc = warpgroup_mma_wait(1, deps=[acc])  # the step before retired
        z, s, z1, s1, z2, s2 = z1, s1, z2, s2, z3, s3
    return warpgroup_mma_wait(0, deps=[acc])


@gluon.jit
def _store(acc, b_ptr, y_ptr, ws_ptr, cnt_ptr, n0, m0, M, N, stride_ym, HAS_BIAS: gl.constexpr, SPLIT_K: gl.constexpr,
           BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, NUM_WARPS: gl.constexpr):
    """acc^T [BLOCK_N, BLOCK_M] -> y [M, N] in x's dtype, plus bias. With split K each program writes its fp32
    partial to ws[split] and counts itself in its tile's counter; the last of the tile's SPLIT_K programs adds the
    partials, writes y and resets the counter (zero again after every call, as a CUDA graph replays it): one
    launch, no summing kernel after it (the pattern of kernels/gemv_splits.py)."""
    out_l: gl.constexpr = gl.BlockedLayout([4, 1], [32, 1], [1, NUM_WARPS], [0, 1])
    acc = gl.convert_layout(acc, out_l)
    # offsets within the tile in int32 beside one 64-bit base: 64-bit addresses would take two registers an element
    dn = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, out_l))
    dm = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, out_l))
    mask = (n0 + dn < N)[:, None] & (m0 + dm < M)[None, :]
    if SPLIT_K > 1:
        local = dm[None, :] * N + dn[:, None]
        tile_ws = ws_ptr + (m0.to(gl.int64) * N + n0)
        gl.store(tile_ws + gl.program_id(1).to(gl.int64) * M * N + local, acc, mask=mask)
        _barrier()  # every thread's partial is written before the tile is counted
        done = gl.atomic_add(cnt_ptr + gl.program_id(0), 1, sem="acq_rel")  # the last sees every partial
        if done == SPLIT_K - 1:
            acc = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, layout=out_l)
            # a loop the compiler keeps (its count known only at run time, SPLIT_K programs on the grid's second
            # axis): unrolled, every partial's loads were hoisted together, which took 190 registers at two
            # splits and spilled at four, where the K loop takes 117, and halved the programs an SM could hold
            for split in range(gl.num_programs(1)):  # from L2 (.cg), not what this SM's L1 may hold
                acc += gl.load(tile_ws + split.to(gl.int64) * M * N + local, mask=mask, other=0.0,
                               cache_modifier=".cg")
            gl.atomic_xchg(cnt_ptr + gl.program_id(0), 0)
            _write(acc, b_ptr, y_ptr, n0, m0, dn, dm, mask, N, stride_ym, HAS_BIAS)
    else:
        _write(acc, b_ptr, y_ptr, n0, m0, dn, dm, mask, N, stride_ym, HAS_BIAS)


@gluon.jit
def _write(acc, b_ptr, y_ptr, n0, m0, dn, dm, mask, N, stride_ym, HAS_BIAS: gl.constexpr):
    if HAS_BIAS:
        acc += gl.load(b_ptr + n0 + dn, mask=n0 + dn < N, other=0.0).to(gl.float32)[:, None]
    tile_y = y_ptr + (m0.to(gl.int64) * stride_ym + n0)
    gl.store(tile_y + (dm[None, :] * stride_ym + dn[:, None]), acc.to(y_ptr.dtype.element_ty), mask=mask)


def register_cap(cfg: dict) -> int | None:
    """Registers a thread the compiler may take: 128 (four programs of four warps an SM, two of eight) where each
    warp unpacks one 16-row slice of a K tile of one pack block pair (128 columns) for at most 64 rows of x (wider
    tiles spilled inside the K loop under it, compiled). The K loop takes about 117 there; the split-K sum after it
    took 156, and a kernel's register count is its peak, so that one pass at the end held an SM to three programs.
    Capped, the compiler spills only outside the K loop, if at all (checked compiled)."""
    fits = cfg["BLOCK_N"] == 16 * cfg["num_warps"] and cfg["BLOCK_M"] <= 64 and cfg["BLOCK_K"] == 128
    return 128 if fits else None


def tile_counters(device: torch.device, tiles: int) -> torch.Tensor:
    """int32 counters, one an output tile, zero between calls: made at the first call on a device (made while a
    CUDA graph is captured, from that graph's memory pool, kept alive here for every later call), and again larger
    when a launch has more tiles."""
    have = _COUNTERS.get(str(device))
    if have is None or have.numel() < tiles:
        have = _COUNTERS[str(device)] = torch.zeros(max(tiles, 4096), dtype=torch.int32, device=device)
    return have


_COUNTERS: dict = {}


def launch(x, qweight, scales, zeros, group_size: int, bias, y, ws, cfg: dict) -> None:
    """One launch over y [M, N] (+ bias), ws [SPLIT_K, M, N] the split partials' scratch; x contiguous in K and
    already in group order."""
    m, k = x.shape
    n = qweight.shape[0]
    check(group_size % PACK == 0, "the warpgroup 4-bit GEMM needs groups of a multiple of {}, got {}", PACK,
          group_size)
    check(k % cfg["BLOCK_K"] == 0 and cfg["BLOCK_K"] % PACK == 0 and (cfg["BLOCK_K"] <= group_size
          or cfg["BLOCK_K"] % group_size == 0), "BLOCK_K {} must divide K {} into whole pack blocks and groups",
          cfg["BLOCK_K"], k)
    overlap = bool(cfg.get("OVERLAP"))
    check(not overlap or cfg["num_stages"] >= 3, "OVERLAP copies STAGES - 2 tiles ahead: it needs 3 stages or more, "
          "got {}", cfg["num_stages"])
    grid = (triton.cdiv(n, cfg["BLOCK_N"]) * triton.cdiv(m, cfg["BLOCK_M"]), cfg.get("SPLIT_K", 1))
    # the paired unpacking splits a 16-bit scale exactly; an fp32 one only the fp32 unpacking rounds as the reference
    a_regs = bool(cfg.get("REGS")) and scales.element_size() == 2
    _w4a16_wgmma_kernel[grid](
        x, qweight, scales, zeros, bias if bias is not None else y, y, ws, tile_counters(x.device, grid[0]), m, n, k,
        x.stride(0), qweight.stride(0), y.stride(0), 0x4B000000,
        HAS_BIAS=bias is not None, GROUP=group_size, BLOCK_M=cfg["BLOCK_M"], BLOCK_N=cfg["BLOCK_N"],
        BLOCK_K=cfg["BLOCK_K"], SPLIT_K=cfg.get("SPLIT_K", 1), STAGES=cfg["num_stages"], A_REGS=a_regs,
        SPLIT_SCALE=scales.dtype != x.dtype, OVERLAP=a_regs and overlap, num_warps=cfg["num_warps"],
        maxnreg=register_cap(cfg) if a_regs else None)
