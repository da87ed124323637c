"""Build a kernel plan from the model's config, the GPU and its tuned table.

The rules here are the engine's dispatch: a bf16 projection takes the Triton GEMV at one row (its RMSNorm or
SwiGLU input in the prologue) and cuBLAS above; a quantized one its GEMV up to four rows and a GEMM above, an
FP8 layer whose scheme quantizes activations the FP8 tensor cores where the GPU has them (`fp8_mm` picks the
path per batch bucket), and before compute capability 8.9 (no e4m3 type in Triton) every FP8 kernel with BITS 1,
decoding the weights' bytes by integer operations; launch configs come from the tuned table, per projection
shape, else per row bucket, else the kernel's default.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from hosttune_engine.errors import ConfigError
from hosttune_engine.kernels import decode_attention, prefill_attention
from hosttune_engine.kernels.dequant_gemm import DEFAULT as GEMM_DEFAULT, wgmma_unfit
from hosttune_engine.kernels.fp8_gemm import DEFAULT as FP8_GEMM_DEFAULT
from hosttune_engine.kernels.fp8_gemv import DEFAULT as FP8_GEMV_DEFAULT
from hosttune_engine.kernels.gemv import DEFAULT as GEMV_DEFAULT
from hosttune_engine.kernels.int4_gemv import DEFAULT as INT4_GEMV_DEFAULT
from hosttune_engine.kernels.race import launch_config as race_config
from hosttune_engine.model.model_config import ModelConfig
from hosttune_engine.parallel.layout import ShardLayout
from hosttune_engine.plan.gpus import GpuInfo
from hosttune_engine.plan.kinds import (DECODE_BUCKETS, GEMV_ROWS, PREFILL_BUCKETS, PROJECTIONS, ROW_BUCKETS, Fusion,
                                        Kernel, Op, Reason, RowBucket)
from hosttune_engine.plan.launch import Fp8Method, LaunchConfig
from hosttune_engine.plan.plan import Choice, KernelPlan, OpPlan
from hosttune_engine.quant.layouts import checkpoint_tensors
from hosttune_engine.quant.spec import Layout, QuantSpec

# A projection's checkpoint module (for the spec's ignore list) and what computes its input when it fuses it.
MODULES = {Op.QKV: "model.layers.0.self_attn.q_proj", Op.O: "model.layers.0.self_attn.o_proj",
           Op.GATE_UP: "model.layers.0.mlp.gate_proj", Op.DOWN: "model.layers.0.mlp.down_proj", Op.LM_HEAD: "lm_head"}
PROLOGUE = {Op.QKV: Fusion.RMSNORM, Op.GATE_UP: Fusion.RMSNORM, Op.DOWN: Fusion.SWIGLU}
FP8_INPUT = {Op.QKV: Fusion.RMSNORM_FP8, Op.GATE_UP: Fusion.RMSNORM_FP8, Op.DOWN: Fusion.SWIGLU_FP8}
FP8_MM = {Fp8Method.UNIT: Kernel.FP8_MM_UNIT, Fp8Method.ROWWISE: Kernel.FP8_MM_ROWWISE,
          Fp8Method.TRITON: Kernel.FP8_GEMM, Fp8Method.W8A16: Kernel.W8A16_GEMM}


@dataclass(frozen=True)
class PlanInputs:
    """What a plan is built from besides the tuned table."""

    model: ModelConfig
    gpu: GpuInfo
    dtype: torch.dtype
    spec: QuantSpec | None = None  # the weights' quantization, None for plain weights
    use_triton: bool = True
    kv_cache_fp8: bool = False
    block_size: int = 16
    shard: ShardLayout | None = None  # a tensor-parallel rank's shards of the model, None for the whole model

    @property
    def dt(self) -> str:
        return str(self.dtype).removeprefix("torch.")

    @property
    def on_kernels(self) -> bool:
        return self.use_triton  # on a CPU the kernels run under the Triton interpreter only where tests point them

    @property
    def rank(self) -> ShardLayout:
        """What one rank holds: its shards under tensor parallelism, else the whole model."""
        return self.shard if self.shard is not None else ShardLayout.of(self.model, 0, 1)

    def shape(self, op: Op) -> tuple[int, int]:
        """(N, K) of a projection's weight on one rank (column-parallel qkv and gate_up hold N / TP of its rows,
        row-parallel o and down K / TP of its columns, the LM head its padded vocabulary rows)."""
        r, hidden, d = self.rank, self.model.hidden_size, self.model.head_dim
        q, kv, inter = r.num_heads * d, r.num_kv_heads * d, r.intermediate_size
        return {Op.QKV: (q + 2 * kv, hidden), Op.O: (hidden, q), Op.GATE_UP: (2 * inter, hidden),
                Op.DOWN: (hidden, inter), Op.LM_HEAD: (r.vocab_rows, hidden)}[op]

    @property
    def group(self) -> int:
        """Query heads per KV head on one rank (a KV head replicated on several ranks serves fewer on each)."""
        return self.rank.num_heads // self.rank.num_kv_heads

    def layout(self, op: Op) -> Layout | None:
        if self.spec is None or op is Op.LM_HEAD or not self.spec.is_quantized(MODULES[op]):
            return None
        return self.spec.layout


def build_plan(inputs: PlanInputs, table: dict, table_name: str) -> KernelPlan:
    """The plan for `inputs` given the GPU's tuned `table` (kernel -> key -> config; {} for none)."""
    check_runs(inputs)
    ops = [_projection(inputs, table, op) for op in PROJECTIONS]
    ops += [_attention(inputs, table), _fused_input(inputs, ops, Op.NORM, Op.QKV, Kernel.RMSNORM),
            _fused_input(inputs, ops, Op.POST_NORM, Op.GATE_UP, Kernel.RMSNORM),
            _fused_input(inputs, ops, Op.ACTIVATION, Op.DOWN, Kernel.SWIGLU), _sampler(inputs)]
    weights = inputs.spec.layout.value if inputs.spec is not None else inputs.dt
    return KernelPlan(inputs.gpu, inputs.dt, weights, table_name if table else "none", tuple(ops), _describe(inputs))


