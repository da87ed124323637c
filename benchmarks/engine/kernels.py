"""Kernel benchmarks on the Qwen2.5-7B attention shape (GQA 28/4, d=128, bf16):
(a) prefill attention vs torch SDPA, (b) paged decode attention bandwidth, (c) fused
norm / RoPE+KV-write / SwiGLU bandwidth. With `tune=True` each attention kernel's
candidate launch configs are timed first and the fastest saved to the config table."""

from __future__ import annotations

import statistics

import torch
import torch.nn.functional as F

from benchmarks.engine.common import SHAPE, bench_ms, graph_ms
from hosttune_engine.kernels import tuning
from hosttune_engine.kernels.decode_attention import choose_num_splits, config_key as decode_key, decode_attention
from hosttune_engine.kernels.prefill_attention import config_key as prefill_key, prefill_attention
from hosttune_engine.kernels.rmsnorm import rms_norm
from hosttune_engine.kernels.rope_kv import rope_kv_write
from hosttune_engine.kernels.swiglu import swiglu
from hosttune_engine.layers.rotary import rope_cos_sin

HQ, HKV, D, PAGE = SHAPE.heads, SHAPE.kv_heads, SHAPE.head_dim, 16
DT = torch.bfloat16
DEV = "cuda"  # a CPU smoke run (interpreter) sets "cpu"
POOL_TOKENS = 1 << 20  # decode benchmark cache: 1M tokens, 2 GiB of K+V, 35x the L2
DECODE_CASES = ((1, 32, 64, 128), (1024, 8192))  # batches, contexts
PREFILL_LENS = (512, 2048, 4096, 8192)
PREFILL_CANDIDATES = [  # (BLOCK_M = two halves, BLOCK_N, num_warps, num_stages)
    (128, 64, 4, 2), (128, 64, 4, 3), (128, 32, 4, 3), (128, 128, 4, 2), (64, 64, 4, 2), (256, 64, 8, 2),
    (128, 64, 8, 2),
]
DECODE_CANDIDATES = [(64, 4, 3), (32, 4, 3), (128, 4, 3), (64, 4, 4), (128, 8, 3), (64, 2, 3)]  # BLOCK_N, warps, stages


def _prefill_cfg(c) -> dict:
    return {"BLOCK_M": c[0], "BLOCK_N": c[1], "num_warps": c[2], "num_stages": c[3]}


def _decode_cfg(c) -> dict:
    return {"BLOCK_N": c[0], "num_warps": c[1], "num_stages": c[2]}


