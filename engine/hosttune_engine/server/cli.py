"""`hosttune-engine serve`: options in, a `ServerConfig` out, the server run, its exit code returned; and
`hosttune-engine plan` / `tune`, the kernel plan printed and the kernels tuned on this GPU.

Exit codes: 0 after a drain (SIGTERM/SIGINT), 1 when the engine fails to load,
fails warmup or dies, 2 for bad options (a --model folder whose config.json is missing or
unreadable, or a --tokenizer folder without a tokenizer, included).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import math
import os
import sys

from hosttune_engine import __version__
from hosttune_engine.config import (DEVICES, DTYPES, KERNEL_BACKENDS, KV_CACHE_DTYPES, LOAD_FORMATS, QUANTIZATIONS,
                                    EngineConfig)
from hosttune_engine.errors import ConfigError, EngineError
from hosttune_engine.model.model_config import ModelConfig
from hosttune_engine.model.tokenizer import Tokenizer
from hosttune_engine.parallel.layout import check_divides_heads
from hosttune_engine.server.auth import KEY_ENV, load_keys
from hosttune_engine.server.config import ServerConfig


# The engine thread's host work (collect, schedule, launch) and the event loop thread's streaming share the
# interpreter lock. A thread that wants it waits for the holder to drop it, at worst a whole switch
# interval (5 ms by default): on an H200 with 64 streaming users, mixed steps took 5-7 ms longer in the
# server than alone (measured while their host work still ran between steps, before they were launched
# ahead of the step before). A shorter interval bounds that wait.
SWITCH_INTERVAL_S = 0.0005


def _parser(with_tools: bool = True) -> argparse.ArgumentParser:
    """The command line; without `with_tools`, `serve` alone: the plan and tune commands import torch, which
    `serve` loads only after its socket is open."""
    parser = argparse.ArgumentParser(prog="hosttune-engine", description="hosttune's bundled LLM engine.")
    parser.add_argument("--version", action="version", version=__version__)
    commands = parser.add_subparsers(dest="command", required=True)
    s = commands.add_parser("serve", help="serve a model over an OpenAI-compatible HTTP API",
                            description="Serve a model over an OpenAI-compatible HTTP API. Example: hosttune-engine "
                                        "serve --model /models/qwen2.5-7b --host 0.0.0.0 --port 8000")
    s.add_argument("--model", required=True, help="Hugging Face model folder (config.json, safetensors, tokenizer)")
    s.add_argument("--served-model-name", help="the name clients use in 'model' (default: the --model path)")
    s.add_argument("--tokenizer", help="tokenizer folder, if not the model folder")
    s.add_argument("--host", default="127.0.0.1", help="address to listen on (0.0.0.0 for every interface)")
    s.add_argument("--port", type=int, default=8000)
    s.add_argument("--max-batch-size", type=_positive, default=256, help="most sequences running at once")
    s.add_argument("--max-queue", type=int, default=64, help="sequences that may wait beyond the batch; past "
                                                              "that, requests get HTTP 429")
    s.add_argument("--max-model-len", type=int, help="context length, at most the model's max_position_embeddings "
                                                      "(default: that)")
    s.add_argument("--max-num-batched-tokens", type=int,
                   help="token budget of one step, at least --max-batch-size (default: 8192, or --max-batch-size if "
                        "larger)")
    s.add_argument("--max-step-ms", type=_step_ms, default="auto",
                   help="time budget of a step with running decodes, from step costs measured at start: "
                        "milliseconds, auto (2.4 times a full decode-only step measured at start) or off (token budget only)")
    s.add_argument("--step-log", metavar="PATH",
                   help="append a JSON line per step to PATH (its real time, tokens, the budget's estimate): "
                        "for tuning --max-step-ms on real traffic")
    s.add_argument("--gpu-memory-utilization", type=float, default=0.90,
                   help="share of the GPU's whole memory for this engine's weights, KV cache and activations "
                        "(replicas sharing a GPU: their shares add up to at most 0.9)")
    s.add_argument("--num-kv-blocks", type=int,
                   help="KV-cache size in blocks (default: what --gpu-memory-utilization leaves on a GPU, "
                        "--cpu-kv-cache-gib on CPU)")
    s.add_argument("--cpu-kv-cache-gib", type=float, default=0.25,
                   help="KV-cache size on CPU, in GiB; it must hold one sequence of --max-model-len tokens")
    s.add_argument("--block-size", type=int, default=16)
    s.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=True)
    s.add_argument("--device", choices=DEVICES, default="auto")
    s.add_argument("--dtype", choices=DTYPES, default="auto")
    s.add_argument("--load-format", choices=LOAD_FORMATS, default="auto",
                   help="'dummy' builds random weights from config.json alone (benchmarks)")
    s.add_argument("--quantization", choices=QUANTIZATIONS,
                   help="'fp8' quantizes a bf16 checkpoint to FP8 at load; the others name a layout for dummy "
                        "weights (a quantized checkpoint needs none: config.json says its layout)")
    s.add_argument("--kv-cache-dtype", choices=KV_CACHE_DTYPES, default="auto",
                   help="'fp8' keeps keys and values in e4m3 with a scale per row: about twice the tokens in the "
                        "same memory; 'auto' keeps the model's dtype")
    s.add_argument("--kernel-backend", choices=KERNEL_BACKENDS, default="auto",
                   help="'auto': the Triton kernels on CUDA, their torch references on the CPU; 'triton' on the CPU "
                        "needs TRITON_INTERPRET=1 (slow)")
    s.add_argument("--enforce-eager", action="store_true",
                   help="no CUDA graphs: decode, prompt-chunk and mixed steps all run eagerly")
    s.add_argument("--tensor-parallel-size", type=int, default=1,
                   help="GPUs that share the model, one process each (the first of CUDA_VISIBLE_DEVICES is rank 0)")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--shutdown-timeout", type=float, default=30.0,
                   help="seconds in-flight requests get to finish after SIGTERM")
    s.add_argument("--retry-after", type=int, default=1, help="Retry-After seconds sent with 429 and 503")
    s.add_argument("--max-body-bytes", type=int, default=8 * 2**20)
    s.add_argument("--skip-warmup", action="store_true", help="report healthy without a warmup generation")
    s.add_argument("--log-prompts", action="store_true", help="put prompt text in the per-request log lines")
    _auth_and_connection_args(s)
    s.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"))
    if with_tools:
        from hosttune_engine.planner import command as plan_command
        from hosttune_engine.tuner import command as tune_command

        plan_command.add_parser(commands)
        tune_command.add_parser(commands)
    return parser


def _auth_and_connection_args(s: argparse.ArgumentParser) -> None:
    s.add_argument("--api-key", action="append", default=[], metavar="KEY",
                   help="a key clients must send as 'Authorization: Bearer KEY' (repeatable; 8 characters or more). "
                        "Visible in ps: prefer "
                        f"--api-key-file or ${KEY_ENV} (keys separated by commas)")
    s.add_argument("--api-key-file", action="append", default=[], metavar="PATH",
                   help="a file of API keys, one a line (repeatable)")
    s.add_argument("--protect-probes", action="store_true", help="require the key for /health and /metrics too")
    s.add_argument("--header-timeout", type=float, default=10.0,
                   help="seconds a connection gets to send a request's headers")
    s.add_argument("--idle-timeout", type=float, default=75.0,
                   help="seconds a connection may stay open between requests")
    s.add_argument("--max-connections", type=int, default=4096,
                   help="open connections at most; past that a new one gets 503 and is closed")


def _positive(text: str) -> int:
    # the engine calls it max_num_seqs; refused here, the error names the option the user gave
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: give a whole number > 0")
    return int(text)


def _step_ms(text: str) -> float | None:
    if text in ("auto", "off"):
        return 0.0 if text == "auto" else None
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 < value < math.inf:  # NaN compares False
        raise argparse.ArgumentTypeError(f"{text!r}: give milliseconds (> 0), auto or off")
    return value


def _token_budget(args: argparse.Namespace) -> int:
    # Only the default grows with the batch: a budget given smaller than the batch is refused by EngineConfig.
    given = args.max_num_batched_tokens
    return max(8192, args.max_batch_size) if given is None else given


def config_from_args(args: argparse.Namespace) -> ServerConfig:
    engine = EngineConfig(
        model=args.model, tokenizer=args.tokenizer, load_format=args.load_format, dtype=args.dtype,
        device=args.device, kernel_backend=args.kernel_backend, seed=args.seed, block_size=args.block_size,
        gpu_memory_utilization=args.gpu_memory_utilization, cpu_kv_cache_gib=args.cpu_kv_cache_gib,
        num_kv_blocks=args.num_kv_blocks, max_num_seqs=args.max_batch_size,
        max_num_batched_tokens=_token_budget(args),
        max_model_len=args.max_model_len, enable_prefix_caching=args.enable_prefix_caching,
        enforce_eager=args.enforce_eager, max_step_ms=args.max_step_ms,
        tensor_parallel_size=args.tensor_parallel_size, quantization=args.quantization, step_log=args.step_log,
        kv_cache_dtype=args.kv_cache_dtype, scheduling_policy="priority")  # equal priorities are first come, first served
    return ServerConfig(engine=engine, host=args.host, port=args.port, served_model_name=args.served_model_name,
                        max_queue=args.max_queue, shutdown_timeout_s=args.shutdown_timeout,
                        retry_after_s=args.retry_after, max_body_bytes=args.max_body_bytes,
                        log_prompts=args.log_prompts, warmup=not args.skip_warmup,
                        api_keys=load_keys(args.api_key, args.api_key_file), protect_probes=args.protect_probes,
                        header_timeout_s=args.header_timeout, idle_timeout_s=args.idle_timeout,
                        max_connections=args.max_connections)


def check_model_folder(engine: EngineConfig) -> None:
    """What config.json and the tokenizer folder alone say is wrong (the context, the heads tensor parallelism
    splits), refused before the socket opens as `plan` refuses the same folder; the weights are read only by the
    load that follows."""
    model = ModelConfig.from_folder(engine.model)
    model.context_length(engine.max_model_len)
    check_divides_heads(model, engine.tensor_parallel_size)
    if engine.tokenizer is not None:
        Tokenizer(engine.tokenizer)


def _run(coro) -> int:
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    if sys.version_info >= (3, 11):
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            return runner.run(coro)
    return asyncio.run(coro)


def _report(make) -> None:
    """Print what `make()` returns; an engine error is one line and exit code 2."""
    try:
        print(make())
    except EngineError as e:
        print(f"hosttune-engine: error: {e}", file=sys.stderr)
        sys.exit(2)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    args = _parser(with_tools=argv[:1] != ["serve"]).parse_args(argv)
    if args.command == "plan":
        from hosttune_engine.plan.render import format_plan
        from hosttune_engine.planner.command import plan_from_args

        return _report(lambda: format_plan(plan_from_args(args)))
    if args.command == "tune":
        from hosttune_engine.tuner.command import tune_from_args

        logging.basicConfig(level="WARNING")
        return _report(lambda: tune_from_args(args))
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        if not os.path.isdir(args.model):
            raise ConfigError(f"--model {args.model}: no such folder (give a Hugging Face model folder)")
        if args.step_log and not os.path.isdir(os.path.dirname(os.path.abspath(args.step_log))):
            raise ConfigError(f"--step-log {args.step_log}: its folder does not exist")
        if args.step_log and os.path.isdir(args.step_log):
            raise ConfigError(f"--step-log {args.step_log} is a folder; give a file path in it")
        config = config_from_args(args)
        check_model_folder(config.engine)
    except EngineError as e:
        print(f"hosttune-engine: error: {e}", file=sys.stderr)
        sys.exit(2)
    from hosttune_engine.server.serve import Server

    sys.setswitchinterval(SWITCH_INTERVAL_S)
    code = _run(Server(config).run())
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # a model load still running on its thread must not hold the exit
