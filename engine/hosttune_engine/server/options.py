"""The `serve` command's options, and a check of flags against them.

Only the standard library and the torch-free `hosttune_engine.config` are imported here, so a deploy
can check the flags it would pass before any host is contacted, with the interpreter at hand:

    python -m hosttune_engine.server.options '[["--dtype", "float16"], ["--bogus"]]'

prints, as JSON, one entry per argv: null when `serve` takes it, else argparse's reason (and the
accepted choices, for a value outside them).
"""

from __future__ import annotations

import argparse
import json
import math
import sys

from hosttune_engine.config import DEVICES, DTYPES, KERNEL_BACKENDS, KV_CACHE_DTYPES, LOAD_FORMATS, QUANTIZATIONS

KEY_ENV = "HOSTTUNE_ENGINE_API_KEY"  # one key, or several separated by commas


def add_serve_arguments(s: argparse.ArgumentParser) -> None:
    """Every option of `hosttune-engine serve`."""
    s.add_argument("--model", required=True, help="Hugging Face model folder (config.json, safetensors, tokenizer)")
    s.add_argument("--served-model-name", nargs="+", metavar="NAME",
                   help="the names clients use in 'model', any of them answered and the first named in answers, as "
                        "in vLLM (default: the --model path)")
    s.add_argument("--tokenizer", help="tokenizer folder, if not the model folder")
    s.add_argument("--host", default="127.0.0.1", help="address to listen on (0.0.0.0 for every interface)")
    s.add_argument("--port", type=int, default=8000, help="port to listen on")
    _batch_args(s)
    _memory_args(s)
    _numerics_args(s)
    s.add_argument("--tensor-parallel-size", type=int, default=1,
                   help="GPUs that share the model, one process each (the first of CUDA_VISIBLE_DEVICES is rank 0)")
    s.add_argument("--seed", type=int, default=0, help="seed of the random weights of --load-format dummy and of "
                                                          "sampling in requests that give no seed")
    s.add_argument("--shutdown-timeout", type=float, default=30.0,
                   help="seconds in-flight requests get to finish after SIGTERM")
    s.add_argument("--retry-after", type=int, default=1, help="Retry-After seconds sent with 429 and 503")
    s.add_argument("--max-body-bytes", type=int, default=8 * 2**20,
                   help="largest request body; a larger one gets HTTP 413")
    s.add_argument("--skip-warmup", action=argparse.BooleanOptionalAction, default=False,
                   help="report healthy without a warmup generation")
    s.add_argument("--generation-config", default="auto", metavar="auto|vllm|FOLDER",
                   help="where the sampling defaults of requests that leave temperature, top_p, top_k, "
                        "repetition_penalty or min_p out come from, as in vLLM: 'auto' the model folder's "
                        "generation_config.json, 'vllm' none (the API's defaults), or a folder holding one")
    s.add_argument("--log-prompts", action=argparse.BooleanOptionalAction, default=False,
                   help="put prompt text in the per-request log lines")
    _auth_and_connection_args(s)
    s.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"),
                   help="the least severe log lines written to stderr")


def _batch_args(s: argparse.ArgumentParser) -> None:
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


def _memory_args(s: argparse.ArgumentParser) -> None:
    s.add_argument("--gpu-memory-utilization", type=float, default=0.90,
                   help="share of the GPU's whole memory for this engine's weights, KV cache and activations "
                        "(replicas sharing a GPU: their shares add up to at most 0.9)")
    s.add_argument("--num-kv-blocks", type=int,
                   help="KV-cache size in blocks (default: what --gpu-memory-utilization leaves on a GPU, "
                        "--cpu-kv-cache-gib on CPU)")
    s.add_argument("--cpu-kv-cache-gib", type=float, default=0.25,
                   help="KV-cache size on CPU, in GiB; it must hold one sequence of --max-model-len tokens")
    s.add_argument("--block-size", type=int, default=16, help="tokens per KV-cache block, a power of two")
    s.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=True,
                   help="reuse the KV cache of a prompt's blocks that an earlier request computed")


