"""The kernel plan: what it decides for the Qwen2.5-7B shape on named GPUs (from config.json alone), its typed
launch configs, `hosttune-engine plan`, and that a prepared model runs what its plan names and nothing else."""

from pathlib import Path

import pytest
import torch

from hosttune_engine import LLM, Engine, EngineConfig, SamplingParams
from hosttune_engine.core import model_runner
from hosttune_engine.core.messages import EngineRequest
from hosttune_engine.core.sequence import Sequence
from hosttune_engine.errors import ConfigError, QuantizationError
from hosttune_engine.kernels import dequant_gemm, fp8_gemv, tuning
from hosttune_engine.layers import linear
from hosttune_engine.layers.backend import set_kernel_backend
from hosttune_engine.model.model_config import ModelConfig
from hosttune_engine.planner.build import PlanInputs, build_plan
from hosttune_engine.plan.gpus import GpuInfo, named_gpu
from hosttune_engine.plan.kinds import Fusion, Kernel, Op, Reason
from hosttune_engine.plan.launch import Fp8Method, LaunchConfig
from hosttune_engine.planner.prepare import apply_plan, plan_for_model, table_and_name
from hosttune_engine.plan.render import format_plan, summary
from hosttune_engine.quant.dummy_specs import dummy_spec
from hosttune_engine.server.cli import main

from .conftest import HAS_CUDA, WIDE_GEMV
from .oracle import prompt_ids
from .test_oracle import run

QWEN7B = Path(__file__).parents[1] / "fixtures" / "qwen2.5-7b"


@pytest.fixture
def no_user_tables(tmp_path, monkeypatch):
    monkeypatch.setenv(tuning.USER_ENV, str(tmp_path / "none.json"))
    monkeypatch.setenv(tuning.CACHE_ENV, str(tmp_path / "cache"))
    tuning.reload_tables()
    yield tmp_path / "cache"
    tuning.reload_tables()


def _plan(gpu: str, quantization: str | None = None, table: dict | None = None):
    gpu_info = named_gpu(gpu)
    spec = dummy_spec(quantization) if quantization else None
    inputs = PlanInputs(ModelConfig.from_folder(QWEN7B), gpu_info, torch.bfloat16, spec)
    return build_plan(inputs, *((table, "test") if table is not None else table_and_name(gpu_info)))


def test_bf16_on_the_h200_takes_the_tuned_gemv_at_one_row_and_cublas_above(no_user_tables):
    plan = _plan("NVIDIA H200")
    one = plan.choice(Op.QKV, 1)
    assert (one.kernel, one.reason, one.fusion) == (Kernel.GEMV, Reason.TUNED_BUCKET, Fusion.RMSNORM)
    assert one.args == tuning.shipped_table("NVIDIA H200")["gemv"]["bfloat16-m1"]
    assert plan.choice(Op.DOWN, 1).fusion is Fusion.SWIGLU and plan.choice(Op.O, 1).fusion is Fusion.NONE
    assert {plan.choice(op, 64).kernel for op in (Op.QKV, Op.O, Op.GATE_UP, Op.DOWN, Op.LM_HEAD)} == {Kernel.CUBLAS}
    assert plan.choice(Op.NORM, 1).kernel is Kernel.IN_CONSUMER and plan.choice(Op.NORM, 2).kernel is Kernel.RMSNORM
    assert plan.choice(Op.POST_NORM, 1).kernel is Kernel.IN_CONSUMER
    assert plan.choice(Op.ATTENTION, 4096, prefill=True).kernel is Kernel.PREFILL_ATTENTION and plan.is_tuned


