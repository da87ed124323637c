#!/usr/bin/env python3
"""Tune the quantized-weight kernels on this GPU at the Qwen2.5-7B projections, and check them.

For each kernel and projection (fused qkv, o, gate_up, down; AWQ-style 4-bit groups of 128 and FP8 with
one scale per output channel), in bf16: every candidate launch config is first checked against the
kernel's torch reference (max error over max |reference|, printed), then timed. The batch-1 GEMVs run
with the prologue the decode step fuses into them (RMSNorm with the residual before qkv and gate_up,
SwiGLU before down) and the GEMMs at 64 rows (batched decode) and a 4096-token prefill. Timing replays a
CUDA graph that calls the kernel once on each of several copies of the weights (more bytes than L2), as a
decode step reads each layer's weights once. Printed per kernel and projection: the best config, its
time, and its fraction of the weight-read roofline (bytes over the copy bandwidth measured first, here),
next to bf16 (the tuned bf16 GEMV at one row, cuBLAS above). The candidates include the alternatives the
engine can take: a GEMV with its prologue run as separate kernels first (FUSE 0), the FP8 GEMV on the
tensor cores (DOT), the 4-bit weight dequantized and multiplied by cuBLAS (DEQUANT); for FP8 layers with
FP8 activations the batched path (unit-scale or row-wise torch._scaled_mm, or the W8A16 GEMM) is chosen
per batch size. Each stage runs in its own process.

Writes $OUT/quant_tune.json (every measurement) and $OUT/quant_tuned_configs.json (the winners, in the
format of hosttune_engine/kernels/tuned_configs.json: merge them into it, or point $HOSTTUNE_KERNEL_CONFIGS
at the file).
Example: python benchmarks/engine/quant_tune.py --out /tmp/quant-tune      (--tiny: the CPU test)
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import common  # noqa: E402,F401  (puts the engine on sys.path)
import torch  # noqa: E402

import quant_tune_cases as cases  # noqa: E402
from hosttune_engine.kernels.dequant_gemm import w4a16_gemm, w8a16_gemm  # noqa: E402
from hosttune_engine.kernels.fp8_gemv import fp8_gemv, fp8_gemv_ref  # noqa: E402
from hosttune_engine.kernels.fp8_scaled_mm import fp8_scaled_mm, fp8_scaled_mm_ref, supports_fp8_mm  # noqa: E402
from hosttune_engine.kernels.gemv import RMSNORM_RESIDUAL, SWIGLU, gemv, gemv_rmsnorm, gemv_swiglu  # noqa: E402
from hosttune_engine.kernels.int4_gemv import int4_gemv, int4_gemv_ref  # noqa: E402
from hosttune_engine.kernels.tuning import batch_bucket, launch_config  # noqa: E402
from hosttune_engine.kernels.gemv import DEFAULT as GEMV_DEFAULT  # noqa: E402
from hosttune_engine.layers.deferred import DeferredRMSNorm, DeferredSwiGLU  # noqa: E402
from hosttune_engine.quant.kernel_dispatch import gemv_one_row  # noqa: E402
from hosttune_engine.tuner.timing import Timer  # noqa: E402

GROUP = 128
TOL = 2e-2  # max |error| / max |reference| for bf16 outputs
L2_SPAN = 256 << 20  # weight copies per timing graph span at least this many bytes


class Tuner:
    def __init__(self, device, dtype, budget_s: float, tiny: bool):
        self.device, self.dtype, self.tiny = device, dtype, tiny
        self.deadline = time.perf_counter() + budget_s
        self.rows: list[dict] = []
        self.table: dict = {}
        self.skipped: list[str] = []
        self.n_copies = 1  # weight copies the current sweep times over

    # -- timing ---------------------------------------------------------------------------------------------
    def per_call_ms(self, calls) -> float:
        """ms of one call: a CUDA graph calling each of `calls` once, replayed; wall time on the CPU."""
        return Timer(self.device).per_call_ms(calls)

    def copies(self, nbytes: int) -> int:
        return 1 if self.tiny else max(2, min(24, -(-L2_SPAN // nbytes)))

    # -- one sweep ------------------------------------------------------------------------------------------
    def sweep(self, kernel: str, proj, m: int, candidates, call, want, roof_ms: float, bf16_ms: float | None):
        """call(cfg, i) -> zero-arg callable on weight copy i (None: the config does not apply); want: the
        reference output of copy 0."""
        tried = []
        for cfg in candidates:
            if time.perf_counter() > self.deadline:
                self.skipped.append(f"{kernel} {proj.name} m={m} {cfg}")
                continue
            tried.append(self._try(cfg, call, want))
        ok = [t for t in tried if t["ms"] is not None]
        row = {"kernel": kernel, "proj": proj.name, "n": proj.n, "k": proj.k, "m": m, "roofline_ms": roof_ms,
               "bf16_ms": bf16_ms, "tried": tried, "max_err": max((t["err"] for t in tried if t["err"] is not None),
                                                                  default=None)}
        if ok:
            best = min(ok, key=lambda t: t["ms"])
            row.update(best=best["cfg"], best_ms=best["ms"], best_err=best["err"],
                       vs_roofline=roof_ms / best["ms"], vs_bf16=(bf16_ms / best["ms"]) if bf16_ms else None)
        self.rows.append(row)
        self._print(row)
        return row

    def _try(self, cfg, call, want) -> dict:
        try:
            first = call(cfg, 0)
            if first is None:
                return {"cfg": cfg, "ms": None, "err": None, "error": "not applicable"}
            got = first()
            err = ((got.float() - want.float()).abs().max() / want.float().abs().max().clamp_min(1e-30)).item()
            if not err <= TOL:
                return {"cfg": cfg, "ms": None, "err": err, "error": "wrong result"}
            return {"cfg": cfg, "ms": self.per_call_ms([call(cfg, i) for i in range(self.n_copies)]), "err": err}
        except Exception as e:  # a config that does not compile or fit is reported and skipped
            return {"cfg": cfg, "ms": None, "err": None, "error": f"{type(e).__name__}: {str(e)[:160]}"}

    def _print(self, row) -> None:
        errs = f"max err {row['max_err']:.1e}" if row["max_err"] is not None else "no result"
        if "best" not in row:
            print(f"{row['kernel']:>11} {row['proj']:>7} m={row['m']:<5} NO CONFIG RAN ({errs}): "
                  f"{[t.get('error') for t in row['tried']][:2]}", flush=True)
            return
        bf16 = f" bf16 {row['bf16_ms'] * 1e3:7.1f} us ({row['vs_bf16']:.2f}x)" if row["bf16_ms"] else ""
        print(f"{row['kernel']:>11} {row['proj']:>7} m={row['m']:<5} {row['best_ms'] * 1e3:8.1f} us "
              f"{row['vs_roofline']:.2f} of roofline{bf16}  {errs}  {row['best']}", flush=True)

    def record(self, kernel: str, key: str, cfg: dict) -> None:
        self.table.setdefault(kernel, {})[key] = cfg


def copy_tb_s(device) -> float:
    if device.type != "cuda":
        return 0.01
    n = 1 << 30
    src = torch.empty(n, dtype=torch.uint8, device=device).random_()
    dst = torch.empty_like(src)
    ms = common.bench_ms(lambda: dst.copy_(src), rep_ms=100)
    del src, dst
    return 2 * n / ms / 1e9


def gemv_inputs(proj, dtype, device) -> dict:
    """The raw inputs of the GEMV's prologue, as the decode step hands them over."""
    k = proj.k
    if proj.prologue == SWIGLU:
        return {"x": torch.randn(1, 2 * k, device=device).to(dtype)}
    inputs = {"x": torch.randn(1, k, device=device).to(dtype)}
    if proj.prologue == RMSNORM_RESIDUAL:
        inputs.update(residual=torch.randn(1, k, device=device).to(dtype), eps=1e-6,
                      norm_weight=(torch.rand(k, device=device) + 0.5).to(dtype),
                      residual_out=torch.empty(1, k, device=device, dtype=dtype))
    return inputs


