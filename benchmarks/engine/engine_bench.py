"""End-to-end benchmarks of the engine on the Qwen2.5-7B-shaped dummy model (bf16), each
beside its floor measured on the same GPU: (d) decode tok/s vs the cuBLAS linear-layer floor
(every matrix of a decode step replayed as one CUDA graph), (e) TTFT vs the prefill compute
floor, (f) offline throughput vs the workload's roofline model. Plus two checks: CUDA-graph
logits equal eager logits, and what the fp32 LM-head GEMM costs."""

from __future__ import annotations

import statistics
import time

import torch
import torch.nn.functional as F

from benchmarks.engine.common import QWEN25_7B, SHAPE, graph_ms, model_folder, per_library, replay_ms, sync
from hosttune_engine import Engine, EngineConfig, SamplingParams
from hosttune_engine.core.cuda_graphs import padded_size
from hosttune_engine.core.messages import EngineRequest

_ids = iter(range(10**9))


def build_engine(**kw) -> Engine:
    options = {"load_format": "dummy", "dtype": "bfloat16", "kernel_backend": "triton", "max_model_len": 8192,
               "num_kv_blocks": 24576, "max_num_seqs": 256, "enable_prefix_caching": False, **kw}
    return Engine(EngineConfig(model=model_folder(QWEN25_7B), **options))


def _prompts(n: int, length: int, seed: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, SHAPE.vocab, (n, length), generator=gen).tolist()


SAMPLED = {"temperature": 0.8, "top_p": 0.95}  # decode_rate's sampled variant


def _add(engine: Engine, prompts, max_tokens: int, sampled: bool = False) -> list[str]:
    rids = []
    for ids in prompts:
        rid = f"b{next(_ids)}"
        params = SamplingParams(**(SAMPLED if sampled else {"temperature": 0}), max_tokens=max_tokens, ignore_eos=True)
        engine.add_request(EngineRequest(rid, ids, params))
        rids.append(rid)
    return rids


def _drain(engine: Engine) -> None:
    while engine.has_unfinished_requests():
        engine.step()


def linear_floor(model, batch: int) -> dict:
    """Every projection of every layer and the LM head at this batch, one CUDA graph, through each cuBLAS
    library: the floor is the faster."""
    dt, dev = torch.bfloat16, "cuda"
    h = torch.randn(batch, SHAPE.hidden, dtype=dt, device=dev)
    q = torch.randn(batch, SHAPE.heads * SHAPE.head_dim, dtype=dt, device=dev)
    i = torch.randn(batch, SHAPE.inter, dtype=dt, device=dev)

    def step():
        for layer in model.model.layers:
            attn, mlp = layer.self_attn, layer.mlp
            F.linear(h, attn.qkv_proj.weight, attn.qkv_proj.bias)
            F.linear(q, attn.o_proj.weight)
            F.linear(h, mlp.gate_up_proj.weight)
            F.linear(i, mlp.down_proj.weight)
        F.linear(h, model.lm_head.weight)
    by_library = per_library(lambda: graph_ms(step))
    return {"floor_ms": min(by_library.values()), "floor_ms_by_library": by_library}


def lm_head_paths(model, batches=(1, 64, 256)) -> list[dict]:
    """fp32 logits straight from the GEMM (what the engine does) vs bf16 logits, and bf16 upcast."""
    w = model.lm_head.weight
    rows = []
    for b in batches:
        h = torch.randn(b, SHAPE.hidden, dtype=torch.bfloat16, device="cuda")
        row = {"batch": b, "bf16_out_us": graph_ms(lambda: F.linear(h, w)) * 1e3,
               "bf16_then_float_us": graph_ms(lambda: F.linear(h, w).float()) * 1e3}
        try:
            row["mm_out_dtype_fp32_us"] = graph_ms(lambda: torch.mm(h, w.t(), out_dtype=torch.float32)) * 1e3
        except (RuntimeError, TypeError) as e:
            row["mm_out_dtype_fp32_us"] = f"unavailable: {e}"[:200]
        rows.append(row)
    return rows


