"""Write a Hugging Face checkpoint quantized in one of the public layouts the engine loads.

Example:
    python engine/scripts/quantize_checkpoint.py --model /models/qwen2.5-7b --out /models/qwen2.5-7b-awq \
        --layout awq --group-size 128

Layouts: fp8-block (quant_method fp8, 128x128 blocks, weight_scale_inv, as the Qwen3 and DeepSeek
FP8 releases), fp8-channel / fp8-tensor (compressed-tensors, as llm-compressor writes), awq (gemm,
zero points), gptq (--sym or zero points, --desc-act for act-order groups with g_idx). Round to
nearest, or for 4-bit with --calibration-text, after an activation-aware scale search (AWQ's); the
lm_head and embeddings stay in --dtype. --model is a plain (unquantized) checkpoint; --out is a new or
empty folder (one holding files is refused, so no other checkpoint's shards end up beside the new one).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from hosttune_engine.errors import ConfigError, EngineError
from hosttune_engine.quant.spec import Layout, QuantSpec
from hosttune_engine.checkpoint.writer import write_quantized

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
DEFAULT_SIZE = 128  # --block and --group-size
CALIBRATION_TOKENS = 512
# Options of some layouts only: given with another, they would be ignored and another checkpoint written.
LAYOUT_OPTIONS = {"block": ("fp8-block",), "group_size": ("awq", "gptq"), "sym": ("gptq",), "desc_act": ("gptq",),
                  "calibration_text": ("awq", "gptq")}


def check_options(args) -> None:
    for name, layouts in LAYOUT_OPTIONS.items():
        if getattr(args, name) not in (None, False) and args.layout not in layouts:
            option, where = f"--{name.replace('_', '-')}", " or ".join(layouts)
            raise ConfigError(f"{option} applies to --layout {where}, not {args.layout}")


def spec_from_args(args) -> QuantSpec:
    layout = Layout(args.layout)
    block, group_size = args.block or DEFAULT_SIZE, args.group_size or DEFAULT_SIZE
    if layout is Layout.FP8_BLOCK:
        return QuantSpec(layout, block=(block, block), ignore=("lm_head",))
    if layout.is_fp8:  # llm-compressor's FP8_DYNAMIC: FP8 weights, per-token dynamic FP8 activations
        return QuantSpec(layout, fp8_activations=True, ignore=("lm_head",))
    if layout is Layout.AWQ:
        return QuantSpec(layout, group_size=group_size)
    return QuantSpec(layout, group_size=group_size, zero_point=not args.sym, desc_act=args.desc_act, zero_offset=1)


def calibration_ids(args) -> list[int] | None:
    if args.calibration_text is None:
        return None
    from hosttune_engine.model.tokenizer import Tokenizer

    try:
        text = args.calibration_text.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"--calibration-text {args.calibration_text}: cannot read it ({e}); give a text file")
    if not text.strip():
        raise ConfigError(f"--calibration-text {args.calibration_text} holds no text; give a file of representative "
                          f"text (its first {CALIBRATION_TOKENS} tokens are used)")
    return Tokenizer(args.model).encode(text)[:CALIBRATION_TOKENS]


def check_source(model: Path, spec: QuantSpec) -> None:
    """A plain checkpoint (quantizing quantized weights again would quantize their packed integers) whose tensors
    fit its config.json, as the engine will load the result."""
    from hosttune_engine.checkpoint.source import check_source_fits
    from hosttune_engine.model.model_config import ModelConfig

    quantized = ModelConfig.from_folder(model).quantization
    if quantized is not None:
        raise ConfigError(f"--model {model} is already quantized ({quantized.layout.value}); give the plain "
                          "checkpoint it was made from")
    check_source_fits(model, spec)


def make_out(out: Path) -> None:
    """Create --out before the slow part; never write over another checkpoint (its shards would stay beside ours)."""
    if out.is_dir() and any(out.iterdir()):
        raise ConfigError(f"--out {out} already holds files; give a new or empty folder")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ConfigError(f"--out {out}: cannot create it ({e.strerror}); give a folder you can write") from e


def positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: give a whole number > 0")
    return int(text)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, type=Path, help="plain Hugging Face checkpoint folder")
    parser.add_argument("--out", required=True, type=Path, help="a new or empty folder")
    parser.add_argument("--layout", required=True,
                        choices=[l.value for l in Layout if l is not Layout.FP8_CT_BLOCK])
    parser.add_argument("--block", type=positive, help=f"fp8-block: block size (default {DEFAULT_SIZE})")
    parser.add_argument("--group-size", type=positive, help=f"4-bit: input columns per scale (default {DEFAULT_SIZE})")
    parser.add_argument("--sym", action="store_true", help="gptq: symmetric, no zero points")
    parser.add_argument("--desc-act", action="store_true", help="gptq: act-order groups (g_idx)")
    parser.add_argument("--calibration-text", type=Path, help="4-bit: a text file whose activations choose "
                                                                 f"AWQ-style scales (first {CALIBRATION_TOKENS} tokens)")
    parser.add_argument("--dtype", choices=DTYPES, help="dtype of what stays unquantized "
                                                         "(default bfloat16 for fp8, float16 for 4-bit)")
    args = parser.parse_args(argv)
    spec = spec_from_args(args)
    dtype = DTYPES[args.dtype or ("bfloat16" if spec.layout.is_fp8 else "float16")]
    existed = args.out.exists()
    try:
        check_options(args)
        check_source(args.model, spec)
        ids = calibration_ids(args)
        make_out(args.out)
        write_quantized(args.model, args.out, spec, dtype, ids)
    except EngineError as e:
        if not existed and args.out.is_dir() and not any(args.out.iterdir()):
            args.out.rmdir()  # refused before writing: leave no empty folder behind
        print(f"quantize_checkpoint: error: {e}", file=sys.stderr)
        return 2
    print(f"wrote {args.out} ({spec.layout.value})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