def test_fp8_takes_per_shape_entries_on_the_h200_and_bf16_activations_where_the_scheme_keeps_them(no_user_tables):
    h200 = _plan("NVIDIA H200", "fp8")
    gemv = h200.choice(Op.QKV, 1)
    assert (gemv.kernel, gemv.reason, gemv.entry) == (Kernel.FP8_GEMV, Reason.TUNED_SHAPE,
                                                      "fp8_gemv bfloat16-le1-4608x3584")
    assert h200.choice(Op.QKV, 3).fusion is Fusion.NONE  # the prologue takes one row
    # qkv's GEMV computes its norm in its prologue; gate_up's tuned GEMV (FUSE 0) leaves it to the RMSNorm kernel
    assert (h200.choice(Op.NORM, 1).kernel, h200.choice(Op.POST_NORM, 1).kernel) == (Kernel.IN_CONSUMER,
                                                                                      Kernel.RMSNORM)
    down = h200.choice(Op.DOWN, 64)
    assert down.kernel is Kernel.FP8_GEMM and down.fusion is Fusion.SWIGLU_IN_GATE_UP
    assert h200.choice(Op.QKV, 4096).kernel is Kernel.FP8_MM_ROWWISE
    l40s = _plan("NVIDIA L40S", "fp8-block")
    assert l40s.table == "none" and not l40s.is_tuned
    batched = l40s.choice(Op.QKV, 64)
    assert (batched.kernel, batched.reason, batched.fusion) == (Kernel.W8A16_GEMM, Reason.DEFAULT, Fusion.NONE)
    assert batched.note == "the scheme keeps activations in bf16"
    assert _plan("NVIDIA L40S", "fp8").choice(Op.QKV, 64).kernel is Kernel.FP8_MM_UNIT  # Ada has FP8 tensor cores
    h100 = _plan("NVIDIA H100 80GB HBM3", "fp8")  # the H200's shipped table, borrowed (the same architecture)
    assert h100.choice(Op.QKV, 64) == h200.choice(Op.QKV, 64)
    assert h100.table == "shipped, NVIDIA H200's (same architecture)"
    assert _plan("NVIDIA H200 NVL", "fp8").table == h100.table  # the H200's chip on a PCIe card: it read none


def test_awq_dequantizes_for_prefill_where_the_h200_table_says_so(no_user_tables):
    plan = _plan("NVIDIA H200", "awq")
    assert plan.choice(Op.GATE_UP, 1).kernel is Kernel.INT4_GEMV
    want = LaunchConfig.from_table(tuning.shipped_table("NVIDIA H200")["w4a16_gemm"]["bfloat16-gt128-37888x3584"])
    prefill = plan.choice(Op.GATE_UP, 4096)
    assert prefill.config == want
    assert prefill.kernel is (Kernel.W4A16_DEQUANT if want.dequant else Kernel.W4A16_GEMM)


def test_untuned_awq_dequantizes_past_64_rows_and_tiles_below(no_user_tables):
    a100 = _plan("NVIDIA A100-SXM4-80GB", "awq")
    assert a100.table == "none"
    for rows in (65, 256, 4096):
        many = a100.choice(Op.GATE_UP, rows)
        assert (many.kernel, many.config, many.reason) == (Kernel.W4A16_DEQUANT, LaunchConfig(dequant=True),
                                                           Reason.DEFAULT)
        assert "past 64 rows" in many.note
    few = a100.choice(Op.GATE_UP, 64)
    assert (few.kernel, few.reason) == (Kernel.W4A16_GEMM, Reason.DEFAULT) and not few.config.dequant
    # a table's entry for the bucket still decides
    tiled = {"w4a16_gemm": {"bfloat16-gt128": {"BLOCK_M": 64, "BLOCK_N": 128, "BLOCK_K": 64, "num_warps": 4}}}
    assert _plan("NVIDIA A100-SXM4-80GB", "awq", tiled).choice(Op.GATE_UP, 4096).kernel is Kernel.W4A16_GEMM


def test_launch_configs_are_typed_and_refuse_unknown_keys():
    cfg = LaunchConfig.from_table({"BLOCK_N": 8, "FUSE": 0, "UNROLL": 2, "num_warps": 4})
    assert cfg.fuse is False and cfg.unroll == 2 and cfg.kernel_args() == {"BLOCK_N": 8, "num_warps": 4, "FUSE": 0,
                                                                            "UNROLL": 2}
    assert LaunchConfig.from_table({"METHOD": "triton"}).method is Fp8Method.TRITON
    assert LaunchConfig(block_n=4).merged(LaunchConfig(block_n=8, xb=True)) == LaunchConfig(block_n=8, xb=True)
    with pytest.raises(ConfigError, match="BLOCK_Q"):
        LaunchConfig.from_table({"BLOCK_Q": 1})