def decode_rate(engine: Engine, batch: int, prompt_len: int = 128, steps: int = 64, sampled: bool = False) -> dict:
    """Steady decode through Engine.step (scheduler, graph replay, sampling, outputs): tok/s. Greedy, or
    with `sampled` temperature and top-p sampling (SAMPLED) after the graph."""
    rids = _add(engine, _prompts(batch, prompt_len, seed=batch), max_tokens=steps + 16, sampled=sampled)
    counts = dict.fromkeys(rids, 0)
    while min(counts.values()) < 2:
        for out in engine.step():
            counts[out.request_id] += len(out.new_token_ids)
    sync()
    t0 = time.perf_counter()
    for _ in range(steps):
        engine.step()
    sync()
    step_ms = (time.perf_counter() - t0) / steps * 1e3
    replayed = _replay_ms(engine, batch)
    for rid in rids:
        engine.abort_request(rid)
    _drain(engine)
    return {"batch": batch, "sampled": SAMPLED if sampled else None, "context_max": prompt_len + steps + 2,
            "step_ms": step_ms, "tok_s": batch / step_ms * 1e3,
            "graph_replay_ms": replayed, "host_overhead_ms": None if replayed is None else step_ms - replayed}


def _replay_ms(engine: Engine, batch: int) -> float | None:
    graphs = engine.runner.graphs
    if graphs is None or not graphs.use_graphs:
        return None
    return replay_ms(graphs.graphs[padded_size(batch, graphs.sizes)], replays=10)


def ttft_ms(engine: Engine, prompt_len: int, reps: int = 5) -> dict:
    """Idle engine, one prompt, one output token: wall time from add_request to the token."""
    _add(engine, _prompts(1, prompt_len, seed=7), max_tokens=1)  # warm this length's kernel variants
    _drain(engine)
    times = []
    for rep in range(reps):
        sync()
        t0 = time.perf_counter()
        (rid,) = _add(engine, _prompts(1, prompt_len, seed=100 + rep), max_tokens=1)
        while not any(o.request_id == rid and o.new_token_ids for o in engine.step()):
            pass
        times.append((time.perf_counter() - t0) * 1e3)
        _drain(engine)
    return {"prompt_tokens": prompt_len, "ttft_ms": statistics.median(times), "all_ms": times}


def offline_throughput(engine: Engine, n_req: int, n_in: int, n_out: int) -> dict:
    """All requests at once, run to completion. Also: time inside the model runner by step kind (graph-replayed
    decode or eager), and how many Triton kernels were compiled during the run (0 when warm)."""
    prompts = _prompts(n_req, n_in, seed=n_in * 1000 + n_out)
    steps_by_kind = _time_runner_steps(engine)
    compiled = triton_cache_entries()
    if engine.kernel_compiles is not None:  # from here every kernel built is logged by name, as while serving
        engine.kernel_compiles.mark_ready()
    sync()
    t0 = time.perf_counter()
    _add(engine, prompts, max_tokens=n_out)
    steps = tokens = 0
    while engine.has_unfinished_requests():
        for out in engine.step():
            tokens += len(out.new_token_ids)
        steps += 1
    sync()
    seconds = time.perf_counter() - t0
    del engine.runner.launch, engine.runner.collect  # back to the class methods
    runner_s = steps_by_kind["graph_s"] + steps_by_kind["eager_s"]
    return {"requests": n_req, "in": n_in, "out": n_out, "seconds": seconds, "output_tokens": tokens,
            "steps": steps, "output_tok_s": tokens / seconds, "runner": steps_by_kind,
            "outside_runner_s": seconds - runner_s, "kernels_compiled": triton_cache_entries() - compiled}


