"""Prepare a built model from its kernel plan, once: each projection gets its operation's choices, which it
reads per call by the step's row count, and each decoder layer is replaced by its prepared form, whose fused
modules (a norm feeding qkv_proj; the MLP behind its norm) run the plan's fused kernels where it has them.
Preparation comes after tensor parallelism and quantization, which are transforms of the plain model.

A model never prepared runs its torch references; `set_kernel_backend(model, False)` switches a prepared one
back to them (same weights), and True to its plan again.
"""

from __future__ import annotations

import logging

from torch import nn

from hosttune_engine.kernels import tuning
from hosttune_engine.layers.backend import set_kernel_backend
from hosttune_engine.planner.build import PlanInputs, build_plan
from hosttune_engine.planner.tables import check_tables
from hosttune_engine.plan.gpus import GpuInfo
from hosttune_engine.plan.kinds import Op
from hosttune_engine.plan.plan import KernelPlan
from hosttune_engine.plan.render import summary
from hosttune_engine.quant.quant_linear import QuantLinear

log = logging.getLogger(__name__)

def table_and_name(gpu: GpuInfo) -> tuple[dict, str]:
    """The GPU's merged tuned table and where it came from, in words (its files checked first)."""
    check_tables(gpu.name)
    return tuning.table_for(gpu.name, gpu.present), ", ".join(tuning.table_sources(gpu.name, gpu.present)) or "none"


def plan_for_model(model: nn.Module, gpu: GpuInfo, use_triton: bool = True, kv_cache_fp8: bool = False,
                   block_size: int = 16, table: dict | None = None) -> KernelPlan:
    """The plan of a built (possibly quantized, possibly a rank's sharded) model on `gpu`, from its tuned table or
    the one given: a rank's reads the entries of its own shards' shapes."""
    spec = next((m.spec for m in model.modules() if isinstance(m, QuantLinear)), None)
    dtype = model.lm_head.weight.dtype
    shard = getattr(model, "shard_layout", None)  # a tensor-parallel rank's (parallel/transform.py)
    inputs = PlanInputs(model.config, gpu, dtype, spec, use_triton, kv_cache_fp8, block_size, shard)
    return build_plan(inputs, *((table, "given") if table is not None else table_and_name(gpu)))


def apply_plan(model: nn.Module, plan: KernelPlan) -> None:
    """Hand each projection its choices and put in the decoder layers as the plan runs them."""
    layers = model.model.layers
    for i, layer in enumerate(layers):
        attn, mlp = layer.self_attn, layer.mlp
        for proj, op in ((attn.qkv_proj, Op.QKV), (attn.o_proj, Op.O), (mlp.gate_up_proj, Op.GATE_UP),
                         (mlp.down_proj, Op.DOWN)):
            proj.kernel_plan = plan.op(op)
        layers[i] = layer.prepared()
    model.lm_head.kernel_plan = plan.op(Op.LM_HEAD)
    model.kernel_plan = plan


def prepare(model: nn.Module, gpu: GpuInfo, use_triton: bool, kv_cache_fp8: bool = False,
            block_size: int = 16) -> KernelPlan:
    """Build the model's plan, apply it, and log its summary (and, with no tuned table, how to make one)."""
    plan = plan_for_model(model, gpu, use_triton, kv_cache_fp8, block_size)
    apply_plan(model, plan)
    set_kernel_backend(model, use_triton)
    log.info("%s", summary(plan))
    if gpu.is_cuda and use_triton and plan.table == "none":
        log.warning("%s", untuned_line(gpu))
    return plan


def untuned_line(gpu: GpuInfo) -> str:
    key = tuning.present_key(gpu.name)
    return (f"no tuned kernel table for {gpu.name} (driver {key.driver}, Triton {key.triton}): every kernel runs "
            f"its generic default launch config; tune them once with: hosttune-engine tune --model MODEL "
            f"(writes {tuning.cache_path(key)})")
