"""What `hosttune-engine tune` tunes for a model (one rank's shards of it under tensor parallelism): the kernels
its plan runs, most important first (the one-row
decode projections, decode attention, then batched and prefill GEMMs of quantized weights), each entry under
the key the plan looks up, within a time budget."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from hosttune_engine.kernels import decode_attention
from hosttune_engine.kernels.dequant_gemm import DEFAULT as GEMM_DEFAULT
from hosttune_engine.kernels.fp8_gemm import DEFAULT as FP8_GEMM_DEFAULT
from hosttune_engine.kernels.fp8_gemv import DEFAULT as FP8_GEMV_DEFAULT
from hosttune_engine.kernels.gemv import DEFAULT as GEMV_DEFAULT
from hosttune_engine.kernels.int4_gemv import DEFAULT as INT4_GEMV_DEFAULT
from hosttune_engine.plan.kinds import Op
from hosttune_engine.planner.build import PlanInputs
from hosttune_engine.tuner import cases
from hosttune_engine.tuner.candidates import candidates, tiny_candidates
from hosttune_engine.tuner.cases import Shape
from hosttune_engine.tuner.sweep import Deadline, SweepResult, config_key, sweep
from hosttune_engine.tuner.timing import Timer

QUANTIZED = (Op.QKV, Op.O, Op.GATE_UP, Op.DOWN)
BATCHED_BUCKETS = ("le8", "le32", "le64", "le128")  # measured at 64 rows, the batched-decode size benchmarked
GEMV_DEFAULTS = {"fp8": FP8_GEMV_DEFAULT, "int4": INT4_GEMV_DEFAULT}


@dataclass
class Tuning:
    """A tune in progress: the table it builds and every sweep it ran."""

    inputs: PlanInputs
    timer: Timer
    deadline: Deadline
    tiny: bool = False  # two candidates a sweep (the CPU's Triton interpreter is slow)
    share_s: float = float("inf")  # what one sweep may take beyond its seeds: the budget over the sweeps planned
    table: dict = field(default_factory=dict)
    sweeps: list[SweepResult] = field(default_factory=list)

    @property
    def dt(self) -> str:
        return self.inputs.dt

    def shapes(self, ops=QUANTIZED) -> list[Shape]:
        return [Shape(op, *self.inputs.shape(op)) for op in ops if op is Op.LM_HEAD or self.inputs.layout(op)]

    def run(self, kernel: str, default: dict, case_list, rows: int = 1) -> SweepResult | None:
        """Sweep `kernel`'s candidates: its seeds always (while the budget lasts), the rest within this sweep's
        share of the budget."""
        if self.deadline.passed():
            return None
        cands, seeds = candidates(kernel, default, rows)
        if self.tiny:
            cands, seeds = tiny_candidates(cands)[:2], 1
        share = Deadline(min(self.share_s, self.deadline.seconds - self.deadline.elapsed()))
        result = sweep(kernel, cands, case_list, self.timer, share, seeds)
        self.sweeps.append(result)
        return result

    def record(self, kernel: str, keys, result: SweepResult | None) -> None:
        if result is not None and result.best is not None:
            for key in keys:
                self.table.setdefault(kernel, {})[key] = result.best.config


def tune_model(inputs: PlanInputs, budget_s: float, tiny: bool = False) -> Tuning:
    """Tune what `inputs`' plan runs on this GPU, for about `budget_s` seconds."""
    layout = inputs.layout(Op.QKV)
    kind = None if layout is None else ("fp8" if layout.is_fp8 else "int4")
    t = Tuning(inputs, Timer(torch.device("cuda" if torch.cuda.is_available() else "cpu")),
               Deadline(budget_s), tiny)
    t.share_s = budget_s / _planned_sweeps(t, kind)
    if kind is None:
        _bf16_gemv(t)
    else:
        _quant_gemvs(t, kind)
    _attention(t)
    if kind is not None:
        for m, buckets in ((8, BATCHED_BUCKETS), (16, ("gt128",))) if tiny else ((64, BATCHED_BUCKETS), (4096, ("gt128",))):
            _batched(t, kind, m, buckets)
    return t


def _planned_sweeps(t: Tuning, kind: str | None) -> int:
    if kind is None:
        return 3  # the GEMV, attention at two batch sizes
    per_shape = 2 + (kind == "fp8" and _takes_fp8_activations(t))  # the GEMV; the GEMM at 64 rows; FP8's GEMM
    return 2 + len(t.shapes()) * (per_shape + 1)  # and a prefill GEMM per shape


def _bf16_gemv(t: Tuning) -> None:
    """One config for every plain projection and the LM head at one row (the table keys it by dtype alone)."""
    shapes = [Shape(op, *t.inputs.shape(op)) for op in QUANTIZED + (Op.LM_HEAD,)]
    case_list = [cases.bf16_gemv(s, t.inputs.dtype, t.timer) for s in shapes]
    t.record("gemv", [f"{t.dt}-m1"], t.run("gemv", GEMV_DEFAULT, case_list))


def _quant_gemvs(t: Tuning, kind: str) -> None:
    """The FP8 or 4-bit GEMV per projection shape; the bucket's entry is the config fastest over all of them."""
    kernel = f"{kind}_gemv"
    results = []
    for s in t.shapes():
        result = t.run(kernel, GEMV_DEFAULTS[kind], [cases.quant_gemv(kind, s, t.inputs.dtype, t.timer)])
        t.record(kernel, [f"{t.dt}-le1-{s.n}x{s.k}"], result)
        results.append(result)
    _bucket_winner(t, kernel, [f"{t.dt}-le1"], results)


