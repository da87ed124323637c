"""An independent reading of the public quantized layouts, for the tests: each format's dequantization
written out from its definition (nibble by nibble, block by block), sharing no code with the engine.

`dequantize_folder` turns a quantized checkpoint into a plain fp32 one that Hugging Face
transformers loads as an ordinary model: the oracle the engine's quantized layers are held to.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

AWQ_NIBBLE_COLUMN = [0, 2, 4, 6, 1, 3, 5, 7]  # nibble i (bits 4i..4i+3) of an AWQ int32 holds this column


def nibble(packed: torch.Tensor, i: int) -> torch.Tensor:
    return (packed.to(torch.int64) >> (4 * i)) & 0xF


def awq_weight(qweight, qzeros, scales, group_size) -> torch.Tensor:
    """AWQ gemm: qweight [K, N/8], qzeros [G, N/8], scales [G, N] -> w [N, K]."""
    k, n = qweight.shape[0], qweight.shape[1] * 8
    q = torch.empty(k, n, dtype=torch.int64)
    z = torch.empty(qzeros.shape[0], n, dtype=torch.int64)
    for i, col in enumerate(AWQ_NIBBLE_COLUMN):
        q[:, col::8] = nibble(qweight, i)
        z[:, col::8] = nibble(qzeros, i)
    groups = torch.arange(k) // group_size
    return ((q - z[groups]) * scales.float()[groups]).t()


def gptq_weight(qweight, qzeros, scales, g_idx, zero_offset) -> torch.Tensor:
    """GPTQ: qweight [K/8, N] (row 8r + i at nibble i), qzeros [G, N/8], scales [G, N], g_idx [K] -> w [N, K]."""
    k, n = qweight.shape[0] * 8, qweight.shape[1]
    q = torch.empty(k, n, dtype=torch.int64)
    z = torch.empty(qzeros.shape[0], n, dtype=torch.int64)
    for i in range(8):
        q[i::8] = nibble(qweight, i)
        z[:, i::8] = nibble(qzeros, i)
    g = g_idx.long()
    return ((q - (z[g] + zero_offset)) * scales.float()[g]).t()


def fp8_weight(weight, scale, block=None) -> torch.Tensor:
    """FP8: scale per tensor [1], per channel [N, 1] or per block [ceil(N/bn), ceil(K/bk)] -> w [N, K]."""
    w = weight.float()
    if block is None:
        return w * scale.float().reshape(-1, 1) if scale.numel() > 1 else w * scale.float().reshape(())
    out = torch.empty_like(w)
    bn, bk = block
    for r in range(scale.shape[0]):
        for c in range(scale.shape[1]):
            out[r * bn:(r + 1) * bn, c * bk:(c + 1) * bk] = w[r * bn:(r + 1) * bn, c * bk:(c + 1) * bk] * scale[r, c].float()
    return out


def dequantized_state(tensors: dict, qc: dict) -> dict:
    method = qc["quant_method"]
    modules = {name.rsplit(".", 1)[0] for name in tensors
               if name.endswith((".qweight", ".weight_scale", ".weight_scale_inv"))}
    out = {name: t.float() for name, t in tensors.items() if name.rsplit(".", 1)[0] not in modules
           or name.endswith(".bias")}
    for m in modules:
        t = lambda s: tensors[f"{m}.{s}"]  # noqa: E731
        if method == "awq":
            w = awq_weight(t("qweight"), t("qzeros"), t("scales"), qc["group_size"])
        elif method == "gptq":
            offset = 1 if qc.get("checkpoint_format", "gptq") == "gptq" else 0
            w = gptq_weight(t("qweight"), t("qzeros"), t("scales"), t("g_idx"), offset)
        elif method == "fp8":
            w = fp8_weight(t("weight"), t("weight_scale_inv"), tuple(qc["weight_block_size"]))
        else:
            weights = qc["config_groups"]["group_0"]["weights"]
            block = tuple(weights["block_structure"]) if weights["strategy"] == "block" else None
            w = fp8_weight(t("weight"), t("weight_scale"), block)
        out[f"{m}.weight"] = w.contiguous()
    return out


def dequantize_folder(source: Path, target: Path) -> Path:
    """A plain fp32 checkpoint with `source`'s quantized weights dequantized."""
    from safetensors.torch import load_file, save_file

    config = json.loads((source / "config.json").read_text())
    tensors = load_file(str(source / "model.safetensors"))
    state = dequantized_state(tensors, config.pop("quantization_config"))
    target.mkdir(parents=True, exist_ok=True)
    save_file(state, str(target / "model.safetensors"))
    config["torch_dtype"] = "float32"
    (target / "config.json").write_text(json.dumps(config))
    for f in source.iterdir():
        if f.name not in ("config.json", "model.safetensors"):
            shutil.copy(f, target / f.name)
    return target