def _time_runner_steps(engine: Engine) -> dict:
    """Host time inside the runner by step kind: its launch (packing, enqueue) plus its collect (the wait for
    the device). Engine.step leaves a launched step running and builds outputs meanwhile, so the rest of the
    wall time is host work that overlaps the device, not device idle time. The same time is also split by phase:
    steps carrying a prefill chunk against decode-only steps (where a quantized model's GEMMs differ most)."""
    runner, stats = engine.runner, {"graph_steps": 0, "graph_s": 0.0, "eager_steps": 0, "eager_s": 0.0,
                                    "prefill_steps": 0, "prefill_s": 0.0, "decode_steps": 0, "decode_s": 0.0,
                                    "slowest_step_s": 0.0, "launched_ahead": 0}
    launch, collect = runner.launch, runner.collect
    kinds: dict[int, tuple[str, str]] = {}

    def add(kinds_of_step: tuple[str, str], dt: float) -> None:
        for kind in kinds_of_step:
            stats[f"{kind}_s"] += dt
        stats["slowest_step_s"] = max(stats["slowest_step_s"], dt)

    def timed_launch(sched, after=None):
        t0 = time.perf_counter()
        launched = launch(sched, after=after)
        stats["launched_ahead"] += after is not None
        kind = "graph" if after is not None or runner._runs_graph(sched) else "eager"
        kinds[id(launched)] = of_step = (kind, "prefill" if sched.num_prefill_seqs else "decode")
        for k in of_step:
            stats[f"{k}_steps"] += 1
        add(of_step, time.perf_counter() - t0)
        return launched

    def timed_collect(launched):
        t0 = time.perf_counter()
        result = collect(launched)
        add(kinds.pop(id(launched)), time.perf_counter() - t0)
        return result
    runner.launch, runner.collect = timed_launch, timed_collect
    return stats


def triton_cache_entries() -> int:
    import os
    from pathlib import Path

    folder = Path(os.environ.get("TRITON_CACHE_DIR") or Path.home() / ".triton" / "cache")
    return len(list(folder.iterdir())) if folder.is_dir() else -1


def host_profile(engine: Engine, batch: int, steps: int = 40, top: int = 16) -> dict:
    """cProfile of steady decode steps at this batch: where the host time goes (per step, microseconds)."""
    import cProfile
    import pstats

    rids = _add(engine, _prompts(batch, 128, seed=batch + 2), max_tokens=steps + 16)
    counts = dict.fromkeys(rids, 0)
    while min(counts.values()) < 2:
        for out in engine.step():
            counts[out.request_id] += len(out.new_token_ids)
    prof = cProfile.Profile()
    sync()
    t0 = time.perf_counter()
    prof.enable()
    for _ in range(steps):
        engine.step()
    prof.disable()
    wall = (time.perf_counter() - t0) / steps
    for rid in rids:
        engine.abort_request(rid)
    _drain(engine)
    st = pstats.Stats(prof).stats  # (file, line, fn) -> (cc, nc, tottime, cumtime, callers)
    rows = sorted(((k, v[2], v[3]) for k, v in st.items()), key=lambda r: -r[1])[:top]
    return {"batch": batch, "step_ms_profiled": wall * 1e3,
            "top_tottime_us": [{"fn": f"{k[0].split('/')[-1]}:{k[1]}:{k[2]}", "tot_us": t / steps * 1e6,
                                "cum_us": c / steps * 1e6} for k, t, c in rows]}


def ttft_floor(prompt_len: int, ceilings: dict) -> dict:
    """A prompt's prefill cannot beat its FLOPs at the GEMM rate, nor one read of the weights at the copy
    bandwidth: the larger of the two (a short prompt is bound by the weights' bytes)."""
    flops_ms = SHAPE.prefill_flops(prompt_len) / ceilings["gemm_tflop_s"] / 1e9
    bytes_ms = SHAPE.weight_bytes / ceilings["copy_tb_s"] / 1e9
    return {"floor_ms": max(flops_ms, bytes_ms), "floor_bound": "FLOPs" if flops_ms >= bytes_ms else "weight bytes"}