def check_runs(inputs: PlanInputs) -> None:
    """Refuse, in one line saying what runs instead, what the kernels cannot run on the GPU, and a layout the
    projections' widths cannot hold (4-bit groups that do not divide one). `hosttune-engine plan` and the engine at
    load (planner/prepare.py) build their plans here, so both refuse the same inputs."""
    for op in PROJECTIONS:
        if inputs.layout(op) is not None:
            checkpoint_tensors(inputs.spec, *inputs.shape(op), MODULES[op])  # raises where the load would
    if not inputs.on_kernels:
        return
    fp8 = inputs.spec.layout.value if inputs.spec is not None and inputs.spec.layout.is_fp8 else None
    why = inputs.gpu.why_kernels_cannot_run(inputs.dt, fp8, inputs.kv_cache_fp8)
    if why:
        raise ConfigError(why)


def _describe(inputs: PlanInputs) -> str:
    m, s = inputs.model, inputs.shard
    whole = (f"{m.architecture}: {m.num_layers} layers, hidden {m.hidden_size}, {m.num_heads}/{m.num_kv_heads} heads "
             f"of {m.head_dim}, intermediate {m.intermediate_size}, vocab {m.vocab_size}")
    if s is None or s.world_size == 1:
        return whole
    return (f"{whole}; tensor parallel over {s.world_size} ranks: one rank's shards below, {s.num_heads}/"
            f"{s.num_kv_heads} heads, intermediate {s.intermediate_size}, vocab rows {s.vocab_rows}")


# -- tuned-table lookups -----------------------------------------------------------------------------------------

