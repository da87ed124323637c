import json
import random
import statistics

import pytest

from hosttune.bench.distributions import (Fixed, Mixture, Normal, Replay, Uniform,
                                          parse_distribution)
from hosttune.errors import BenchError


def draws(spec, n=20000, seed=1):
    dist = parse_distribution(spec)
    rng = random.Random(seed)
    return [dist.sample(rng, i) for i in range(n)]


def test_fixed_forms():
    assert parse_distribution("512") == Fixed(512)
    assert parse_distribution("fixed:7") == Fixed(7)
    assert set(draws("fixed:7", 100)) == {7}


def test_uniform_covers_its_range_and_nothing_else():
    values = draws("uniform:32-40")
    assert parse_distribution("uniform:32-40") == Uniform(32, 40)
    assert set(values) == set(range(32, 41))


def test_normal_has_the_asked_mean_and_sigma_and_is_clipped():
    values = draws("normal:4200,1200,300-6800")
    assert parse_distribution("normal:4200,1200,300-6800") == Normal(4200, 1200, 300, 6800)
    assert min(values) >= 300 and max(values) <= 6800
    assert statistics.mean(values) == pytest.approx(4200, abs=40)
    # Clipping at +-2.2 sigma trims the spread a little below 1200.
    assert 1100 < statistics.pstdev(values) < 1200


def test_normal_default_clip_is_one_to_twice_the_mean():
    assert parse_distribution("normal:100,80") == Normal(100, 80, 1, 200)
    assert min(draws("normal:100,80")) >= 1


def test_chat_docs_mix_is_the_seed_workload():
    dist = parse_distribution("chat-docs")
    assert isinstance(dist, Mixture)
    values = draws("chat-docs")
    chat = [v for v in values if v <= 512]
    # Documents (mean 4200, sigma 1200) fall under 512 about once in a thousand.
    assert len(chat) / len(values) == pytest.approx(0.3, abs=0.02)
    assert min(values) >= 32 and max(values) <= 6800
    assert dist.high == 6800


def test_mixture_weights():
    values = draws("mix:1*fixed:10+3*fixed:20", 8000)
    assert values.count(10) / len(values) == pytest.approx(0.25, abs=0.02)


def test_jsonl_replays_in_file_order(tmp_path):
    path = tmp_path / "lengths.jsonl"
    path.write_text("\n".join(json.dumps({"prompt_tokens": n, "output_tokens": n * 2})
                              for n in (5, 9, 3)) + "\n")
    prompts = parse_distribution(f"jsonl:{path}")
    outputs = parse_distribution(f"jsonl:{path}", jsonl_field="output_tokens")
    rng = random.Random(0)
    assert isinstance(prompts, Replay)
    assert [prompts.sample(rng, i) for i in range(5)] == [5, 9, 3, 5, 9]
    assert [outputs.sample(rng, i) for i in range(3)] == [10, 18, 6]
    assert parse_distribution(f"jsonl:{path}:output_tokens").high == 18


@pytest.mark.parametrize("spec, message", [
    ("uniform:50-10", "empty"),
    ("normal:abc,1", "numbers"),
    ("bogus:1", "unknown length distribution"),
    ("0", "positive integer"),
    ("fixed:0", "positive integer"),
    ("mix:0.5uniform:1-2", r"WEIGHT\*DIST"),
    ("jsonl:/nonexistent.jsonl", "does not exist"),
    ("100000000", "100000000 tokens is past the 10000000 bench builds"),  # not gigabytes of prompt in memory
    ("uniform:1-99999999999", "past the 10000000 bench builds"),
    ("normal:inf,1", "need 1 <= mean <= 10000000"),
    ("normal:nan,1", "need 1 <= mean <= 10000000"),
    ("normal:5,1e9", "0 <= sigma <= 10000000"),
    ("mix:nan*8", r"mixture term 'nan\*8': write it as WEIGHT\*DIST"),  # not numpy's error on the weights
    ("mix:inf*8+1*4", r"mixture term 'inf\*8'"),
])
def test_bad_specs_say_what_to_fix(spec, message):
    with pytest.raises(BenchError, match=message):
        parse_distribution(spec)


def test_jsonl_bad_line_names_file_and_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"prompt_tokens": 4}\n{"prompt_tokens": "x"}\n')
    with pytest.raises(BenchError, match=r"bad.jsonl:2"):
        parse_distribution(f"jsonl:{path}")