def test_the_plan_command_prints_a_named_gpus_plan_and_refuses_an_unknown_one(no_user_tables, capsys):
    main(["plan", "--model", str(QWEN7B), "--gpu", "NVIDIA L40S", "--quantization", "fp8-block"])
    out = capsys.readouterr().out
    assert "GPU: NVIDIA L40S (compute capability 8.9); weights fp8-block" in out
    assert "tuned table: none" in out and "Triton W8A16 GEMM" in out and "Triton FP8 GEMV" in out
    with pytest.raises(SystemExit) as exit_:
        main(["plan", "--model", str(QWEN7B), "--gpu", "Radeon 7900"])
    assert exit_.value.code == 2 and "unknown GPU" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_:
        main(["plan", "--model", str(QWEN7B), "--gpu", ""])
    assert exit_.value.code == 2 and "--gpu '': unknown GPU" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_:  # the vendor names no GPU, though one tuned table's name holds it
        main(["plan", "--model", str(QWEN7B), "--gpu", "NVIDIA"])
    assert exit_.value.code == 2 and "--gpu 'NVIDIA': unknown GPU" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_:  # an empty value (an unset variable) is not a name, nor no quantization
        main(["plan", "--model", str(QWEN7B), "--quantization", ""])
    assert exit_.value.code == 2 and "quantization must be one of fp8, fp8-block" in capsys.readouterr().err
    assert summary(_plan("NVIDIA H200")).startswith("kernel plan on NVIDIA H200, bfloat16 weights, tuned table shipped:")
    assert "qkv_proj:" in format_plan(_plan("NVIDIA H200"))


def test_the_plan_command_plans_the_block_size_serve_is_given(no_user_tables, capsys):
    """Decode attention's tuned entries are per KV block size: the plan of `serve --block-size 32` is not the
    default's."""
    def attention(*args):
        main(["plan", "--model", str(QWEN7B), "--gpu", "NVIDIA H200", *args])
        out = capsys.readouterr().out
        return [line for line in out.split("attention:")[1].split("\n\n")[0].splitlines() if "decode" in line]

    assert "tuned for this row bucket (decode_attention bfloat16-d128-g7-paged16-le1)" in attention()[0]
    assert not [row for row in attention("--block-size", "32") if "tuned" in row]  # the shipped entries are for 16
    with pytest.raises(SystemExit) as exit_:
        main(["plan", "--model", str(QWEN7B), "--block-size", "12"])
    assert exit_.value.code == 2
    assert capsys.readouterr().err == "hosttune-engine: error: block_size must be a power of two, got 12\n"


def test_the_plan_command_plans_the_kernel_backend_serve_is_given(no_user_tables, capsys, monkeypatch):
    """`serve --kernel-backend torch` runs the torch references on a GPU: its plan says so, not Triton's kernels."""
    main(["plan", "--model", str(QWEN7B), "--gpu", "NVIDIA H200", "--kernel-backend", "torch"])
    out = capsys.readouterr().out
    assert "Triton" not in out and "cuBLAS" not in out and "fallback; torch backend" in out
    if HAS_CUDA:
        return
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(SystemExit) as exit_:  # no --gpu on a machine without one: the CPU, refused as serve refuses it
        main(["plan", "--model", str(QWEN7B), "--kernel-backend", "triton"])
    assert exit_.value.code == 2 and capsys.readouterr().err == (
        "hosttune-engine: error: kernel_backend='triton' on the CPU needs TRITON_INTERPRET=1 (Triton's interpreter, "
        "slow); use kernel_backend 'auto' or 'torch'\n")


@pytest.mark.parametrize("gpu", ["H100", "h100", "nvidia h100 80gb hbm3"])
def test_a_gpu_named_in_any_case_plans_with_the_table_the_gpu_itself_reads(no_user_tables, capsys, gpu):
    # --gpu takes a name in any case: an H100's plan borrows the H200's table, whatever case it is asked in
    main(["plan", "--model", str(QWEN7B), "--gpu", gpu])
    assert "tuned table: shipped, NVIDIA H200's (same architecture)" in capsys.readouterr().out


V100, A100, A10 = "Tesla V100-SXM2-32GB", "NVIDIA A100-SXM4-80GB", "NVIDIA A10"
E4M3 = ("the Triton kernels' e4m3 type needs 8.9 or later (Ada or Hopper), and before it only FP8 weights run, decoded "
        "by integer operations from 8.0 (Ampere) on")
NOT_FP8 = "serve a 16-bit or a 4-bit AWQ/GPTQ checkpoint of the model"