def _tuned(table: dict, kernel: str, keys: str | tuple[str, ...], default: dict,
           shape: tuple[int, int] | None = None):
    """(config, reason, entry): under the first of `keys` the kernel has any entry for, the projection shape's
    entry as it stands, else the bucket's over `default`."""
    entries = table.get(kernel, {})
    for key in (keys,) if isinstance(keys, str) else keys:
        if shape is not None and f"{key}-{shape[0]}x{shape[1]}" in entries:
            name = f"{key}-{shape[0]}x{shape[1]}"
            return LaunchConfig.from_table(entries[name], name), Reason.TUNED_SHAPE, f"{kernel} {name}"
        if key in entries:
            base = LaunchConfig.from_table(default)
            return base.merged(LaunchConfig.from_table(entries[key], key)), Reason.TUNED_BUCKET, f"{kernel} {key}"
    return LaunchConfig.from_table(default), Reason.DEFAULT, ""


def _keys(inputs: PlanInputs, bucket: RowBucket) -> tuple[str, ...]:
    """The tuned tables' keys of `bucket` for the activations' dtype, first to last read."""
    return tuple(f"{inputs.dt}-{key}" for key in bucket.keys)


def _choice(op: Op, bucket: RowBucket, kernel: Kernel, found, fusion: Fusion = Fusion.NONE, note: str = ""):
    config, reason, entry = found
    return Choice(op, bucket, kernel, config, reason, fusion, entry, note)


# -- projections -------------------------------------------------------------------------------------------------

def _projection(inputs: PlanInputs, table: dict, op: Op) -> OpPlan:
    layout = inputs.layout(op)
    if not inputs.on_kernels:
        why = "torch backend" if inputs.gpu.is_cuda else "no GPU"
        choices = tuple(Choice(op, b, Kernel.TORCH, reason=Reason.FALLBACK, note=why) for b in ROW_BUCKETS)
        return OpPlan(op, choices, inputs.shape(op))
    pick = _bf16 if layout is None else (_fp8 if layout.is_fp8 else _int4)
    return OpPlan(op, tuple(pick(inputs, table, op, b) for b in ROW_BUCKETS), inputs.shape(op))


def _bf16(inputs: PlanInputs, table: dict, op: Op, bucket: RowBucket) -> Choice:
    if bucket.hi > 1:
        return Choice(op, bucket, Kernel.CUBLAS, note="fp32 logits" if op is Op.LM_HEAD else "")
    found = _tuned(table, "gemv", f"{inputs.dt}-m1", GEMV_DEFAULT)
    return _choice(op, bucket, Kernel.GEMV, found, PROLOGUE.get(op, Fusion.NONE))


def _gemv_fusion(op: Op, bucket: RowBucket, config: LaunchConfig) -> tuple[Fusion, str]:
    if bucket.hi > 1 or op not in PROLOGUE:
        return Fusion.NONE, ("the prologue takes one row: its input is computed first" if op in PROLOGUE else "")
    if config.fuse is False:
        return Fusion.NONE, "FUSE 0: the input is computed by its own kernels first"
    return PROLOGUE[op], ""


def _quant_gemv(inputs, table, op, bucket, kernel: str, default: dict, kind: Kernel) -> Choice:
    found = _tuned(table, kernel, _keys(inputs, bucket), default, inputs.shape(op))
    return _choice(op, bucket, kind, found, *_gemv_fusion(op, bucket, found[0]))


BIT_NOTE = "e4m3 decoded by integer operations before 8.9"


def _fp8(inputs: PlanInputs, table: dict, op: Op, bucket: RowBucket) -> Choice:
    choice = _fp8_kernel(inputs, table, op, bucket)
    if not inputs.gpu.decodes_e4m3_by_bits:
        return choice
    note = f"{choice.note}; {BIT_NOTE}" if choice.note else BIT_NOTE
    return replace(choice, config=replace(choice.config, bits=True, packed=None), note=note)  # PACKED: native e4m3


