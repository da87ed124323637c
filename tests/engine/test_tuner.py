"""`hosttune-engine tune` on tiny shapes under the Triton interpreter: each planned kernel's candidates are
checked and timed, the winners land under the keys the plan reads, and the cached table counts only on the GPU,
driver and Triton it was tuned on."""

import dataclasses
import json

import pytest
import torch

from hosttune_engine.kernels import tuning
from hosttune_engine.model.model_config import ModelConfig
from hosttune_engine.plan.gpus import GpuInfo
from hosttune_engine.plan.kinds import Op, Reason
from hosttune_engine.planner.build import PlanInputs, build_plan
from hosttune_engine.planner.prepare import table_and_name, untuned_line
from hosttune_engine.quant.dummy_specs import dummy_spec
from hosttune_engine.server.cli import main
from hosttune_engine.tuner.run import tune_model

from .conftest import HAS_CUDA
from .test_kernel_plan import no_user_tables  # noqa: F401  (a fixture: no tuned tables but the shipped one)

STAND_IN = GpuInfo("cpu standing in for a GPU", (8, 0), present=False)
TINY = {"architectures": ["Qwen2ForCausalLM"], "hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 1,
        "num_attention_heads": 2, "num_key_value_heads": 1, "max_position_embeddings": 1024, "rms_norm_eps": 1e-6,
        "vocab_size": 256, "torch_dtype": "float32"}  # 4-bit groups of 128 need K a multiple of 128


def _inputs(quantization=None) -> PlanInputs:
    spec = dummy_spec(quantization) if quantization else None
    return PlanInputs(ModelConfig.from_dict(TINY), STAND_IN, torch.float32, spec)