def deferred(proj, inputs):
    """The GEMV's input as the one-row decode step hands it over: a deferred RMSNorm / SwiGLU, or the row."""
    if proj.prologue == SWIGLU:
        return DeferredSwiGLU(inputs["x"])
    if proj.prologue == RMSNORM_RESIDUAL:
        return DeferredRMSNorm(inputs["x"], inputs["norm_weight"], 1e-6, inputs["residual"], inputs["residual_out"])
    return inputs["x"]


def _prologue_kwargs(proj, inputs) -> dict:
    return {k: v for k, v in inputs.items() if k != "x"} | {"prologue": proj.prologue}


def bf16_gemv_ms(t: Tuner, proj, inputs) -> float:
    w = [torch.randn(proj.n, proj.k, device=t.device).to(t.dtype) for _ in range(t.copies(proj.n * proj.k * 2))]
    cfg = launch_config("gemv", f"{str(t.dtype).removeprefix('torch.')}-m1", t.device, GEMV_DEFAULT)
    x = inputs["x"]

    def call(i):
        if proj.prologue == SWIGLU:
            return lambda: gemv_swiglu(x, w[i], config=cfg)
        if proj.prologue == RMSNORM_RESIDUAL:
            return lambda: gemv_rmsnorm(x, inputs["norm_weight"], 1e-6, w[i], None, inputs["residual"],
                                        inputs["residual_out"], config=cfg)
        return lambda: gemv(x, w[i], config=cfg)
    return t.per_call_ms([call(i) for i in range(len(w))])


