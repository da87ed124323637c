"""Prepare a built model from its kernel plan, once: each projection, norm and activation gets the choices
of the operation it is (or feeds), and the layers read them per call by the step's row count.

A model never prepared runs its torch references; `set_kernel_backend(model, False)` switches a prepared one
back to them (same weights), and True to its plan again.
"""

from __future__ import annotations

import logging

from torch import nn

from hosttune_engine.kernels import tuning
from hosttune_engine.layers.backend import set_kernel_backend
from hosttune_engine.planner.build import PlanInputs, build_plan
from hosttune_engine.plan.gpus import GpuInfo
from hosttune_engine.plan.kinds import Op
from hosttune_engine.plan.plan import KernelPlan
from hosttune_engine.plan.render import summary
from hosttune_engine.quant.quant_linear import QuantLinear

log = logging.getLogger(__name__)

PROJECTION_NAMES = {"qkv_proj": Op.QKV, "o_proj": Op.O, "gate_up_proj": Op.GATE_UP, "down_proj": Op.DOWN}
# A norm or activation (by its name in a decoder layer) -> the projection whose input it is.
FEEDS = {"input_layernorm": Op.QKV, "post_attention_layernorm": Op.GATE_UP, "act": Op.DOWN}


def table_and_name(gpu: GpuInfo) -> tuple[dict, str]:
    """The GPU's merged tuned table and where it came from, in words."""
    return tuning.table_for(gpu.name, gpu.present), ", ".join(tuning.table_sources(gpu.name, gpu.present)) or "none"


def plan_for_model(model: nn.Module, gpu: GpuInfo, use_triton: bool = True, kv_cache_fp8: bool = False,
                   block_size: int = 16, table: dict | None = None) -> KernelPlan:
    """The plan of a built (possibly quantized) model on `gpu`, from its tuned table or the one given."""
    spec = next((m.spec for m in model.modules() if isinstance(m, QuantLinear)), None)
    dtype = model.lm_head.weight.dtype
    inputs = PlanInputs(model.config, gpu, dtype, spec, use_triton, kv_cache_fp8, block_size)
    return build_plan(inputs, *((table, "given") if table is not None else table_and_name(gpu)))


def apply_plan(model: nn.Module, plan: KernelPlan) -> None:
    """Hand each layer its choices and switch the kernel-backed layers on (where the plan runs kernels)."""
    for name, module in model.named_modules():
        last = name.rsplit(".", 1)[-1]
        if last in PROJECTION_NAMES:
            module.kernel_plan = plan.op(PROJECTION_NAMES[last])
            if last == "gate_up_proj":
                module.swiglu_plan = plan.op(Op.DOWN)  # down_proj's input may be computed from its output
        elif last in FEEDS and hasattr(module, "feeds"):
            module.feeds = plan.op(FEEDS[last])
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
