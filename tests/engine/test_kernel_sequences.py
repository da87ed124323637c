"""Which kernels each plan path launches, in order, per step: pinned.

Every engine module's reference to a kernel launcher (a function of `hosttune_engine.kernels`) and torch's
`F.linear` (cuBLAS) is wrapped to record its name (and a GEMV's prologue), then one step of 1, 3 and 24 rows
runs on a tiny model under the Triton interpreter, the GPU paths taking CPU tensors and the CPU standing in
for a GPU with FP8 tensor cores. The recorded sequences (tests/fixtures/engine/kernel_sequences.json) are
what the plan makes the model run: a change to how layers reach their kernels must leave them as they are.
"""

import json
import sys
from pathlib import Path

import pytest
import torch

from hosttune_engine import Engine, EngineConfig, SamplingParams
from hosttune_engine.core import model_runner
from hosttune_engine.core.sequence import Sequence
from hosttune_engine.layers import linear
from hosttune_engine.planner import prepare
from hosttune_engine.plan.gpus import GpuInfo

from .conftest import WIDE_GEMV

PINNED = Path(__file__).parents[1] / "fixtures" / "engine" / "kernel_sequences.json"
HOPPER_STAND_IN = GpuInfo("cpu", (9, 0), present=False)  # FP8 tensor cores; the wide GEMV tiles ("cpu")
ROWS = (1, 3, 24)
# name -> (model, dtype, quantization, kernel backend, tuned table over the GEMVs' wide tiles)
TRITON_GEMM = {"fp8_mm": {"float16-le32": {"METHOD": "triton"}}, "fp8_gemm": {"float16-le32": {"SWIGLU": 1}},
               "fp8_gemv": {"float16-le1": WIDE_GEMV, "float16-le8": WIDE_GEMV}}
CASES = {
    "bf16": ("qwen2", "float32", None, "triton", None),
    "torch": ("qwen2", "float32", None, "torch", None),
    "fp8": ("qwen2", "float16", "fp8", "triton", None),
    "fp8-triton-gemm": ("qwen2", "float16", "fp8", "triton", TRITON_GEMM),
    "fp8-block": ("llama", "float16", "fp8-block", "triton", None),
    "fp8-channel": ("llama", "float16", "fp8-channel", "triton", None),
    "fp8-tensor": ("llama", "float16", "fp8-tensor", "triton", None),
    "awq": ("llama", "float32", "awq", "triton", None),
    "gptq": ("llama", "float32", "gptq", "triton", None),
}


def _is_kernel(value) -> bool:
    return callable(value) and getattr(value, "__module__", "").startswith("hosttune_engine.kernels.")


def record_kernels(monkeypatch) -> list[str]:
    """Wrap every kernel launcher the engine's layers reach (outside the kernels themselves) and the LM head's
    GEMM; return the log. Only the outermost call is logged: the LM head's GEMM is one entry whichever torch
    call it makes on this device (a fp32-output mm on a GPU, F.linear on the CPU)."""
    log: list[str] = []
    depth = [0]

    def wrap(fn, name):
        def recorded(*a, **k):
            if not depth[0]:
                log.append(f"{name} prologue {k['prologue']}" if k.get("prologue") else name)
            depth[0] += 1
            try:
                return fn(*a, **k)
            finally:
                depth[0] -= 1
        return recorded

    for module_name, module in list(sys.modules.items()):
        if not module_name.startswith("hosttune_engine.") or module_name.startswith("hosttune_engine.kernels"):
            continue
        for attr, value in list(vars(module).items()):
            if _is_kernel(value) and not isinstance(value, type):
                monkeypatch.setattr(module, attr, wrap(value, value.__name__))
    monkeypatch.setattr(torch.nn.functional, "linear", wrap(torch.nn.functional.linear, "F.linear"))
    monkeypatch.setattr(linear, "logits_from_hidden", wrap(linear.logits_from_hidden, "logits_from_hidden"))
    return log


