"""Tuned launch configs: lookup by device and shape key, the user table over the shipped one,
persisted so a restart reads instead of re-tuning; `tune` keeps the fastest config that runs."""

import json

import pytest
import torch

from hosttune_engine.kernels import tuning
from hosttune_engine.kernels.decode_attention import config_key as decode_key
from hosttune_engine.kernels.prefill_attention import config_key as prefill_key


@pytest.fixture
def user_table(tmp_path, monkeypatch):
    path = tmp_path / "configs.json"
    monkeypatch.setenv(tuning.USER_ENV, str(path))
    tuning.reload_tables()
    yield path
    tuning.reload_tables()


def test_defaults_without_a_table(user_table):
    default = {"BLOCK_N": 32, "num_warps": 4}
    assert tuning.launch_config("decode_attention", "k", torch.device("cpu"), default) == default


def test_saved_config_is_found_after_a_reload(user_table):
    tuning.save_config("prefill_attention", "key1", "cpu", {"BLOCK_M": 64}, user_table)
    assert json.loads(user_table.read_text()) == {"cpu": {"prefill_attention": {"key1": {"BLOCK_M": 64}}}}
    tuning.reload_tables()  # as a restarted process would
    got = tuning.launch_config("prefill_attention", "key1", torch.device("cpu"), {"BLOCK_M": 32, "BLOCK_N": 16})
    assert got == {"BLOCK_M": 64, "BLOCK_N": 16}
    assert tuning.launch_config("prefill_attention", "other", torch.device("cpu"), {"BLOCK_M": 32}) == {"BLOCK_M": 32}


def test_tune_keeps_the_fastest_config_that_runs(capsys):
    times = {1: 3.0, 2: 1.0, 3: None}

    def time_one(cfg):
        if times[cfg["x"]] is None:
            raise RuntimeError("out of shared memory")
        return times[cfg["x"]]

    best, results = tuning.tune([{"x": 1}, {"x": 2}, {"x": 3}], time_one)
    assert best == {"x": 2} and results[2][1] == float("inf") and "failed" in capsys.readouterr().out


def test_buckets_and_keys():
    assert [tuning.length_bucket(n) for n in (512, 1024, 3071, 8192)] == ["lt1k", "1k-3k", "1k-3k", "ge3k"]
    assert [tuning.batch_bucket(n) for n in (1, 2, 32, 64, 65, 256)] == ["le1", "le8", "le32", "le64", "le128", "gt128"]
    assert prefill_key(torch.bfloat16, 128, 7, 16, True, 4096) == "bfloat16-d128-g7-contig-ge3k"
    assert decode_key(torch.bfloat16, 128, 7, 16, 128) == "bfloat16-d128-g7-paged16-le128"


def test_shipped_table_is_valid_json():
    assert isinstance(json.loads(tuning.SHIPPED.read_text()), dict)