def _fp8_kernel(inputs: PlanInputs, table: dict, op: Op, bucket: RowBucket) -> Choice:
    if bucket.hi <= GEMV_ROWS:
        return _quant_gemv(inputs, table, op, bucket, "fp8_gemv", FP8_GEMV_DEFAULT, Kernel.FP8_GEMV)
    keys = _keys(inputs, bucket)
    why_not = _why_no_fp8_mm(inputs, op)
    if why_not:
        found = _tuned(table, "w8a16_gemm", keys, GEMM_DEFAULT, inputs.shape(op))
        return _choice(op, bucket, Kernel.W8A16_GEMM, found, note=why_not)
    method_cfg, reason, entry = _tuned(table, "fp8_mm", keys, {"METHOD": "unit"}, inputs.shape(op))
    method = method_cfg.method
    kernel = {Fp8Method.TRITON: "fp8_gemm", Fp8Method.W8A16: "w8a16_gemm"}.get(method)
    found = _tuned(table, kernel, keys, FP8_GEMM_DEFAULT if kernel == "fp8_gemm" else GEMM_DEFAULT,
                   inputs.shape(op)) if kernel else (method_cfg, reason, entry)
    note = f"path {method.value} from {entry or reason.value}" if kernel else ""
    return _choice(op, bucket, FP8_MM[method], found, _fp8_input(inputs, table, op, bucket, method), note)


def _why_no_fp8_mm(inputs: PlanInputs, op: Op) -> str:
    """Why an FP8 layer keeps bf16 activations above the GEMV's rows ('' where it may quantize them)."""
    n, k = inputs.shape(op)
    spec = inputs.spec
    if not spec.fp8_activations:
        return "the scheme keeps activations in bf16"
    if not _row_scaled(spec, k) or n % 16 or k % 16:
        return "scales not one per row, or a shape off 16"
    if inputs.dtype == torch.float32 or not inputs.gpu.has_fp8_tensor_cores:
        return "no FP8 tensor cores"
    return ""


def _row_scaled(spec: QuantSpec, k: int) -> bool:
    return spec.layout in (Layout.FP8_CHANNEL, Layout.FP8_TENSOR) or (spec.block is not None and spec.block[1] >= k)


def _fp8_input(inputs: PlanInputs, table: dict, op: Op, bucket: RowBucket, method: Fp8Method) -> Fusion:
    if method is Fp8Method.W8A16 or op not in FP8_INPUT:
        return Fusion.NONE
    if op is Op.DOWN and _gate_up_defers(inputs, table, bucket):
        return Fusion.SWIGLU_IN_GATE_UP
    return FP8_INPUT[op]


def _gate_up_defers(inputs: PlanInputs, table: dict, bucket: RowBucket) -> bool:
    """Whether gate_up, FP8 on the Triton GEMM with SWIGLU 1, leaves its output to down_proj's quantization."""
    if inputs.layout(Op.GATE_UP) is None or _why_no_fp8_mm(inputs, Op.GATE_UP):
        return False
    keys, shape = _keys(inputs, bucket), inputs.shape(Op.GATE_UP)
    if _tuned(table, "fp8_mm", keys, {"METHOD": "unit"}, shape)[0].method is not Fp8Method.TRITON:
        return False
    cfg = _tuned(table, "fp8_gemm", keys, FP8_GEMM_DEFAULT, shape)[0]
    return bool(cfg.swiglu) and (cfg.block_n or 0) >= 32


# Untuned, a 4-bit layer of more rows than this dequantizes its weight for cuBLAS: every tune so far chose that
# there (H200, H100), and the tiled GEMM's generic config ran 256 x (1024 in / 128 out) at 0.3 of its speed.
INT4_TILED_ROWS = 64


