"""`hosttune-engine plan`: the kernel plan of a model folder's config on this GPU or on one named."""

from __future__ import annotations

import argparse

import torch

from hosttune_engine.config import (DTYPES, KERNEL_BACKENDS, KV_CACHE_DTYPES, QUANTIZATIONS, activation_dtype,
                                    check_block_size, runs_triton)
from hosttune_engine.model.model_config import ModelConfig
from hosttune_engine.parallel.checks import planned_shard
from hosttune_engine.planner.build import PlanInputs, build_plan
from hosttune_engine.plan.gpus import CPU, named_gpu, present_gpu
from hosttune_engine.plan.plan import KernelPlan
from hosttune_engine.planner.prepare import table_and_name
from hosttune_engine.planner.tables import table_name
from hosttune_engine.quant.spec import resolve_spec


def add_parser(commands) -> None:
    p = commands.add_parser("plan", help="print which kernel runs each operation of a model, and why",
                            description="Print the kernel plan of a model: for each projection, attention, norm, "
                                        "activation and the sampler, per row bucket, the kernel, its launch config "
                                        "and why (tuned entry, generic default, rule, fallback). Reads config.json "
                                        "only. Example: hosttune-engine plan --model /models/qwen2.5-7b "
                                        "--gpu 'NVIDIA A100-SXM4-80GB'")
    p.add_argument("--model", required=True, help="Hugging Face model folder (config.json is enough)")
    p.add_argument("--gpu", help="a GPU's CUDA name, e.g. 'NVIDIA A100-SXM4-80GB' (default: this machine's); a family "
                                 "such as 'H200' names the one tuned table's GPU that holds it")
    p.add_argument("--quantization", help="as serve's --quantization, one of " + ", ".join(QUANTIZATIONS) + ": 'fp8' "
                                          "quantizes a bf16 checkpoint at load; the others name a layout (a quantized "
                                          "checkpoint needs none: config.json says its layout)")
    p.add_argument("--kv-cache-dtype", choices=KV_CACHE_DTYPES, default="auto",
                   help="as serve's: 'fp8' plans the attention kernels that read an e4m3 KV cache")
    p.add_argument("--dtype", choices=DTYPES, default="auto",
                   help="as serve's: the activations' dtype ('auto': float32 on the CPU; on a GPU float16 for a "
                        "float16 checkpoint, else bfloat16)")
    p.add_argument("--kernel-backend", choices=KERNEL_BACKENDS, default="auto",
                   help="as serve's: 'torch' plans the torch references on a GPU too")
    p.add_argument("--block-size", type=int, default=16,
                   help="as serve's: tokens per KV-cache block (decode attention's tuned entries are per size)")
    add_tensor_parallel_argument(p, "plan the shards one rank runs: its projections' N x K and its heads, whose "
                                    "tuned entries it reads")


def add_tensor_parallel_argument(p, what: str) -> None:
    """serve's --tensor-parallel-size, for `plan` and `tune` (`what`: what the command does with it)."""
    p.add_argument("--tensor-parallel-size", type=int, default=1, help=f"as serve's: GPUs that share the model; {what}")


def plan_from_args(args: argparse.Namespace) -> KernelPlan:
    """The plan `hosttune-engine plan` prints: of the activations serve would compute in on that GPU."""
    check_block_size(args.block_size)
    cfg = ModelConfig.from_folder(args.model)
    load_format = "dummy" if args.quantization is not None else "auto"  # plan and tune name any layout
    spec = resolve_spec(cfg.quantization, args.quantization, load_format, args.model)
    gpu = named_gpu(table_name(args.gpu)) if args.gpu is not None else _this_gpu()  # --gpu '' is unknown
    dtype = getattr(torch, activation_dtype(args.dtype, cfg.dtype, gpu.is_cuda))
    shard = planned_shard(cfg, args.tensor_parallel_size, dtype, spec)
    inputs = PlanInputs(cfg, gpu, dtype, spec, use_triton=runs_triton(args.kernel_backend, gpu.is_cuda),
                        kv_cache_fp8=args.kv_cache_dtype == "fp8", block_size=args.block_size, shard=shard)
    return build_plan(inputs, *table_and_name(gpu))


def _this_gpu():
    return present_gpu(torch.device("cuda")) if torch.cuda.is_available() else CPU