def _numerics_args(s: argparse.ArgumentParser) -> None:
    s.add_argument("--device", choices=DEVICES, default="auto",
                   help="'auto': CUDA where torch sees a GPU, else the CPU")
    s.add_argument("--dtype", choices=DTYPES, default="auto",
                   help="the activations' dtype ('auto': float32 on the CPU; on a GPU float16 for a float16 "
                        "checkpoint, else bfloat16)")
    s.add_argument("--load-format", choices=LOAD_FORMATS, default="auto",
                   help="'dummy' builds random weights from config.json alone (benchmarks)")
    s.add_argument("--quantization", choices=QUANTIZATIONS,
                   help="'fp8' quantizes a bf16 checkpoint to FP8 at load (FP8 weights need compute capability "
                        "8.0 or later; before 8.9 activations stay bf16); the others name a layout for dummy "
                        "weights (a quantized checkpoint needs none: config.json says its layout)")
    s.add_argument("--kv-cache-dtype", choices=KV_CACHE_DTYPES, default="auto",
                   help="'fp8' keeps keys and values in e4m3 with a scale per row: about twice the tokens in the "
                        "same memory (compute capability 8.9 or later); 'auto' keeps the model's dtype")
    s.add_argument("--kernel-backend", choices=KERNEL_BACKENDS, default="auto",
                   help="'auto': the Triton kernels on CUDA, their torch references on the CPU; 'triton' on the CPU "
                        "needs TRITON_INTERPRET=1 (slow)")
    s.add_argument("--enforce-eager", action=argparse.BooleanOptionalAction, default=False,
                   help="no CUDA graphs: decode, prompt-chunk and mixed steps all run eagerly")


def _auth_and_connection_args(s: argparse.ArgumentParser) -> None:
    s.add_argument("--api-key", action="append", default=[], metavar="KEY",
                   help="a key clients must send as 'Authorization: Bearer KEY' (repeatable; 8 characters or more). "
                        "Visible in ps: prefer "
                        f"--api-key-file or ${KEY_ENV} (keys separated by commas)")
    s.add_argument("--api-key-file", action="append", default=[], metavar="PATH",
                   help="a file of API keys, one a line (repeatable)")
    s.add_argument("--protect-probes", action=argparse.BooleanOptionalAction, default=False,
                   help="require the key for /health and /metrics too")
    s.add_argument("--header-timeout", type=float, default=10.0,
                   help="seconds a connection gets to send a request's headers")
    s.add_argument("--idle-timeout", type=float, default=75.0,
                   help="seconds a connection may stay open between requests")
    s.add_argument("--max-connections", type=int, default=4096,
                   help="open connections at most; past that a new one gets 503 and is closed")
    s.add_argument("--allowed-origins", type=_origins, default=[], metavar="JSON",
                   help="origins whose web pages may call the API (CORS), a JSON list as vLLM takes it: '[\"*\"]' "
                        "for any, '[\"https://ui.example\"]'; none by default, where vLLM allows any")


def _positive(text: str) -> int:
    # the engine calls it max_num_seqs; refused here, the error names the option the user gave
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: give a whole number > 0")
    return int(text)


def _origins(text: str) -> list[str]:
    try:
        origins = json.loads(text)
    except json.JSONDecodeError:
        origins = None
    if not isinstance(origins, list) or not all(isinstance(o, str) and o for o in origins):
        raise argparse.ArgumentTypeError(f"{text[:60]!r}: give a JSON list of origins, as '[\"https://ui.example\"]'")
    return origins


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


class _Refused(Exception):
    """argparse's error, raised instead of printing usage and exiting."""


class _CheckingParser(argparse.ArgumentParser):
    def error(self, message: str):
        raise _Refused(message)


def _checker() -> argparse.ArgumentParser:
    # allow_abbrev off: the engine's own parser would take a prefix, a deploy's flag names must be whole
    parser = _CheckingParser(prog="serve", add_help=False, allow_abbrev=False)
    add_serve_arguments(parser)
    return parser


def refusal(argv: list[str]) -> str | None:
    """Why `serve --model M *argv` is refused (argparse's words), or None when it is taken."""
    try:
        _checker().parse_args(["--model", "/model", *argv])
    except _Refused as e:
        return str(e)
    return None


if __name__ == "__main__":
    print(json.dumps([refusal(list(argv)) for argv in json.loads(sys.argv[1])]))
