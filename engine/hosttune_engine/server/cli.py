"""`hosttune-engine serve`: options in, a `ServerConfig` out, the server run, its exit code returned; and
`hosttune-engine plan` / `tune`, the kernel plan printed and the kernels tuned on this GPU.

Exit codes: 0 after a drain (SIGTERM/SIGINT), 1 when the engine fails to load,
fails warmup or dies (or a `plan` or `tune` reader closed the pipe), 2 for bad options (a --model
folder whose config.json is missing or unreadable, or a --tokenizer folder without a tokenizer, included).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys

from hosttune_engine import __version__
from hosttune_engine.cache.kv_shape import DTYPE_BYTES, KVCacheShape, blocks_in_gib, check_holds_context
from hosttune_engine.config import (CudaFacts, EngineConfig, activation_dtype, check_cuda_driver, runs_triton,
                                    surely_cpu)
from hosttune_engine.errors import ConfigError, EngineError
from hosttune_engine.model.model_config import ModelConfig
from hosttune_engine.model.tokenizer import Tokenizer
from hosttune_engine.parallel.layout import ShardLayout, check_divides_heads
from hosttune_engine.quant.spec import resolve_spec
from hosttune_engine.server.auth import load_keys
from hosttune_engine.server.config import ServerConfig
from hosttune_engine.server.options import add_serve_arguments


# The engine thread's host work (collect, schedule, launch) and the event loop thread's streaming share the
# interpreter lock. A thread that wants it waits for the holder to drop it, at worst a whole switch
# interval (5 ms by default): on an H200 with 64 streaming users, mixed steps took 5-7 ms longer in the
# server than alone (measured while their host work still ran between steps, before they were launched
# ahead of the step before). A shorter interval bounds that wait.
SWITCH_INTERVAL_S = 0.0005


class DefaultsHelpFormatter(argparse.HelpFormatter):
    """argparse's help, each option's text ending with its default where it has one the text does not state."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        default, text = action.default, action.help or ""
        if (default is None or default is False or default == [] or default is argparse.SUPPRESS
                or "default" in text or not action.option_strings):
            return action.help
        return f"{text} (default: %(default)s)".lstrip()


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a bad command line is one line naming the command and the option, exit 2, as the engine's
    other errors are, not a usage block and an error below it. Its commands' parsers are of this class too."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("formatter_class", DefaultsHelpFormatter)
        super().__init__(*args, **kwargs)
        self.commands: dict[str, argparse.ArgumentParser] = {}  # the program's: its commands' parsers by name

    def error(self, message: str):
        what = message.removeprefix("argument ")  # "argument --port: invalid int value" names the option
        self.exit(2, f"{self.prog}: error: {' '.join(what.split())} (see {self.prog} --help)\n")

    def parse_command_line(self, argv: list[str]) -> argparse.Namespace:
        """parse_args, with arguments the command does not take refused by that command, not by the program."""
        args, extra = self.parse_known_args(argv)
        if extra:
            self.commands[args.command].error(f"unrecognized arguments: {' '.join(extra)}")
        return args


def _parser(with_tools: bool = True) -> OneLineParser:
    """The command line; without `with_tools`, `serve` alone: the plan and tune commands import torch, which
    `serve` loads only after its socket is open."""
    parser = OneLineParser(prog="hosttune-engine", description="hosttune's bundled LLM engine.")
    parser.add_argument("--version", action="version", version=__version__)
    commands = parser.add_subparsers(dest="command", required=True)
    parser.commands = commands.choices
    s = commands.add_parser("serve", help="serve a model over an OpenAI-compatible HTTP API",
                            description="Serve a model over an OpenAI-compatible HTTP API. Example: hosttune-engine "
                                        "serve --model /models/qwen2.5-7b --host 0.0.0.0 --port 8000")
    add_serve_arguments(s)
    if with_tools:
        from hosttune_engine.planner import command as plan_command
        from hosttune_engine.tuner import command as tune_command

        plan_command.add_parser(commands)
        tune_command.add_parser(commands)
    return parser


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
    return ServerConfig(engine=engine, host=args.host, port=args.port, served_model_names=tuple(args.served_model_name or ()),
                        max_queue=args.max_queue, shutdown_timeout_s=args.shutdown_timeout,
                        retry_after_s=args.retry_after, max_body_bytes=args.max_body_bytes,
                        log_prompts=args.log_prompts, warmup=not args.skip_warmup,
                        api_keys=load_keys(args.api_key, args.api_key_file), protect_probes=args.protect_probes,
                        header_timeout_s=args.header_timeout, idle_timeout_s=args.idle_timeout,
                        max_connections=args.max_connections, allowed_origins=tuple(args.allowed_origins),
                        generation_config=args.generation_config)


def check_model_folder(engine: EngineConfig) -> None:
    """What config.json, the options, the CUDA driver and the tokenizer folder alone say is wrong (a --quantization
    of weights quantized already, GPUs whose driver is too old for torch, Triton on the CPU, the context, the heads
    tensor parallelism splits, a CPU KV cache too small for one context), refused before the socket opens as `plan`
    refuses the same folder; the weights are read only by the load that follows."""
    model = ModelConfig.from_folder(engine.model)
    resolve_spec(model.quantization, engine.quantization, engine.load_format, engine.model)
    cuda = CudaFacts.read(engine.device)  # the driver probed once, for both questions
    check_cuda_driver(engine.device, cuda)
    on_cpu = surely_cpu(engine.device, cuda)  # else, with "auto", whether there is a GPU is torch's to say, later
    if on_cpu:
        runs_triton(engine.kernel_backend, on_cuda=False)
    context = model.context_length(engine.max_model_len)
    check_divides_heads(model, engine.tensor_parallel_size)
    if on_cpu and engine.num_kv_blocks is None:
        blocks = blocks_in_gib(engine.cpu_kv_cache_gib, _cpu_kv_shape(model, engine))
        check_holds_context(blocks, engine.block_size, context, "cpu_kv_cache_gib")
    if engine.tokenizer is not None:
        Tokenizer(engine.tokenizer)


def _cpu_kv_shape(model: ModelConfig, engine: EngineConfig) -> KVCacheShape:
    """The shape of one rank's KV blocks on the CPU, as the model runner sizes its pool."""
    fp8 = engine.kv_cache_dtype == "fp8"
    dtype_bytes = 1 if fp8 else DTYPE_BYTES[activation_dtype(engine.dtype, model.dtype, on_cuda=False)]
    num_kv_heads = ShardLayout.of(model, 0, engine.tensor_parallel_size).num_kv_heads
    return KVCacheShape(model.num_layers, engine.block_size, num_kv_heads, model.head_dim, dtype_bytes, fp8)


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
    """Print what `make()` returns; an engine error is one line and exit code 2, a reader gone before the text
    (`plan ... | head -3`) exit code 1 and no word."""
    try:
        text = make()
    except EngineError as e:
        print(f"hosttune-engine: error: {e}", file=sys.stderr)
        sys.exit(2)
    try:
        print(text, flush=True)
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # the flush at exit must not fail again
        sys.exit(1)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    args = _parser(with_tools=argv[:1] != ["serve"]).parse_command_line(argv)
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
        if args.step_log == "":  # not the log turned off: a variable that was meant to hold a path and is unset
            raise ConfigError("--step-log is empty; give a file path, or leave the option out for no step log")
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