@pytest.mark.parametrize("gpu, args, message", [
    (V100, [], f"{V100} (compute capability 7.0) has no bfloat16, which needs 8.0 or later: give --dtype float16"),
    (V100, ["--quantization", "fp8"],
     f"{V100} (compute capability 7.0) cannot run FP8 weights (fp8-channel): {E4M3}; {NOT_FP8}, with --dtype float16"),
    (V100, ["--dtype", "float16", "--kv-cache-dtype", "fp8"],
     f"{V100} (compute capability 7.0) cannot run an FP8 KV cache: {E4M3}; leave --kv-cache-dtype auto"),
    (V100, ["--dtype", "float16", "--quantization", "fp8-block", "--kv-cache-dtype", "fp8"],
     f"{V100} (compute capability 7.0) cannot run FP8 weights (fp8-block) or an FP8 KV cache: {E4M3}; {NOT_FP8} and "
     "leave --kv-cache-dtype auto"),
    (A100, ["--kv-cache-dtype", "fp8"],
     f"{A100} (compute capability 8.0) cannot run an FP8 KV cache: {E4M3}; leave --kv-cache-dtype auto"),
    (A10, ["--quantization", "fp8-tensor", "--kv-cache-dtype", "fp8"],
     f"{A10} (compute capability 8.6) cannot run an FP8 KV cache: {E4M3}; leave --kv-cache-dtype auto"),
])
def test_the_plan_refuses_in_one_line_what_the_gpu_cannot_run_and_says_what_can(no_user_tables, capsys, gpu, args,
                                                                                message):
    with pytest.raises(SystemExit) as exit_:
        main(["plan", "--model", str(QWEN7B), "--gpu", gpu, *args])
    assert exit_.value.code == 2 and capsys.readouterr().err == f"hosttune-engine: error: {message}\n"


def test_fp8_weights_and_an_fp8_kv_cache_are_planned_from_ada_on(no_user_tables, capsys):
    """An L40S (8.9) runs what an A100 (8.0) is refused: an FP8 KV cache, the Triton kernels' e4m3 type; an A100
    keeps bf16 and 4-bit weights."""
    main(["plan", "--model", str(QWEN7B), "--gpu", "NVIDIA L40S", "--quantization", "fp8", "--kv-cache-dtype", "fp8"])
    out = capsys.readouterr().out
    assert "GPU: NVIDIA L40S (compute capability 8.9); weights fp8-channel" in out and "Triton FP8 GEMV" in out
    assert "BITS" not in out and "decoded by integer operations" not in out
    for quantization in ("awq", "gptq"):
        main(["plan", "--model", str(QWEN7B), "--gpu", A100, "--quantization", quantization])
        assert f"GPU: {A100} (compute capability 8.0); weights {quantization}" in capsys.readouterr().out


@pytest.mark.parametrize("gpu", [A100, A10])
@pytest.mark.parametrize("quantization", ["fp8", "fp8-block", "fp8-tensor"])
def test_fp8_weights_run_on_ampere_decoded_by_bits_with_bf16_activations(no_user_tables, capsys, gpu, quantization):
    """Before 8.9 every FP8 projection takes the kernels that read e4m3 as bytes (BITS 1, no PACKED: its PTX
    converts e4m3 natively), a GEMV up to four rows and the W8A16 GEMM above: never the FP8 tensor cores, even
    where the scheme quantizes activations or a table says so."""
    table = {"fp8_gemv": {"bfloat16-le1": {"BLOCK_N": 16, "PACKED": 1}},
             "fp8_mm": {"bfloat16-gt128": {"METHOD": "triton"}}}
    plan = _plan(gpu, quantization, table)
    for op in (Op.QKV, Op.O, Op.GATE_UP, Op.DOWN):
        choices = plan.op(op).choices
        assert {c.kernel for c in choices} == {Kernel.FP8_GEMV, Kernel.W8A16_GEMM}
        assert all(c.args.get("BITS") == 1 and "PACKED" not in c.args for c in choices)
        assert all(c.note.endswith("e4m3 decoded by integer operations before 8.9") for c in choices)
        assert plan.choice(op, 1).args["BLOCK_N"] == 16 and plan.choice(op, 4096).fusion is Fusion.NONE
    assert plan.choice(Op.LM_HEAD, 1).kernel is Kernel.GEMV and "BITS" not in plan.choice(Op.LM_HEAD, 1).args
    assert "BITS" not in str(_plan("NVIDIA L40S", quantization, table).choice(Op.QKV, 1).config)
    assert summary(plan).endswith("; e4m3 weights decoded by integer operations")  # the line serve logs at load
    assert "decoded" not in summary(_plan("NVIDIA L40S", quantization, table))
    main(["plan", "--model", str(QWEN7B), "--gpu", gpu, "--quantization", quantization])
    out = capsys.readouterr().out
    assert f"weights {dummy_spec(quantization).layout.value}, activations bfloat16" in out and " BITS=1 " in out