def roofline(n_req: int, n_in: int, n_out: int, copy_tb_s: float, gemm_tflop_s: float, max_batch: int = 256) -> dict:
    """The roofline: prefill FLOPs over the GEMM rate plus each decode step's weight and KV bytes over the
    copy bandwidth. 'refined' also lets a decode step be compute-bound (max of its two times), which it is
    at batch 256 (2 * 256 * 7.07e9 FLOP take longer than reading 14 GB)."""
    bw, rate = copy_tb_s * 1e12, gemm_tflop_s * 1e12
    prefill_s = n_req * SHAPE.prefill_flops(n_in) / rate
    decode_s = refined_s = 0.0
    for wave in range(0, n_req, max_batch):
        b = min(max_batch, n_req - wave)
        for s in range(1, n_out):  # the first output token comes out of the prefill
            mem = (SHAPE.weight_bytes + b * (n_in + s) * SHAPE.kv_bytes_per_token) / bw
            decode_s += mem
            refined_s += max(mem, SHAPE.decode_step_flops(b) / rate)
    total = prefill_s + decode_s
    return {"prefill_s": prefill_s, "decode_s": decode_s, "model_s": total, "model_tok_s": n_req * n_out / total,
            "refined_s": prefill_s + refined_s, "refined_tok_s": n_req * n_out / (prefill_s + refined_s)}


def graph_vs_eager(engine: Engine, prompt_lens=(7, 100, 515, 1500, 3000)) -> dict:
    """One decode step of 5 sequences through the CUDA graph (padded to 8) and eagerly: logits compared."""
    rids = _add(engine, [p[0] for p in (_prompts(1, n, seed=n) for n in prompt_lens)], max_tokens=8)
    counts = dict.fromkeys(rids, 0)
    while min(counts.values()) < 1:
        for out in engine.step():
            counts[out.request_id] += len(out.new_token_ids)
    sched = engine.scheduler.schedule()
    runner = engine.runner
    with torch.inference_mode():
        graph = runner.graphs.run(sched.seqs)[0].clone()
        batch = runner._prepare(sched)
        eager = runner.model.compute_logits(runner._forward(batch)[batch.sample_rows])
    diff = (graph - eager).abs()
    result = {"batch": len(sched.seqs), "max_abs_diff": diff.max().item(),
              "rel_l2": (diff.norm() / eager.norm()).item(),
              "argmax_equal": (graph.argmax(-1) == eager.argmax(-1)).tolist()}
    engine.scheduler.postprocess(sched, graph.argmax(-1).tolist())
    for rid in rids:
        engine.abort_request(rid)
    _drain(engine)
    return result


def kernel_profile(fn, iters: int = 3, top: int = 14) -> dict:
    """GPU time per call of fn() by kernel (torch profiler, CUDA activity only), largest first."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    sync()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            fn()
        sync()
    rows = []
    for e in prof.key_averages():
        us = getattr(e, "self_device_time_total", None)
        us = us if us is not None else getattr(e, "self_cuda_time_total", 0)
        if us > 0:
            rows.append({"kernel": e.key[:90], "us": us / iters, "calls": e.count / iters})
    rows.sort(key=lambda r: -r["us"])
    return {"total_us": sum(r["us"] for r in rows), "top": rows[:top]}


def profile_decode(engine: Engine, batch: int, prompt_len: int = 128) -> dict:
    """Kernel breakdown of one decode step at this batch, run eagerly on the graph's padded inputs."""
    rids = _add(engine, _prompts(batch, prompt_len, seed=batch + 1), max_tokens=8)
    counts = dict.fromkeys(rids, 0)
    while min(counts.values()) < 2:
        for out in engine.step():
            counts[out.request_id] += len(out.new_token_ids)
    graphs = engine.runner.graphs
    b = padded_size(batch, graphs.sizes)
    with torch.inference_mode():
        result = kernel_profile(lambda: graphs._step(b))
    for rid in rids:
        engine.abort_request(rid)
    _drain(engine)
    return {"batch": batch, **result}


def profile_prefill(engine: Engine, prompt_len: int) -> dict:
    """Kernel breakdown of the one step that prefills a prompt of this length (warm)."""
    def one():
        _add(engine, _prompts(1, prompt_len, seed=11), max_tokens=1)
        _drain(engine)
    return {"prompt_tokens": prompt_len, **kernel_profile(one, iters=2)}