def tune_gemvs(t: Tuner, projs, copy_bw: float) -> dict:
    """Batch-1 GEMVs, FP8 and 4-bit, with their prologues; returns the linear-layer time of a step."""
    step = {"fp8_gemv": 0.0, "int4_gemv": 0.0, "bf16_gemv": 0.0}
    fp8_cands = cases.tiny_candidates(cases.FP8_GEMV) if t.tiny else cases.FP8_GEMV
    int4_cands = cases.tiny_candidates(cases.INT4_GEMV) if t.tiny else cases.INT4_GEMV
    # gate_up first: the most bytes, and qkv after it reuses its compiled prologue variant
    for proj in sorted(projs, key=lambda p: ("gate_up", "qkv", "down", "o").index(p.name)):
        inputs = gemv_inputs(proj, t.dtype, t.device)
        x, extra = inputs["x"], _prologue_kwargs(proj, inputs)
        bias = torch.randn(proj.n, device=t.device).to(t.dtype) if proj.has_bias else None
        ref_extra = {**extra, "residual_out": torch.empty_like(x)} if "residual_out" in extra else extra
        bf16 = None if t.tiny else bf16_gemv_ms(t, proj, inputs)
        step["bf16_gemv"] += bf16 or 0.0
        for kernel, cands, make in (("int4_gemv", int4_cands, _int4_weights), ("fp8_gemv", fp8_cands, _fp8_weights)):
            ws = make(t, proj)
            t.n_copies = len(ws)
            if kernel == "int4_gemv":
                args = lambda w: (w.qweight, w.scales, w.zeros, None, GROUP, bias)  # noqa: E731
                fn, ref = int4_gemv, int4_gemv_ref
            else:
                args = lambda w: (w.weight, w.scale, w.scale_row, proj.k, bias)  # noqa: E731
                fn, ref = fp8_gemv, fp8_gemv_ref
            want = ref(x, *args(ws[0]), **ref_extra)
            row = t.sweep(kernel, proj, 1, cands,
                          lambda cfg, i: (lambda: gemv_one_row(fn, cfg, args(ws[i]), deferred(proj, inputs))),
                          want, ws[0].nbytes / copy_bw / 1e9, bf16)
            if "best" in row:
                t.record(kernel, f"{_dtype(t)}-le1-{proj.n}x{proj.k}", row["best"])
                step[kernel] += row["best_ms"]
            del ws
    return step


def _dtype(t: Tuner) -> str:
    return str(t.dtype).removeprefix("torch.")