@pytest.mark.parametrize("quantization", ["awq", "gptq"])
def test_the_plan_refuses_4bit_groups_that_do_not_divide_a_projection_as_the_load_does(no_user_tables, capsys,
                                                                                        tiny_models, quantization):
    # the tiny Qwen2's MLP is 192 wide: groups of 128 do not divide down_proj's input, and serve refuses to load it
    with pytest.raises(SystemExit) as exit_:
        main(["plan", "--model", str(tiny_models["qwen2"]), "--gpu", A100, "--quantization", quantization])
    line = "model.layers.0.mlp.down_proj: group size 128 does not divide its input width 192"
    assert exit_.value.code == 2 and capsys.readouterr().err == f"hosttune-engine: error: {line}\n"
    with pytest.raises(QuantizationError, match=line):
        LLM(str(tiny_models["qwen2"]), load_format="dummy", quantization=quantization)


def test_what_the_plan_refuses_the_engine_refuses_at_load_with_the_same_line(no_user_tables, capsys):
    main(["plan", "--model", str(QWEN7B), "--gpu", V100, "--dtype", "float16"])
    assert f"GPU: {V100} (compute capability 7.0); weights float16" in capsys.readouterr().out
    model = ModelConfig.from_folder(QWEN7B)
    for dtype, spec, kv_fp8 in ((torch.bfloat16, None, False), (torch.float16, dummy_spec("fp8"), False),
                                (torch.float16, None, True)):
        with pytest.raises(ConfigError, match=f"^{V100} \\(compute capability 7.0\\) (has no|cannot run)"):
            build_plan(PlanInputs(model, named_gpu(V100), dtype, spec, kv_cache_fp8=kv_fp8), {}, "none")
    build_plan(PlanInputs(model, named_gpu(V100), torch.bfloat16, None, use_triton=False), {}, "none")  # torch runs it
    for spec in (None, dummy_spec("fp8-block")):
        with pytest.raises(ConfigError, match=f"^{A100} \\(compute capability 8.0\\) cannot run an FP8 KV cache:"):
            build_plan(PlanInputs(model, named_gpu(A100), torch.bfloat16, spec, kv_cache_fp8=True), {}, "none")
        # the torch backend dequantizes FP8 weights and KV rows with torch's own casts, which need no e4m3 in Triton
        build_plan(PlanInputs(model, named_gpu(A100), torch.bfloat16, spec, False, True), {}, "none")
    plan = build_plan(PlanInputs(model, named_gpu(A100), torch.bfloat16, dummy_spec("fp8-block")), {}, "none")
    assert plan.choice(Op.QKV, 1).args["BITS"] == 1  # FP8 weights load on Ampere, decoded by bits


def test_the_engine_loads_fp8_weights_on_ampere_and_its_kernels_decode_them_by_bits(tiny_models, monkeypatch):
    """What `serve` loads on an A100 (the CPU standing in, the kernels under the interpreter): an FP8 checkpoint,
    planned with BITS 1, whose GEMV (1 row) and W8A16 GEMM (24 rows) each take the weights' bytes, with the logits
    of the torch references on the same weights."""
    ampere = GpuInfo("cpu standing in for an A100", (8, 0), False)
    monkeypatch.setattr(linear, "_on_gpu", lambda x: True)
    monkeypatch.setattr(model_runner, "present_gpu", lambda device: ampere)
    decoded = set()  # (kernel module, whether it took bytes)
    for module in (fp8_gemv, dequant_gemm):
        monkeypatch.setattr(module, "weight_operand", lambda w, bits, name=module.__name__: decoded.add((name, bits))
                            or w.view(torch.uint8))
    eng = Engine(EngineConfig(model=str(tiny_models["llama"]), load_format="dummy", quantization="fp8-block",
                              dtype="float32", num_kv_blocks=16, enforce_eager=True, kernel_backend="triton"))
    if not HAS_CUDA:  # the interpreter's cost is per program: the one-row GEMVs on wide tiles
        table = {kernel: {"float32-le1": WIDE_GEMV, "float32-m1": WIDE_GEMV} for kernel in ("gemv", "fp8_gemv")}
        eng.runner.plan = plan_for_model(eng.runner.model, ampere, table=table)
        apply_plan(eng.runner.model, eng.runner.plan)
    assert eng.runner.plan.choice(Op.QKV, 1).args["BITS"] == 1
    for rows in (1, 24):
        seq = Sequence("x", list(range(3, 3 + rows)), SamplingParams(temperature=0))
        eng.block_manager.allocate(seq, rows)
        got = eng.runner.prefill_logits(seq)
        set_kernel_backend(eng.runner.model, False)
        want = eng.runner.prefill_logits(seq)
        set_kernel_backend(eng.runner.model, True)
        eng.block_manager.free(seq)
        torch.testing.assert_close(got, want, atol=2e-3 * want.abs().max().item(), rtol=2e-3)
    assert decoded == {(fp8_gemv.__name__, True), (dequant_gemm.__name__, True)}