def _an_l40s(monkeypatch) -> None:
    """tune's view of the machine: one L40S, a driver and a Triton (no GPU needed to plan and refuse)."""
    from hosttune_engine.tuner import command

    monkeypatch.setattr(command.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(command, "present_gpu", lambda device: GpuInfo("NVIDIA L40S", (8, 9), True))
    monkeypatch.setattr(tuning, "driver_version", lambda: "555.42")
    monkeypatch.setattr(tuning, "triton_version", lambda: "3.4.0")


@pytest.mark.skipif(HAS_CUDA, reason="the tiny run is the CPU's, under the Triton interpreter")
def test_a_bf16_tune_writes_the_entries_its_plan_then_reads(no_user_tables):
    done = tune_model(_inputs(), budget_s=600, tiny=True)
    assert set(done.table) == {"gemv", "decode_attention"} and all(r.best for r in done.sweeps)
    assert [r.cases for r in done.sweeps][0] == ("qkv_proj 256x128", "o_proj 128x128", "gate_up_proj 512x128",
                                                 "down_proj 128x256", "lm_head 256x128")
    tuning.write_cached_table(tuning.TableKey(STAND_IN.name, "555.42", "3.4.0"), done.table, {})
    plan = build_plan(_inputs(), *table_and_name(STAND_IN))
    assert plan.choice(Op.QKV, 1).reason is Reason.TUNED_BUCKET and plan.choice(Op.QKV, 1).args == done.table[
        "gemv"]["float32-m1"]
    assert plan.choice(Op.ATTENTION, 1).reason is Reason.TUNED_BUCKET
    assert "tuned on driver 555.42, Triton 3.4.0" in plan.table


@pytest.mark.skipif(HAS_CUDA, reason="the tiny run is the CPU's, under the Triton interpreter")
def test_a_tune_for_an_e4m3_kv_cache_writes_the_attention_entries_its_plan_then_reads(no_user_tables):
    ada = GpuInfo("cpu standing in for an Ada GPU", (8, 9), present=False)  # e4m3 caches run from 8.9
    inputs = dataclasses.replace(_inputs(), gpu=ada, kv_cache_fp8=True)
    done = tune_model(inputs, budget_s=600, tiny=True)
    assert set(done.table["decode_attention"]) == {"float32-d64-g2-paged16-kv8-le1", "float32-d64-g2-paged16-kv8-le8"}
    assert any("e4m3 cache" in case for r in done.sweeps for case in r.cases) and all(r.best for r in done.sweeps)
    tuning.write_cached_table(tuning.TableKey(ada.name, "555.42", "3.4.0"), done.table, {})
    plan = build_plan(inputs, *table_and_name(ada))
    assert plan.choice(Op.ATTENTION, 1).reason is Reason.TUNED_BUCKET
    assert plan.choice(Op.ATTENTION, 1).args == done.table["decode_attention"]["float32-d64-g2-paged16-kv8-le1"]


@pytest.mark.skipif(HAS_CUDA, reason="the tiny run is the CPU's, under the Triton interpreter")
def test_a_4bit_tune_writes_each_shape_and_the_bucket(no_user_tables):
    done = tune_model(_inputs("awq"), budget_s=600, tiny=True)
    shapes = ("256x128", "128x128", "512x128", "128x256")
    assert set(done.table["int4_gemv"]) == {"float32-le1"} | {f"float32-le1-{s}" for s in shapes}
    assert {f"float32-{b}-{s}" for b in ("le64", "gt128") for s in shapes} <= set(done.table["w4a16_gemm"])
    assert {"float32-le64", "float32-gt128"} <= set(done.table["w4a16_gemm"])  # for shapes a budget leaves out
    assert all(r.best for r in done.sweeps)


def test_a_cached_table_counts_only_on_its_driver_and_triton(no_user_tables, monkeypatch):
    monkeypatch.setattr(tuning, "driver_version", lambda: "555.42")
    monkeypatch.setattr(tuning, "triton_version", lambda: "3.4.0")
    entry = {"gemv": {"bfloat16-m1": {"BLOCK_N": 8}}}
    path = tuning.write_cached_table(tuning.present_key("NVIDIA A100-SXM4-80GB"), entry, {})
    assert path == no_user_tables / "tuned" / "NVIDIA_A100-SXM4-80GB-driver555.42-triton3.4.0.json"
    assert tuning.table_for("NVIDIA A100-SXM4-80GB") == entry
    assert tuning.launch_config("gemv", "bfloat16-m1", torch.device("cpu"), {"BLOCK_N": 4}) == {"BLOCK_N": 4}
    monkeypatch.setattr(tuning, "driver_version", lambda: "560.1")
    tuning.reload_tables()
    assert tuning.table_for("NVIDIA A100-SXM4-80GB") == {} and tuning.table_sources("NVIDIA A100-SXM4-80GB") == []
    assert tuning.table_for("NVIDIA A100-SXM4-80GB", present=False) == entry  # `plan --gpu` shows the last one
    line = untuned_line(GpuInfo("NVIDIA A100-SXM4-80GB", (8, 0), True))
    assert "driver 560.1, Triton 3.4.0" in line and "hosttune-engine tune --model MODEL" in line


def test_a_hopper_gpu_without_a_shipped_table_reads_the_h200s_and_says_whose(no_user_tables, monkeypatch):
    """An H100 plans from the H200's shipped table (the same SMs and tensor cores), named as borrowed; a tune of
    its own overrides it entry by entry; an A100 borrows nothing."""
    h100 = "NVIDIA H100 80GB HBM3"
    assert tuning.shipped_source(h100) == "NVIDIA H200" and tuning.shipped_source("NVIDIA H100 PCIe") == "NVIDIA H200"
    assert tuning.table_for(h100, present=False) == tuning.shipped_table("NVIDIA H200")
    assert tuning.table_sources(h100, present=False) == ["shipped, NVIDIA H200's (same architecture)"]
    assert tuning.table_sources("NVIDIA H200", present=False) == ["shipped"]
    assert tuning.shipped_source("NVIDIA A100-SXM4-80GB") is None
    monkeypatch.setattr(tuning, "driver_version", lambda: "555.42")
    monkeypatch.setattr(tuning, "triton_version", lambda: "3.4.0")
    tuning.write_cached_table(tuning.present_key(h100), {"gemv": {"bfloat16-m1": {"BLOCK_N": 16}}}, {})
    tuning.reload_tables()
    assert tuning.table_for(h100)["gemv"]["bfloat16-m1"] == {"BLOCK_N": 16}
    assert tuning.table_for(h100)["w4a16_gemm"] == tuning.shipped_table("NVIDIA H200")["w4a16_gemm"]
    monkeypatch.setenv(tuning.SHIPPED_ENV, "off")
    assert tuning.shipped_source(h100) is None


def test_the_shipped_table_can_be_left_out_to_measure_a_tune_against_it(no_user_tables, monkeypatch):
    assert tuning.table_for("NVIDIA H200", present=False)["gemv"]
    monkeypatch.setenv(tuning.SHIPPED_ENV, "off")
    tuning.reload_tables()
    assert tuning.table_for("NVIDIA H200", present=False) == {}


@pytest.mark.skipif(HAS_CUDA, reason="on a GPU tune would run")
def test_tune_without_a_gpu_is_one_line_and_exit_2(capsys):
    from .test_kernel_plan import QWEN7B

    with pytest.raises(SystemExit) as exit_:
        main(["tune", "--model", str(QWEN7B), "--budget-s", "10"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.count("\n") == 1 and "has none: run it on the GPU host" in err


@pytest.mark.parametrize("budget", ["nan", "inf", "0"])
def test_tune_refuses_a_budget_that_is_not_a_positive_number_of_seconds(tmp_path, capsys, budget):
    with pytest.raises(SystemExit) as exit_:
        main(["tune", "--model", str(tmp_path), "--budget-s", budget])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.count("\n") == 1 and "--budget-s" in err and "give seconds (> 0)" in err


def test_tune_if_missing_leaves_a_table_already_tuned_for_these_weights(no_user_tables, monkeypatch, capsys):
    from .test_kernel_plan import QWEN7B

    _an_l40s(monkeypatch)
    tuning.write_cached_table(tuning.present_key("NVIDIA L40S"), {"gemv": {}}, {"tuned_for": ["bf16"]})
    main(["tune", "--model", str(QWEN7B), "--if-missing"])
    assert "NVIDIA L40S has a table tuned for bf16 weights on this driver and Triton" in capsys.readouterr().out


@pytest.mark.skipif(HAS_CUDA, reason="on a GPU tune would run")
@pytest.mark.parametrize("args, message", [(["--model", "/nonexistent"], "/nonexistent has no config.json"),
                                           (["--quantization", "int3"], "quantization must be one of"),
                                           (["--quantization", ""], "quantization must be one of fp8, "
                                                                    "fp8-block, fp8-channel, fp8-tensor, awq, gptq; "
                                                                    "got ''")])
def test_tune_names_a_bad_model_or_quantization_before_it_looks_for_a_gpu(capsys, args, message):
    from .test_kernel_plan import QWEN7B

    with pytest.raises(SystemExit) as exit_:
        main(["tune", "--model", str(QWEN7B), "--budget-s", "10", *args])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.count("\n") == 1 and message in err


def test_tune_refuses_what_the_gpu_cannot_run_before_it_sweeps(no_user_tables, monkeypatch, capsys):
    """FP8 weights on a V100 (before Ampere): the one line plan and serve give, before a budget is spent on configs
    that cannot compile there."""
    from hosttune_engine.tuner import command

    from .test_kernel_plan import QWEN7B

    swept = []
    monkeypatch.setattr(command.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(command, "present_gpu", lambda device: GpuInfo("Tesla V100-SXM2-32GB", (7, 0), True))
    monkeypatch.setattr(command, "tune_model", lambda inputs, budget: swept.append(inputs))
    with pytest.raises(SystemExit) as exit_:
        main(["tune", "--model", str(QWEN7B), "--quantization", "fp8", "--dtype", "float16", "--budget-s", "10"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.count("\n") == 1 and "cannot run FP8 weights" in err and not swept


def test_tune_refuses_a_cache_it_could_not_write_before_it_sweeps(no_user_tables, monkeypatch, capsys):
    """The table is written after the whole budget: a cache folder that cannot hold it is refused first."""
    from hosttune_engine.tuner import command

    from .test_kernel_plan import QWEN7B

    swept = []
    (no_user_tables.parent / "a-file").write_text("")
    cache = no_user_tables.parent / "a-file" / "cache"  # a folder under a file: not even root can make it
    monkeypatch.setenv(tuning.CACHE_ENV, str(cache))
    _an_l40s(monkeypatch)
    monkeypatch.setattr(command, "tune_model", lambda inputs, budget: swept.append(inputs))
    with pytest.raises(SystemExit) as exit_:
        main(["tune", "--model", str(QWEN7B), "--budget-s", "10"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and not swept
    assert err == (f"hosttune-engine: error: {cache / 'tuned'}: cannot write the tuned table there (Not a directory); "
                   f"set ${tuning.CACHE_ENV} to a folder this user can write\n")


def test_tune_refuses_a_malformed_cached_table_before_it_sweeps(no_user_tables, monkeypatch, capsys):
    """The table plan and serve refuse is refused by tune too, not merged as empty and overwritten after the budget."""
    from hosttune_engine.tuner import command

    from .test_kernel_plan import QWEN7B

    swept = []
    _an_l40s(monkeypatch)
    monkeypatch.setattr(command, "tune_model", lambda inputs, budget: swept.append(inputs))
    path = tuning.cache_path(tuning.present_key("NVIDIA L40S"))
    path.parent.mkdir(parents=True)
    path.write_text("{bad")
    with pytest.raises(SystemExit) as exit_:
        main(["tune", "--model", str(QWEN7B), "--budget-s", "10"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.count("\n") == 1 and not swept
    assert f"{path} (a tuned table) is not JSON" in err and "fix it or remove it" in err
    assert path.read_text() == "{bad"


def test_tune_times_the_activations_serve_would_run(no_user_tables, monkeypatch, tmp_path, capsys):
    """A float16 checkpoint is served in float16: tune times its kernels in float16, not bfloat16."""
    from hosttune_engine.tuner import command
    from hosttune_engine.tuner.run import Tuning

    from .test_kernel_plan import _float16_model

    seen = []
    _an_l40s(monkeypatch)
    monkeypatch.setattr(command, "tune_model", lambda inputs, budget: seen.append(inputs) or Tuning(inputs, None, None))
    main(["tune", "--model", str(_float16_model(tmp_path)), "--budget-s", "1"])
    main(["tune", "--model", str(_float16_model(tmp_path)), "--budget-s", "1", "--dtype", "bfloat16"])
    assert [inputs.dtype for inputs in seen] == [torch.float16, torch.bfloat16]
    capsys.readouterr()
    main(["tune", "--model", str(_float16_model(tmp_path)), "--if-missing"])
    assert "has a table tuned for bf16 weights, float16 activations on this driver" in capsys.readouterr().out
    assert len(seen) == 2


def test_tune_times_the_kv_block_size_serve_is_given(no_user_tables, monkeypatch, capsys):
    """Decode attention's entries are keyed by the KV block size: `serve --block-size 32` reads none tuned at 16."""
    from hosttune_engine.tuner import command
    from hosttune_engine.tuner.run import Tuning

    from .test_kernel_plan import QWEN7B

    seen = []
    _an_l40s(monkeypatch)
    monkeypatch.setattr(command, "tune_model", lambda inputs, budget: seen.append(inputs) or Tuning(inputs, None, None))
    main(["tune", "--model", str(QWEN7B), "--budget-s", "1", "--block-size", "32"])
    assert [inputs.block_size for inputs in seen] == [32]
    capsys.readouterr()
    main(["tune", "--model", str(QWEN7B), "--block-size", "32", "--if-missing"])
    assert "has a table tuned for bf16 weights, KV blocks of 32 on this driver" in capsys.readouterr().out
    main(["tune", "--model", str(QWEN7B), "--budget-s", "1", "--if-missing"])  # blocks of 16 are not tuned yet
    assert [inputs.block_size for inputs in seen] == [32, 16]
    with pytest.raises(SystemExit) as exit_:
        main(["tune", "--model", str(QWEN7B), "--block-size", "24"])
    assert exit_.value.code == 2 and "block_size must be a power of two, got 24" in capsys.readouterr().err


def test_tune_times_the_kv_cache_dtype_serve_is_given(no_user_tables, monkeypatch, capsys):
    """An e4m3 cache's decode attention has entries of its own: `serve --kv-cache-dtype fp8` reads none of bf16's."""
    from hosttune_engine.tuner import command
    from hosttune_engine.tuner.run import Tuning

    from .test_kernel_plan import QWEN7B

    seen = []
    _an_l40s(monkeypatch)
    monkeypatch.setattr(command, "tune_model", lambda inputs, budget: seen.append(inputs) or Tuning(inputs, None, None))
    main(["tune", "--model", str(QWEN7B), "--budget-s", "1", "--kv-cache-dtype", "fp8"])
    assert [inputs.kv_cache_fp8 for inputs in seen] == [True]
    capsys.readouterr()
    main(["tune", "--model", str(QWEN7B), "--kv-cache-dtype", "fp8", "--if-missing"])
    assert "has a table tuned for bf16 weights, an e4m3 KV cache on this driver" in capsys.readouterr().out
    main(["tune", "--model", str(QWEN7B), "--budget-s", "1", "--if-missing"])  # a bf16 cache is not tuned yet
    assert [inputs.kv_cache_fp8 for inputs in seen] == [True, False]


def test_the_4bit_gemm_sweep_at_decode_rows_tries_the_nibble_kernel_and_dequantize_then_cublas():
    from hosttune_engine.kernels.dequant_gemm import DEFAULT
    from hosttune_engine.tuner.candidates import candidates, tiny_candidates

    at_64, seeds = candidates("w4a16_gemm", DEFAULT, rows=64)
    nibbles = [c for c in at_64[seeds:] if c.get("NIBBLES")]  # the grid's, after the shipped table's winners
    assert {c["BLOCK_M"] for c in nibbles} == {64} and {c["SWAP"] for c in nibbles} == {0, 1}
    assert {"DEQUANT": 1} in at_64 and any("NIBBLES" not in c and "DEQUANT" not in c for c in at_64)
    at_8 = [c for c in candidates("w4a16_gemm", DEFAULT, rows=8)[0][seeds:] if c.get("NIBBLES") and c not in at_64]
    assert at_8 and {c["BLOCK_M"] for c in at_8} == {16} and {c["SWAP"] for c in at_8} == {1}
    assert not any(c.get("NIBBLES") for c in candidates("w8a16_gemm", DEFAULT, rows=64)[0])
    assert not any(c.get("NIBBLES") and c["BLOCK_M"] == 128 for c in candidates("w4a16_gemm", DEFAULT, rows=4096)[0])
    assert any(c.get("NIBBLES") for c in tiny_candidates(at_64))  # the CPU tune can draw one


def test_the_4bit_gemm_sweep_tries_the_hopper_kernel_only_where_it_runs(monkeypatch):
    from hosttune_engine.kernels.dequant_gemm import DEFAULT
    from hosttune_engine.tuner import candidates as cands

    monkeypatch.setattr(cands, "_hopper_gemm_runs", lambda: False)
    assert not any(c.get("WGMMA") for c in cands.candidates("w4a16_gemm", DEFAULT, rows=64)[0][1:])
    monkeypatch.setattr(cands, "_hopper_gemm_runs", lambda: True)
    at_64, seeds = cands.candidates("w4a16_gemm", DEFAULT, rows=64)
    wgmma = [c for c in at_64[seeds:] if c.get("WGMMA")]  # the grid: the shipped seeds hold other buckets' rows
    assert {c["BLOCK_M"] for c in wgmma} == {64} and {c["num_warps"] for c in wgmma} == {4, 8}
    assert any(c.get("WGMMA") for c in at_64[:seeds])
    at_256, seeds = cands.candidates("w4a16_gemm", DEFAULT, rows=256)
    assert {c["BLOCK_M"] for c in at_256[seeds:] if c.get("WGMMA")} == {128, 256}  # x tiles of 128 rows, and of all 256
    assert not any(c.get("WGMMA") for c in cands.candidates("w4a16_gemm", DEFAULT, rows=4096)[0])
    assert not any(c.get("WGMMA") for c in cands.candidates("w8a16_gemm", DEFAULT, rows=64)[0])
    assert not any(c.get("WGMMA") for c in cands.tiny_candidates(at_64))  # CUDA only: never on the CPU tune


def test_the_tune_report_writes_each_winner_as_the_plan_prints_configs():
    """`tune` and `plan` print a launch config the same way (BLOCK_N=8 ..., the tables' keys), so a winner reads
    as the plan that will run it; a sweep none of whose candidates ran says why, in one line."""
    from hosttune_engine.tuner.command import report
    from hosttune_engine.tuner.run import Tuning
    from hosttune_engine.tuner.sweep import SweepResult, Tried

    done = Tuning(None, None, None)
    done.sweeps = [SweepResult("gemv", ("qkv_proj 192x128",), (Tried({"num_warps": 4, "BLOCK_N": 8}, 0.0094),), 0),
                   SweepResult("decode_attention", ("b1",), (Tried({"BLOCK_N": 64}, None, "out of\nresources"),), 2)]
    done.table = {"gemv": {"bfloat16-m1": {"BLOCK_N": 8, "num_warps": 4}}}
    lines = report(done, 12.3, "/c/t.json").splitlines()
    assert lines[0].endswith("9.4 us  BLOCK_N=8 num_warps=4")
    assert lines[1].endswith("no candidate ran: out of resources") and len(lines) == 3
    assert lines[2] == "1 entry tuned in 12 s; table /c/t.json"
    done.table["gemv"]["bfloat16-m2"] = {"BLOCK_N": 16, "num_warps": 4}
    assert report(done, 12.3, "/c/t.json").splitlines()[2] == "2 entries tuned in 12 s; table /c/t.json"


def test_the_fp8_gemv_sweep_drops_packed_configs_where_e4m3_is_decoded_by_bits(monkeypatch):
    """Before compute capability 8.9 every FP8 GEMV decodes its weights by integer operations, which PACKED's
    inline PTX cannot (it converts e4m3 natively), so a PACKED config runs as the same config without it: the
    sweep tries each launch once, not twice under two names."""
    from hosttune_engine.kernels.fp8_gemv import DEFAULT
    from hosttune_engine.tuner import candidates as cands

    native, seeds = cands.candidates("fp8_gemv", DEFAULT)
    assert any(c.get("PACKED") for c in native)
    monkeypatch.setattr(cands, "_e4m3_native", lambda: False)
    bits, seeds = cands.candidates("fp8_gemv", DEFAULT)
    assert bits and not any(c.get("PACKED") for c in bits)
    assert len({json.dumps(c, sort_keys=True) for c in bits}) == len(bits)
    assert {json.dumps(c, sort_keys=True) for c in bits} == {
        json.dumps({k: v for k, v in c.items() if k != "PACKED"}, sort_keys=True) for c in native}