def _int4_weights(t: Tuner, proj, most: int = 24):
    first = cases.int4_weights(proj.n, proj.k, GROUP, t.device, 0)
    count = min(most, t.copies(first.nbytes))
    return [first] + [cases.int4_weights(proj.n, proj.k, GROUP, t.device, s) for s in range(1, count)]


def _fp8_weights(t: Tuner, proj, most: int = 24):
    first = cases.fp8_weights(proj.n, proj.k, t.device, 0)
    count = min(most, t.copies(first.nbytes))
    return [first] + [cases.fp8_weights(proj.n, proj.k, t.device, s) for s in range(1, count)]


def bf16_linear_ms(t: Tuner, proj, x, n_copies: int) -> float | None:
    if t.tiny:
        return None
    w = [torch.randn(proj.n, proj.k, device=t.device).to(t.dtype) for _ in range(n_copies)]
    return t.per_call_ms([lambda i=i: torch.nn.functional.linear(x, w[i]) for i in range(n_copies)])


def tune_gemms(t: Tuner, projs, m: int, copy_bw: float) -> dict:
    """The W4A16 and W8A16 GEMMs at m rows, and for FP8 the FP8 tensor-core paths; per projection."""
    cands = cases.GEMM_FEW_ROWS if m <= 128 else cases.GEMM_MANY_ROWS
    cands = cases.tiny_candidates(cands) if t.tiny else cands
    totals = {"unit": 0.0, "rowwise": 0.0, "w8a16": 0.0}
    for proj in projs:
        x = torch.randn(m, proj.k, device=t.device).to(t.dtype)
        bias = torch.randn(proj.n, device=t.device).to(t.dtype) if proj.has_bias else None
        io_bytes = (m * proj.k + m * proj.n) * x.element_size()
        most = 24 if m <= 128 else 2  # a prefill GEMM is compute-bound: L2 hardly matters
        bf16 = bf16_linear_ms(t, proj, x, 1 if t.tiny else max(2, min(most, -(-L2_SPAN // (proj.n * proj.k * 2)))))
        for kernel in ("w4a16_gemm", "w8a16_gemm"):
            ws = _int4_weights(t, proj, most) if kernel == "w4a16_gemm" else _fp8_weights(t, proj, most)
            t.n_copies = len(ws)
            kernel_cands = cands
            if kernel == "w4a16_gemm":
                args = lambda w: (w.qweight, w.scales, w.zeros, None, GROUP, bias)  # noqa: E731
                fn, want = w4a16_gemm, int4_gemv_ref(x, *args(ws[0]))
            else:
                kernel_cands = [c for c in cands if "DEQUANT" not in c]
                args = lambda w: (w.weight, w.scale, w.scale_row, proj.k, bias)  # noqa: E731
                fn, want = w8a16_gemm, fp8_gemv_ref(x, *args(ws[0]))
            roof = (ws[0].nbytes + io_bytes) / copy_bw / 1e9
            row = t.sweep(kernel, proj, m, kernel_cands, lambda cfg, i: (lambda: fn(x, *args(ws[i]), config=cfg)), want,
                          roof, bf16)
            if "best" in row:
                for bucket in _buckets(m):
                    t.record(kernel, f"{_dtype(t)}-{bucket}-{proj.n}x{proj.k}", row["best"])
            if kernel == "w8a16_gemm":
                totals["w8a16"] += row.get("best_ms", float("inf"))
                _fp8_mm_paths(t, proj, m, x, bias, ws, roof, bf16, totals)
            del ws
    return totals


def _fp8_mm_paths(t: Tuner, proj, m: int, x, bias, ws, roof: float, bf16, totals: dict) -> None:
    if not supports_fp8_mm(t.device):
        totals["unit"] = totals["rowwise"] = float("inf")
        return
    want = fp8_scaled_mm_ref(x, ws[0].weight, ws[0].row_scale, bias)
    unit = torch.ones((), device=t.device)
    for method in ("unit", "rowwise"):
        def call(cfg, i, rowwise=method == "rowwise"):
            return lambda: fp8_scaled_mm(x, ws[i].weight, ws[i].row_scale, bias, unit, rowwise=rowwise)
        row = t.sweep(f"fp8_mm:{method}", proj, m, [{"METHOD": method}], call, want, roof, bf16)
        totals[method] += row.get("best_ms", float("inf"))
    _check_bias(t, proj, x, ws[0], unit)


def _check_bias(t: Tuner, proj, x, w, unit) -> None:
    """Both FP8 tensor-core paths with a bias (qkv has one), against the reference: printed."""
    bias = torch.randn(proj.n, device=t.device).to(t.dtype)
    want = fp8_scaled_mm_ref(x, w.weight, w.row_scale, bias).float()
    for rowwise in (False, True):
        try:
            got = fp8_scaled_mm(x, w.weight, w.row_scale, bias, unit, rowwise=rowwise).float()
            result = f"max err {((got - want).abs().max() / want.abs().max()).item():.1e}"
        except Exception as e:  # reported: the engine must not take a path that refuses a bias
            result = f"{type(e).__name__}: {str(e)[:160]}"
        print(f"fp8_mm {'rowwise' if rowwise else 'unit'} with a bias, {proj.name} m={x.shape[0]}: {result}",
              flush=True)


def _buckets(m: int) -> list[str]:
    return ["le8", "le32", "le64", "le128"] if m <= 128 else [batch_bucket(m)]


def lm_head_ms(t: Tuner) -> float:
    """The bf16 LM head GEMV of a decode step (fp32 logits), the one matrix the quantized step keeps in bf16."""
    v, h = (cases.TINY if t.tiny else cases.QWEN7B)["vocab"], (cases.TINY if t.tiny else cases.QWEN7B)["hidden"]
    w = torch.randn(v, h, device=t.device).to(t.dtype)
    x = torch.randn(1, h, device=t.device).to(t.dtype)
    cfg = launch_config("gemv", f"{_dtype(t)}-m1", t.device, GEMV_DEFAULT)
    return t.per_call_ms([lambda: gemv(x, w, out_dtype=torch.float32, config=cfg)] * 2)


STAGES = {  # stage -> share of the budget; each runs in its own process, so a fault in one loses only it
    "gemv": 0.55, "prefill": 0.2, "batched": 0.25}


def run_stage(stage: str, args, out: Path) -> None:
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32  # the interpreter's dot needs fp32
    shape = cases.TINY if args.tiny else cases.QWEN7B
    projs = cases.projections(**{k: shape[k] for k in ("hidden", "inter", "heads", "kv_heads", "head_dim")})
    projs = [p for p in projs if not args.proj or p.name in args.proj]
    t = Tuner(device, dtype, args.budget_s * STAGES[stage], args.tiny)
    bw = copy_tb_s(device)
    res = {"copy_tb_s": bw}
    if stage == "gemv":
        res["b1_step_linear_ms"] = tune_gemvs(t, projs, bw)
        res["lm_head_ms"] = lm_head_ms(t)
    elif stage == "prefill":
        res["prefill_fp8_paths_ms"] = tune_gemms(t, projs, 160 if args.tiny else 4096, bw)
    else:
        res["b64_fp8_paths_ms"] = tune_gemms(t, projs, 8 if args.tiny else 64, bw)
    res.update(rows=t.rows, table=t.table, skipped=t.skipped, device=device_name(device))
    (out / f"stage-{stage}.json").write_text(json.dumps(res, default=str))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="quant-tune")
    parser.add_argument("--tiny", action="store_true", help="tiny shapes and two configs per kernel (CPU test)")
    parser.add_argument("--budget-s", type=float, default=190.0, help="stop starting sweeps after this long")
    parser.add_argument("--proj", action="append", choices=("qkv", "o", "gate_up", "down"),
                        help="tune only this projection (repeatable; default: all four)")
    parser.add_argument("--stage", choices=list(STAGES),
                        help="run only this stage, in this process: writes stage-STAGE.json (its rows and winners)")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.stage:
        return run_stage(args.stage, args, out)
    t0 = time.perf_counter()
    res: dict = {"stages": {}}
    for stage in STAGES:
        cmd = [sys.executable, __file__, "--out", str(out), "--budget-s", str(args.budget_s), "--stage", stage,
               *(f"--proj={p}" for p in args.proj or ())]
        code = subprocess.run(cmd + (["--tiny"] if args.tiny else [])).returncode
        path = out / f"stage-{stage}.json"
        res["stages"][stage] = code
        if code == 0 and path.exists():
            part = json.loads(path.read_text())
            for key in ("rows", "skipped"):
                res.setdefault(key, []).extend(part.pop(key))
            for kernel, keys in part.pop("table").items():
                res.setdefault("table", {}).setdefault(kernel, {}).update(keys)
            res.update(part)
        else:
            print(f"stage {stage} failed (exit {code}); its results are missing", flush=True)
    finish(res, cases.TINY if args.tiny else cases.QWEN7B, out, time.perf_counter() - t0)


def device_name(device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


def _bucket_winners(rows: list[dict], table: dict, dtype: str) -> None:
    """Per kernel and batch bucket, the config with the least total time over the projections: the fallback
    for shapes the tuner did not see."""
    for kernel in ("fp8_gemv", "int4_gemv", "w4a16_gemm", "w8a16_gemm"):
        for m in sorted({r["m"] for r in rows if r["kernel"] == kernel}):
            totals: dict = {}
            for r in (r for r in rows if r["kernel"] == kernel and r["m"] == m):
                for tr in r["tried"]:
                    key = json.dumps(tr["cfg"], sort_keys=True)
                    totals[key] = totals.get(key, 0.0) + (tr["ms"] if tr["ms"] is not None else float("inf"))
            if totals and min(totals.values()) < float("inf"):
                best = json.loads(min(totals, key=totals.get))
                for bucket in (["le1"] if m == 1 else _buckets(m)):
                    table.setdefault(kernel, {})[f"{dtype}-{bucket}"] = best


def _fp8_paths(res: dict, table: dict, dtype: str, layers: int) -> None:
    """The FP8 batched path with the least total time over the projections, per bucket."""
    for label, m in (("prefill_fp8_paths_ms", 4096), ("b64_fp8_paths_ms", 64)):
        paths = res.get(label)
        if not paths:
            continue
        print(f"{label}: " + ", ".join(f"{k} {v * layers:.3f} ms/step" for k, v in paths.items()))
        if min(paths.values()) < float("inf"):
            for bucket in _buckets(m):
                table.setdefault("fp8_mm", {})[f"{dtype}-{bucket}"] = {"METHOD": min(paths, key=paths.get)}


def finish(res: dict, shape: dict, out: Path, elapsed: float) -> None:
    rows, table = res.get("rows", []), res.setdefault("table", {})
    dtype = "float32" if res.get("device", "cpu") == "cpu" else "bfloat16"
    layers = shape["layers"]
    _bucket_winners(rows, table, dtype)
    print()
    if "b1_step_linear_ms" in res:
        summary = {k: v * layers + res["lm_head_ms"] for k, v in res["b1_step_linear_ms"].items()}
        res["b1_step_with_lm_head_ms"] = summary
        print(f"batch-1 linear layers of a {layers}-layer step + bf16 LM head ({res['lm_head_ms'] * 1e3:.0f} us): "
              + ", ".join(f"{k} {v:.3f} ms" for k, v in summary.items()))
    _fp8_paths(res, table, dtype, layers)
    res["elapsed_s"] = elapsed
    (out / "quant_tune.json").write_text(json.dumps(res, indent=1, default=str))
    (out / "quant_tuned_configs.json").write_text(json.dumps({res.get("device", "cpu"): table}, indent=1,
                                                             sort_keys=True))
    failed = [r for r in rows if "best" not in r]
    print(f"stages {res['stages']} (0 = ran); {len(rows)} sweeps, {len(failed)} with no config, "
          f"{len(res.get('skipped', []))} configs skipped past the budget, {elapsed:.0f} s; max error over all "
          f"checked configs {max((r['max_err'] or 0) for r in rows) if rows else float('nan'):.1e}; "
          f"configs in {out / 'quant_tuned_configs.json'}")


if __name__ == "__main__":
    main()