@pytest.mark.parametrize("text, message", [
    ("{bad", "is not JSON"),
    ('{"gpu": "NVIDIA H200", "driver": "1", "triton": "3"}', "holds no \"kernels\""),
    ('{"gpu": "NVIDIA H200", "driver": "1", "triton": "3", "kernels": {"gemv": {"bfloat16-m1": {"num_warps": 0}}}}',
     "kernels gemv bfloat16-m1: num_warps 0: give a whole number >= 1"),
])
def test_the_plan_command_refuses_a_malformed_cached_table_of_that_gpu(no_user_tables, capsys, text, message):
    """A table `tune` wrote, edited by hand until it does not parse, is refused naming its file, not left out."""
    path = tuning.cache_path(tuning.TableKey("NVIDIA H200", "1", "3"))
    path.parent.mkdir(parents=True)
    path.write_text(text)
    tuning.reload_tables()
    with pytest.raises(SystemExit) as exit_:
        main(["plan", "--model", str(QWEN7B), "--gpu", "NVIDIA H200"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.count("\n") == 1 and str(path) in err and message in err, err
    main(["plan", "--model", str(QWEN7B), "--gpu", "NVIDIA H100 80GB HBM3"])  # another GPU's table is not read


def test_the_plan_command_takes_a_gpu_as_its_tables_spell_it(no_user_tables, capsys):
    """A family ('H200', as the unknown-GPU error lists them) or another case names the GPU whose tuned table
    the engine on it would read; a name that two tables contain is refused, not guessed."""
    for name in ("H200", "nvidia h200", "NVIDIA H200"):
        main(["plan", "--model", str(QWEN7B), "--gpu", name])
        assert "GPU: NVIDIA H200 (compute capability 9.0);" in capsys.readouterr().out
    tuning.save_config("gemv", "bfloat16-m1", "NVIDIA H100 80GB HBM3", {"BLOCK_N": 8}, no_user_tables / "t.json")
    tuning.save_config("gemv", "bfloat16-m1", "NVIDIA H100 PCIe", {"BLOCK_N": 8}, no_user_tables / "t.json")
    with pytest.MonkeyPatch.context() as m:
        m.setenv(tuning.USER_ENV, str(no_user_tables / "t.json"))
        tuning.reload_tables()
        with pytest.raises(SystemExit) as exit_:
            main(["plan", "--model", str(QWEN7B), "--gpu", "h100"])
        err = capsys.readouterr().err
        assert exit_.value.code == 2 and "'NVIDIA H100 80GB HBM3', 'NVIDIA H100 PCIe'" in err
        main(["plan", "--model", str(QWEN7B), "--gpu", "H100 PCIe"])
        assert "GPU: NVIDIA H100 PCIe (compute capability 9.0);" in capsys.readouterr().out
    main(["plan", "--model", str(QWEN7B), "--gpu", "NVIDIA L40S"])  # no table: the name as given
    assert "GPU: NVIDIA L40S (compute capability 8.9);" in capsys.readouterr().out


def _float16_model(folder: Path) -> Path:
    text = (QWEN7B / "config.json").read_text()
    assert '"torch_dtype": "bfloat16"' in text
    (folder / "config.json").write_text(text.replace('"torch_dtype": "bfloat16"', '"torch_dtype": "float16"'))
    return folder


def test_the_plan_command_plans_the_activations_serve_would_run(no_user_tables, tmp_path, capsys, monkeypatch):
    """serve computes a float16 checkpoint in float16 on a GPU and anything in float32 on the CPU, unless --dtype
    says otherwise: the plan printed is of those activations, and a CPU is not called a GPU."""
    main(["plan", "--model", str(_float16_model(tmp_path)), "--gpu", "NVIDIA H200"])
    assert "weights float16, activations float16" in capsys.readouterr().out
    main(["plan", "--model", str(QWEN7B), "--gpu", "NVIDIA H200", "--dtype", "float32"])
    assert "activations float32" in capsys.readouterr().out
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    main(["plan", "--model", str(QWEN7B)])
    head = capsys.readouterr().out.splitlines()[1]
    assert head.startswith("device: CPU (no GPU: the torch references run);") and "activations float32" in head


@pytest.mark.parametrize("text, message", [
    ("{bad", "is not JSON"),
    ("[1]", "holds a JSON list, not an object of GPU names"),
    ('{"NVIDIA H200": [1]}', "'NVIDIA H200': holds a JSON list, not an object of kernels"),
    ('{"NVIDIA H200": {"gemv": [1]}}', "'NVIDIA H200' gemv: holds a JSON list, not an object of entries"),
    ('{"NVIDIA H200": {"gemv": {"bfloat16-m1": 4}}}', "gemv bfloat16-m1: holds a JSON int, not an object of"),
    ('{"NVIDIA H200": {"gemv": {"bfloat16-m1": {"BLOCK_N": "x"}}}}', "BLOCK_N 'x': give a whole number >= 1"),
    ('{"NVIDIA H200": {"gemv": {"bfloat16-m1": {"BLOCK_N": -4}}}}', "BLOCK_N -4: give a whole number >= 1"),
    ('{"NVIDIA H200": {"gemv": {"bfloat16-m1": {"FUSE": 2}}}}', "FUSE 2: give 0 or 1"),
    ('{"NVIDIA H200": {"fp8_gemm": {"le64": {"METHOD": "fast"}}}}', "METHOD 'fast': give one of unit, rowwise"),
    ('{"NVIDIA H200": {"gemv": {"bfloat16-m1": {"BLOCK_Q": 1}}}}', "unknown launch-config key 'BLOCK_Q'"),
])
def test_the_plan_command_refuses_a_malformed_tuned_table_in_one_line_naming_its_file(no_user_tables, tmp_path,
                                                                                     monkeypatch, capsys, text,
                                                                                     message):
    table = tmp_path / "kernel_configs.json"
    table.write_text(text)
    monkeypatch.setenv(tuning.USER_ENV, str(table))
    tuning.reload_tables()
    with pytest.raises(SystemExit) as exit_:
        main(["plan", "--model", str(QWEN7B), "--gpu", "NVIDIA H200"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.count("\n") == 1 and f"{table}" in err and message in err, err


def test_the_plan_command_refuses_a_tuned_table_path_that_is_a_folder(no_user_tables, tmp_path, monkeypatch, capsys):
    # $HOSTTUNE_KERNEL_CONFIGS names a file: a folder there is a mistake to fix, not "no table"
    monkeypatch.setenv(tuning.USER_ENV, str(tmp_path))
    tuning.reload_tables()
    with pytest.raises(SystemExit) as exit_:
        main(["plan", "--model", str(QWEN7B), "--gpu", "NVIDIA H200"])
    assert exit_.value.code == 2 and capsys.readouterr().err == (
        f"hosttune-engine: error: {tmp_path} (a tuned table, ${tuning.USER_ENV}) is a folder; name a JSON file\n")


def test_the_plan_command_refuses_a_malformed_config_in_one_line(tmp_path, capsys):
    (tmp_path / "config.json").write_text('["LlamaForCausalLM"]')
    with pytest.raises(SystemExit) as exit_:
        main(["plan", "--model", str(tmp_path)])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.count("\n") == 1 and "holds a JSON list, not an object" in err


def test_a_plan_naming_the_torch_reference_for_one_projection_runs_it_there_only(tiny_models, monkeypatch, caplog,
                                                                                wide_gemv_tiles):
    """One-row decode under the Triton interpreter: every projection's weight goes through the GEMV except
    o_proj's, whose plan names the torch reference; the tokens stay the reference's."""
    seen = []
    for name in ("gemv", "gemv_rmsnorm", "gemv_swiglu"):
        fn = getattr(linear, name)
        weight_at = 3 if name == "gemv_rmsnorm" else 1
        monkeypatch.setattr(linear, name, lambda *a, _fn=fn, _i=weight_at, **k: (seen.append(a[_i]), _fn(*a, **k))[1])
    monkeypatch.setattr(linear, "_on_gpu", lambda x: True)
    caplog.set_level("INFO", logger="hosttune_engine.planner.prepare")
    eng = Engine(EngineConfig(model=str(tiny_models["qwen2"]), kernel_backend="triton", dtype="float32",
                              num_kv_blocks=64, enforce_eager=True))
    model = eng.runner.model
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    assert f"kernel plan on {device}, float32 weights" in caplog.text  # the engine logs the plan it runs at start
    params = SamplingParams(temperature=0, max_tokens=3, ignore_eos=True)
    ids = prompt_ids(9, seed=4)
    planned = run(eng, {0: [EngineRequest("a", ids, params)]})["a"]
    assert {id(w) for w in seen} == {id(p) for n, p in model.named_parameters() if n.endswith("proj.weight")} | {
        id(model.lm_head.weight)}
    seen.clear()
    apply_plan(model, eng.runner.plan.with_kernel(Op.O, Kernel.TORCH))
    assert run(eng, {0: [EngineRequest("b", ids, params)]})["b"] == planned
    o_weights = {id(layer.self_attn.o_proj.weight) for layer in model.model.layers}
    assert seen and not o_weights & {id(w) for w in seen}
    # qkv, gate_up and down in 2 one-row steps; the LM head for each of the 3 tokens (the prefill's last row too)
    assert len(seen) == 2 * 3 * len(model.model.layers) + 3


def test_a_wgmma_entry_is_the_hopper_kernel_on_sm90_and_the_dequantizing_path_elsewhere(monkeypatch):
    """The plan says what the run does: the warpgroup GEMM where the table holds it and it can run, else the
    weight dequantized (what kernels/dequant_gemm.py then takes), with why."""
    import sys

    pytest.importorskip("triton.experimental.gluon")
    entry = {"WGMMA": 1, "BLOCK_M": 64, "BLOCK_N": 128, "BLOCK_K": 128, "SPLIT_K": 1, "num_warps": 4, "num_stages": 3}
    table = {"w4a16_gemm": {"bfloat16-le64": entry}}
    h200 = _plan("NVIDIA H200", "awq", table).choice(Op.DOWN, 64)
    assert h200.kernel is Kernel.W4A16_WGMMA and h200.config.wgmma and h200.config.block_n == 128
    a100 = _plan("NVIDIA A100-SXM4-80GB", "awq", table).choice(Op.DOWN, 64)
    assert (a100.kernel, a100.config) == (Kernel.W4A16_DEQUANT, LaunchConfig(dequant=True))
    assert a100.note == "the table's warpgroup GEMM cannot run here: not an sm_90 GPU"
    monkeypatch.setitem(sys.modules, "hosttune_engine.kernels.w4a16_hopper", None)  # a Triton without Gluon
    assert _plan("NVIDIA H200", "awq", table).choice(Op.DOWN, 64).note.endswith("this Triton has no Gluon")


def test_decode_steps_of_129_to_256_rows_read_their_own_bucket_before_the_prefills():
    """A 4-bit entry for 256 rows (one program for the whole batch) takes the decode steps of 129-256 rows only;
    past 256 rows, and for a kernel with no such entry, the gt128 entries decide as before."""
    whole = {"WGMMA": 1, "REGS": 1, "BLOCK_M": 256, "BLOCK_N": 128, "BLOCK_K": 128, "SPLIT_K": 1, "num_warps": 8,
             "num_stages": 2}
    table = {"w4a16_gemm": {"bfloat16-le256-37888x3584": whole, "bfloat16-gt128": {"DEQUANT": 1}}}
    plan = _plan("NVIDIA H200", "awq", table)
    decode = plan.choice(Op.GATE_UP, 200)
    assert (decode.config.block_m, decode.reason, decode.entry) == (256, Reason.TUNED_SHAPE,
                                                                     "w4a16_gemm bfloat16-le256-37888x3584")
    for op, rows in ((Op.GATE_UP, 257), (Op.DOWN, 200), (Op.DOWN, 4096)):
        other = plan.choice(op, rows)
        assert (other.kernel, other.entry) == (Kernel.W4A16_DEQUANT, "w4a16_gemm bfloat16-gt128"), (op, rows)