def _int4(inputs: PlanInputs, table: dict, op: Op, bucket: RowBucket) -> Choice:
    if bucket.hi <= GEMV_ROWS:
        return _quant_gemv(inputs, table, op, bucket, "int4_gemv", INT4_GEMV_DEFAULT, Kernel.INT4_GEMV)
    found = _tuned(table, "w4a16_gemm", _keys(inputs, bucket), GEMM_DEFAULT, inputs.shape(op))
    if found[1] is Reason.DEFAULT and bucket.lo > INT4_TILED_ROWS:
        return _choice(op, bucket, Kernel.W4A16_DEQUANT, (LaunchConfig(dequant=True), *found[1:]),
                       note=f"past {INT4_TILED_ROWS} rows cuBLAS on the dequantized weight beats the tiled GEMM")
    if found[0].wgmma:
        why_not = wgmma_unfit(inputs.gpu.capability, inputs.dtype, inputs.spec.group_size)
        if not why_not:
            return _choice(op, bucket, Kernel.W4A16_WGMMA, found)
        return _choice(op, bucket, Kernel.W4A16_DEQUANT, (LaunchConfig(dequant=True), *found[1:]),
                       note=f"the table's warpgroup GEMM cannot run here: {why_not}")
    return _choice(op, bucket, Kernel.W4A16_DEQUANT if found[0].dequant else Kernel.W4A16_GEMM, found)


# -- attention, norm, activation, sampler ------------------------------------------------------------------------

def _attention(inputs: PlanInputs, table: dict) -> OpPlan:
    m, op = inputs.model, Op.ATTENTION
    if not inputs.on_kernels:
        buckets = DECODE_BUCKETS + PREFILL_BUCKETS
        return OpPlan(op, tuple(Choice(op, b, Kernel.TORCH, reason=Reason.FALLBACK) for b in buckets))
    device, group = torch.device("cuda"), inputs.group
    decode_default = decode_attention.default_config(inputs.dtype, device, inputs.kv_cache_fp8)
    prefill_default = prefill_attention.default_config(inputs.dtype, device)
    choices = []
    for b in DECODE_BUCKETS:
        key = decode_attention.config_key(inputs.dtype, m.head_dim, group, inputs.block_size, b.hi, inputs.kv_cache_fp8)
        choices.append(_choice(op, b, Kernel.DECODE_ATTENTION, _tuned(table, "decode_attention", key, decode_default),
                               note="K split per step by the context length"))
    for b in PREFILL_BUCKETS:
        key = prefill_attention.config_key(inputs.dtype, m.head_dim, group, inputs.block_size, True, b.lo)
        choices.append(_choice(op, b, Kernel.PREFILL_ATTENTION, _tuned(table, "prefill_attention", key, prefill_default),
                               note="a whole prompt (contiguous); chunks over the cache read it paged"))
    return OpPlan(op, tuple(choices))


def _fused_input(inputs: PlanInputs, projections: list[OpPlan], op: Op, consumer: Op, own: Kernel) -> OpPlan:
    """A norm or activation: computed by the projection it feeds where that one fuses it, else its own kernel."""
    feeds = next(p for p in projections if p.op is consumer)
    choices = []
    for c in feeds.choices:
        if not inputs.on_kernels:
            choices.append(Choice(op, c.bucket, Kernel.TORCH, reason=Reason.FALLBACK))
        elif c.fusion is not Fusion.NONE:
            choices.append(Choice(op, c.bucket, Kernel.IN_CONSUMER, note=f"{consumer.value}: {c.fusion.value}"))
        else:
            choices.append(Choice(op, c.bucket, own))
    return OpPlan(op, tuple(choices))


def _sampler(inputs: PlanInputs) -> OpPlan:
    op = Op.SAMPLER
    if not inputs.on_kernels:
        return OpPlan(op, tuple(Choice(op, b, Kernel.TORCH, reason=Reason.FALLBACK) for b in ROW_BUCKETS[:-1]))
    choices = []
    for b in ROW_BUCKETS[:-1]:  # one row per sequence: a step samples at most its batch
        block, warps = race_config(b.hi)
        choices.append(Choice(op, b, Kernel.RACE_SAMPLER, LaunchConfig(block_n=block, num_warps=warps),
                              note="random rows; greedy rows take the argmax"))
    return OpPlan(op, tuple(choices))