def _bucket_winner(t: Tuning, kernel: str, keys, results) -> None:
    """The config with the least total time over the shapes every one of them ran."""
    results = [r for r in results if r is not None]
    totals: dict = {}
    for r in results:
        for tried in r.tried:
            if tried.ms is not None:
                runs, ms = totals.get(config_key(tried.config), (0, 0.0))
                totals[config_key(tried.config)] = (runs + 1, ms + tried.ms)
    complete = {k: ms for k, (runs, ms) in totals.items() if runs == len(results)}
    if results and complete:
        best = min(complete, key=complete.get)
        for key in keys:
            t.table.setdefault(kernel, {})[key] = next(tr.config for r in results for tr in r.tried
                                                       if config_key(tr.config) == best)


def _attention(t: Tuning) -> None:
    """Paged decode attention of one rank's heads at one row and at 64 (the batched decode benchmarked), over
    1K-token contexts, on the cache the server keeps (an e4m3 one has entries of its own)."""
    rank, d, page, fp8_kv = t.inputs.rank, t.inputs.model.head_dim, t.inputs.block_size, t.inputs.kv_cache_fp8
    default = decode_attention.default_config(t.inputs.dtype, t.timer.device, fp8_kv)
    for batch in ((1, 4) if t.tiny else (1, 64)):
        case = cases.attention(batch, 64 if t.tiny else 1024, rank.num_heads, rank.num_kv_heads, d, page,
                               t.inputs.dtype, t.timer, fp8_kv)
        key = decode_attention.config_key(t.inputs.dtype, d, t.inputs.group, page, batch, fp8_kv)
        t.record("decode_attention", [key], t.run("decode_attention", default, [case]))


def _batched(t: Tuning, kind: str, m: int, buckets) -> None:
    """The W8A16 / W4A16 GEMM per shape at m rows; for FP8 layers taking FP8 activations on a GPU with FP8 tensor
    cores also the Triton FP8 GEMM and torch._scaled_mm, the fastest path recorded as `fp8_mm`."""
    kernel = "w8a16_gemm" if kind == "fp8" else "w4a16_gemm"
    gemms, fp8_gemms, paths = [], [], []
    for s in t.shapes():
        gemm = t.run(kernel, GEMM_DEFAULT, [cases.gemm(kind, s, m, t.inputs.dtype, t.timer)], m)
        keys = [f"{t.dt}-{b}-{s.n}x{s.k}" for b in buckets]
        t.record(kernel, keys, gemm)
        gemms.append(gemm)
        if kind == "fp8" and _takes_fp8_activations(t):
            fp8_gemms.append(_fp8_paths(t, s, m, keys, gemm, paths))
    # the buckets' entries, for a shape the budget left out: the fastest over the shapes it reached
    bucket_keys = [f"{t.dt}-{b}" for b in buckets]
    _bucket_winner(t, kernel, bucket_keys, gemms)
    _bucket_winner(t, "fp8_gemm", bucket_keys, fp8_gemms)
    _bucket_path(t, bucket_keys, paths)


def _takes_fp8_activations(t: Tuning) -> bool:
    spec = t.inputs.spec
    return spec.fp8_activations and t.inputs.gpu.has_fp8_tensor_cores and t.inputs.dtype != torch.float32


def _fp8_paths(t: Tuning, s: Shape, m: int, keys, gemm: SweepResult | None, paths: list) -> SweepResult | None:
    """The FP8 GEMM's sweep and torch._scaled_mm's two methods; the fastest path is `fp8_mm`'s entry (and its
    times per path go to `paths`). Returns the FP8 GEMM's sweep."""
    triton_case, mm_case = cases.fp8_tensor_cores(s, m, t.inputs.dtype, t.timer)
    triton = t.run("fp8_gemm", FP8_GEMM_DEFAULT, [triton_case], m) if m <= 128 else None
    t.record("fp8_gemm", keys, triton)
    if t.deadline.passed():
        return triton
    mm = sweep("fp8_mm", [{"METHOD": "unit"}, {"METHOD": "rowwise"}], [mm_case], t.timer, Deadline(float("inf")))
    t.sweeps.append(mm)
    found = {"w8a16": gemm, "triton": triton, **{tr.config["METHOD"]: _one(mm, tr) for tr in mm.tried}}
    timed = {method: r.best.ms for method, r in found.items() if r is not None and r.best is not None}
    if timed:
        paths.append(timed)
        for key in keys:
            t.table.setdefault("fp8_mm", {})[key] = {"METHOD": min(timed, key=timed.get)}
    return triton


def _bucket_path(t: Tuning, keys, paths: list[dict]) -> None:
    """`fp8_mm`'s bucket entry: the path with the least time over the shapes that timed every path."""
    methods = set.intersection(*(set(p) for p in paths)) if paths else set()
    if methods:
        best = min(methods, key=lambda method: sum(p[method] for p in paths))
        for key in keys:
            t.table.setdefault("fp8_mm", {})[key] = {"METHOD": best}


def _one(result: SweepResult, tried) -> SweepResult:
    return SweepResult(result.kernel, result.cases, (tried,), 0)