class PrefillCase:
    """One fresh prompt of n tokens, laid out as the engine has it: strided q/k/v views of a qkv projection,
    and the same keys and values in a paged cache with scattered blocks."""

    def __init__(self, n: int, paged: bool):
        self.n = n
        qkv = torch.randn(n, HQ + 2 * HKV, D, device=DEV, dtype=DT)
        self.q, self.k, self.v = qkv.split([HQ, HKV, HKV], dim=1)
        nb = -(-n // PAGE)
        self.cu = torch.tensor([0, n], dtype=torch.int32, device=DEV)
        self.lens = torch.tensor([n], dtype=torch.int32, device=DEV)
        self.bt = torch.randperm(nb, device=DEV).to(torch.int32)[None]
        self.kc = torch.zeros(nb, PAGE, HKV, D, device=DEV, dtype=DT)
        self.vc = torch.zeros_like(self.kc)
        rows = (self.bt[0].long()[:, None] * PAGE + torch.arange(PAGE, device=DEV)).reshape(-1)[:n]
        self.kc.view(-1, HKV, D)[rows], self.vc.view(-1, HKV, D)[rows] = self.k, self.v
        self.paged = paged

    def run(self, config=None):
        kw = {} if self.paged else {"contiguous": True, "k": self.k, "v": self.v}
        return prefill_attention(self.q, self.kc, self.vc, self.cu, self.lens, self.bt, self.n, config=config, **kw)

    def key(self) -> str:
        return prefill_key(DT, D, HQ // HKV, PAGE, not self.paged, self.n)


def _sdpa_inputs(case: PrefillCase):
    q = case.q.transpose(0, 1)[None].contiguous()  # [1, Hq, L, D]
    k, v = (x.transpose(0, 1)[None].contiguous() for x in (case.k, case.v))
    return q, k, v


def prefill_vs_sdpa(tune: bool, device_name: str, log) -> list[dict]:
    rows = []
    for n in PREFILL_LENS:
        case = PrefillCase(n, paged=False)
        if tune and n != 4096:  # 4096 and 8192 share the >=3K bucket: tune it at 8192
            _tune_prefill(case, device_name, log)
        rows.append(_prefill_row(case, "contiguous"))
        if n == 4096:
            paged = PrefillCase(n, paged=True)
            if tune:
                _tune_prefill(paged, device_name, log, PREFILL_CANDIDATES[:4])
            rows.append(_prefill_row(paged, "paged"))
        log(rows[-1])
    return rows


def _tune_prefill(case: PrefillCase, device_name: str, log, candidates=PREFILL_CANDIDATES) -> None:
    best, results = tuning.tune([_prefill_cfg(c) for c in candidates], lambda cfg: bench_ms(lambda: case.run(cfg)))
    tuning.save_config("prefill_attention", case.key(), device_name, best)
    log({"tuned": "prefill_attention", "key": case.key(), "best": best,
         "ms": {str(tuple(c.values())): round(t, 4) for c, t in results}})


def _prefill_row(case: PrefillCase, mode: str) -> dict:
    flops = SHAPE.attention_flops(case.n) / SHAPE.layers
    bench_ms(case.run)  # a throwaway pass: the first timing of a run came out 3x slow once (clocks ramping)
    q, k, v = _sdpa_inputs(case)
    kx, vx = k.repeat_interleave(HQ // HKV, 1), v.repeat_interleave(HQ // HKV, 1)
    fns = {"ours": case.run,
           "gqa": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True),
           "mha": lambda: F.scaled_dot_product_attention(q, kx, vx, is_causal=True)}
    times = {name: [] for name in fns}
    for _ in range(5):  # interleaved rounds, medians: SDPA's own time moved by up to 15% between runs at 8K
        for name, fn in fns.items():
            times[name].append(bench_ms(fn))
    ours, sdpa_gqa, sdpa_mha = (statistics.median(times[name]) for name in fns)
    # GPU time alone (one graph replay, no launch cost): at 512 tokens the kernel (~17 us) is shorter than
    # a launch from Python, so the timing above is the host's
    gpu_ours, gpu_sdpa = graph_ms(fns["ours"]), min(graph_ms(fns["gqa"]), graph_ms(fns["mha"]))
    ref = F.scaled_dot_product_attention(q, kx, vx, is_causal=True)[0].transpose(0, 1).float()
    err = ((case.run().float() - ref).norm() / ref.norm()).item()
    sdpa = min(sdpa_gqa, sdpa_mha)
    return {"tokens": case.n, "mode": mode, "ours_ms": ours, "sdpa_gqa_ms": sdpa_gqa, "sdpa_expanded_ms": sdpa_mha,
            "ours_tflop_s": flops / ours / 1e9, "sdpa_tflop_s": flops / sdpa / 1e9, "ratio_vs_sdpa": sdpa / ours,
            "rel_err_vs_sdpa": err, "rounds_ms": times, "graph_ours_ms": gpu_ours, "graph_sdpa_ms": gpu_sdpa,
            "graph_ratio_vs_sdpa": gpu_sdpa / gpu_ours, "config": tuning.launch_config(
                "prefill_attention", case.key(), q.device, {"default": True})}


def decode_bandwidth(tune: bool, device_name: str, log, copy_tb_s: float) -> list[dict]:
    """Effective bandwidth (K+V bytes read / time) at batch 1/32/64/128 and 1K/8K context, graph-replayed
    over disjoint caches (as in a decode step, the KV of a layer is not in L2 when its attention runs)."""
    kc = torch.randn(POOL_TOKENS // PAGE, PAGE, HKV, D, device=DEV, dtype=DT)
    vc = torch.randn_like(kc)
    rows = []
    batches, contexts = DECODE_CASES
    for batch in batches:
        if tune:
            _tune_decode(kc, vc, batch, max(contexts), device_name, log)
        for ctx in contexts:
            rows.append(_decode_row(kc, vc, batch, ctx, copy_tb_s))
            log(rows[-1])
    del kc, vc
    torch.cuda.empty_cache()
    return rows


def _decode_calls(kc, vc, batch: int, ctx: int, config=None):
    """Up to 128 decode calls over disjoint random blocks (together several times the L2), as one closure."""
    nb = kc.shape[0]
    per_call = batch * (ctx // PAGE)
    copies = max(1, min(128, nb // per_call))
    perm = torch.randperm(nb, device=DEV).to(torch.int32)
    tables = [perm[i * per_call:(i + 1) * per_call].view(batch, -1) for i in range(copies)]
    q = torch.randn(batch, HQ, D, device=DEV, dtype=DT)
    lens = torch.full((batch,), ctx, dtype=torch.int32, device=DEV)
    sms = torch.cuda.get_device_properties(0).multi_processor_count if DEV == "cuda" else 132
    splits = choose_num_splits(batch, HKV, 8192, sms)
    out = torch.empty_like(q)

    def run():
        for t in tables:
            decode_attention(q, kc, vc, t, lens, num_splits=splits, out=out, config=config)
    return run, copies, splits


def _tune_decode(kc, vc, batch, ctx, device_name, log) -> None:
    def time_one(cfg):
        run, copies, _ = _decode_calls(kc, vc, batch, ctx, cfg)
        return graph_ms(run) / copies
    best, results = tuning.tune([_decode_cfg(c) for c in DECODE_CANDIDATES], time_one)
    key = decode_key(DT, D, HQ // HKV, PAGE, batch)
    tuning.save_config("decode_attention", key, device_name, best)
    log({"tuned": "decode_attention", "key": key, "best": best,
         "ms": {str(tuple(c.values())): round(t, 4) for c, t in results}})


def _decode_row(kc, vc, batch, ctx, copy_tb_s) -> dict:
    run, copies, splits = _decode_calls(kc, vc, batch, ctx)
    ms = graph_ms(run) / copies
    kv_bytes = batch * ctx * HKV * D * 2 * 2
    tb_s = kv_bytes / ms / 1e9
    return {"batch": batch, "context": ctx, "num_splits": splits, "us": ms * 1e3, "kv_mb": kv_bytes / 1e6,
            "tb_s": tb_s, "fraction_of_copy_bw": tb_s / copy_tb_s}


def elementwise_bandwidth(copy_tb_s: float, tokens: int = 8192) -> list[dict]:
    h, inter = SHAPE.hidden, SHAPE.inter
    x, r = (torch.randn(tokens, h, device=DEV, dtype=DT) for _ in range(2))
    w = torch.ones(h, device=DEV, dtype=DT)
    gate_up = torch.randn(tokens, 2 * inter, device=DEV, dtype=DT)
    qkv = torch.randn(tokens, (HQ + 2 * HKV) * D, device=DEV, dtype=DT)
    cos_sin = rope_cos_sin(D, 32768, 1e6).to(DEV)
    pos = torch.randint(0, 32768, (tokens,), device=DEV, dtype=torch.int32)
    slots = torch.randperm(tokens, device=DEV).to(torch.int32)
    kc = torch.zeros(tokens // PAGE, PAGE, HKV, D, device=DEV, dtype=DT)
    vc = torch.zeros_like(kc)
    cases = [
        ("rmsnorm+residual", lambda: rms_norm(x, w, 1e-6, residual=r), 4 * tokens * h * 2),
        ("rope+kv_write (q, k in place)", lambda: rope_kv_write(qkv, pos, cos_sin, kc, vc, slots, HQ, HKV),
         tokens * ((HQ + HKV) * D * 2 * 2 + HKV * D * 2 + 2 * HKV * D * 2)),
        ("swiglu", lambda: swiglu(gate_up), tokens * 3 * inter * 2),
    ]
    rows = []
    for name, fn, nbytes in cases:
        ms = bench_ms(fn)
        rows.append({"kernel": name, "tokens": tokens, "us": ms * 1e3, "mb": nbytes / 1e6,
                     "tb_s": nbytes / ms / 1e9, "fraction_of_copy_bw": nbytes / ms / 1e9 / copy_tb_s})
    return rows


GEMV_CANDIDATES = [(4, 512, 4, 4), (8, 512, 4, 4), (4, 1024, 4, 3)]  # BN, BK, w, s (five were tried on the H200)


def gemv_vs_cublas(copy_tb_s: float, log) -> dict:
    """Batch-1 decode GEMMs (28 layers' projections and the LM head, distinct random weights) as one graph:
    cuBLAS (torch F.linear) against the Triton GEMV, per candidate config."""
    from hosttune_engine.kernels.gemv import gemv

    h, q, i = SHAPE.hidden, SHAPE.heads * SHAPE.head_dim, SHAPE.inter
    layers = [(torch.randn(q + 2 * HKV * D, h, device=DEV, dtype=DT) * 0.02, torch.zeros(q + 2 * HKV * D, device=DEV, dtype=DT),
               torch.randn(h, q, device=DEV, dtype=DT) * 0.02, torch.randn(2 * i, h, device=DEV, dtype=DT) * 0.02,
               torch.randn(h, i, device=DEV, dtype=DT) * 0.02) for _ in range(SHAPE.layers)]
    head = torch.randn(SHAPE.vocab, h, device=DEV, dtype=DT) * 0.02
    xh, xq, xi = (torch.randn(1, n, device=DEV, dtype=DT) for n in (h, q, i))

    def cublas():
        for wqkv, bqkv, wo, wgu, wd in layers:
            F.linear(xh, wqkv, bqkv), F.linear(xq, wo), F.linear(xh, wgu), F.linear(xi, wd)
        F.linear(xh, head)

    def triton_gemv(cfg):
        def run():
            for wqkv, bqkv, wo, wgu, wd in layers:
                gemv(xh, wqkv, bqkv, config=cfg), gemv(xq, wo, config=cfg), gemv(xh, wgu, config=cfg)
                gemv(xi, wd, config=cfg)
            gemv(xh, head, out_dtype=torch.float32, config=cfg)
        return run
    ref, got = F.linear(xi, layers[0][4]).float(), gemv(xi, layers[0][4]).float()
    err = ((got - ref).norm() / ref.norm()).item()
    base = graph_ms(cublas)
    best, results = tuning.tune([{"BLOCK_N": c[0], "BLOCK_K": c[1], "num_warps": c[2], "num_stages": c[3]}
                                 for c in GEMV_CANDIDATES], lambda cfg: graph_ms(triton_gemv(cfg)))
    nbytes = SHAPE.weight_bytes
    row = {"cublas_ms": base, "cublas_tb_s": nbytes / base / 1e9, "best": best,
           "best_ms": min(t for _, t in results), "best_tb_s": nbytes / min(t for _, t in results) / 1e9,
           "ratio_vs_cublas": base / min(t for _, t in results), "rel_err": err, "copy_tb_s": copy_tb_s,
           "ms": {str(tuple(c.values())): round(t, 4) for c, t in results}}
    log(row)
    del layers, head
    torch.cuda.empty_cache()
    return row