def _engine(tiny_models, case: str) -> Engine:
    model, dtype, quantization, backend, table = CASES[case]
    eng = Engine(EngineConfig(model=str(tiny_models[model]), load_format="dummy", quantization=quantization,
                              kernel_backend=backend, dtype=dtype, num_kv_blocks=64, enforce_eager=True))
    if table is not None:
        runner = eng.runner
        runner.plan = prepare.plan_for_model(runner.model, runner.plan.gpu, table=table)
        prepare.apply_plan(runner.model, runner.plan)
    return eng


def _one_step(eng: Engine, rows: int) -> None:
    seq = Sequence("x", list(range(3, 3 + rows)), SamplingParams(temperature=0))
    eng.block_manager.allocate(seq, rows)
    eng.runner.prefill_logits(seq)
    eng.block_manager.free(seq)


def sequences(tiny_models, monkeypatch, case: str) -> dict[str, list[str]]:
    """Per row count, the kernels one step of that many rows launches on `case`'s model."""
    monkeypatch.setattr(linear, "_on_gpu", lambda x: True)
    monkeypatch.setattr(model_runner, "present_gpu", lambda device: HOPPER_STAND_IN)
    eng = _engine(tiny_models, case)
    log = record_kernels(monkeypatch)
    found = {}
    for rows in ROWS:
        _one_step(eng, rows)
        found[str(rows)] = list(log)
        log.clear()
    return found


@pytest.mark.parametrize("case", list(CASES))
def test_each_plan_path_launches_the_pinned_kernels(tiny_models, monkeypatch, wide_gemv_tiles, case):
    got = sequences(tiny_models, monkeypatch, case)
    assert got == json.loads(PINNED.read_text())[case]


def test_the_torch_backend_switch_runs_the_references_and_back_the_plan(tiny_models, monkeypatch, wide_gemv_tiles):
    """A prepared model switched to the torch backend launches what the torch engine launches (its fused
    modules run the norm, then the projection, on the references), and switched back, the plan's kernels."""
    from hosttune_engine.layers.backend import set_kernel_backend
    from hosttune_engine.model.llama import PreparedDecoderLayer

    monkeypatch.setattr(linear, "_on_gpu", lambda x: True)
    eng = _engine(tiny_models, "bf16")
    assert all(type(layer) is PreparedDecoderLayer for layer in eng.runner.model.model.layers)
    log, pinned = record_kernels(monkeypatch), json.loads(PINNED.read_text())
    for backend, case in ((False, "torch"), (True, "bf16")):
        set_kernel_backend(eng.runner.model, backend)
        _one_step(eng, 1)
        assert log == pinned[case]["1"]
        log.clear()


def test_each_fused_module_runs_inside_one_segment(tiny_models, monkeypatch, wide_gemv_tiles):
    """The piecewise graphs capture the model segment by segment (core/mixed_graphs.py): every fused module,
    the FP8 MLP whose gate_up GEMM writes down_proj's input among them, starts and ends inside one segment."""
    from hosttune_engine.layers.fused import NormLinear, NormMLP

    monkeypatch.setattr(linear, "_on_gpu", lambda x: True)
    monkeypatch.setattr(model_runner, "present_gpu", lambda device: HOPPER_STAND_IN)
    eng = _engine(tiny_models, "fp8-triton-gemm")
    model = eng.runner.model.model
    events, segment = [], model.segment
    monkeypatch.setattr(model, "segment", lambda *a: (events.append("("), segment(*a), events.append(")"))[1])
    for module in model.modules():
        if isinstance(module, (NormLinear, NormMLP)):
            module.register_forward_pre_hook(lambda *a: events.append("["))
            module.register_forward_hook(lambda *a: events.append("]"))
    for rows in ROWS:
        _one_step(eng, rows)
    layers = len(model.layers)
    steps = "".join(events)
    assert steps.count("[") == len(ROWS) * 2 * layers  # the norm feeding qkv_proj, the MLP behind its norm
    assert steps.replace("[]", "").replace("()", "") == ""  # none opens in one segment and closes in another
