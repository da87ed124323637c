import asyncio

import pytest

from hosttune.bench import prompts
from hosttune.bench.prompts import FALLBACK_WORDS, WORDS, PromptBuilder, calibrate
from hosttune.errors import BenchError

from .servers import loopback_http


def counter_of(tokens_of_word, num_specials=1):
    """A tokenizer that splits on spaces and gives each word a fixed token count."""
    async def count(text):
        return num_specials + sum(tokens_of_word(w) for w in text.split())
    return count


def test_calibration_finds_specials_and_drops_multi_token_words():
    split = {"music", "people", "between"}
    count = counter_of(lambda w: 2 if w in split else 1, num_specials=2)
    calibration = asyncio.run(calibrate(count, "fake"))
    assert calibration.num_specials == 2 and calibration.is_exact
    assert not split & set(calibration.words)
    assert len(calibration.words) == len(set(WORDS)) + len(FALLBACK_WORDS) - len(split)


@pytest.mark.parametrize("length", [1, 2, 3, 50, 777, 4000])
def test_built_prompts_count_exactly(length):
    count = counter_of(lambda w: 2 if w == "music" else 1)
    calibration = asyncio.run(calibrate(count, "fake"))
    builder = PromptBuilder(calibration, max_tokens=4000, seed=3)
    for _ in range(5):
        assert asyncio.run(count(builder.build(length))) == max(length, 2)


def test_a_small_vocabulary_falls_back_to_letters():
    """Like the engine's tiny test tokenizer: few whole words, most letters, no BOS, and
    an empty prompt refused."""
    keep = {"in", "is", "on", "a", "b", "c", "d"}

    async def count(text):
        if not text:
            raise BenchError("HTTP 400")
        return sum(1 if w in keep else 2 for w in text.split())
    calibration = asyncio.run(calibrate(count, "tiny"))
    assert calibration.num_specials == 0 and set(calibration.words) == keep
    builder = PromptBuilder(calibration, 500, 0)
    assert [asyncio.run(count(builder.build(n))) for n in (1, 7, 500)] == [1, 7, 500]


def test_prompts_do_not_share_prefixes():
    calibration = prompts.approximate_calibration()
    builder = PromptBuilder(calibration, max_tokens=2000, seed=0)
    built = [builder.build(1000) for _ in range(50)]
    assert len({p[:40] for p in built}) == 50


def test_check_catches_a_tokenizer_that_merges_across_words():
    async def merging(text):  # pairs of words become one token
        return 1 + (len(text.split()) + 1) // 2
    calibration = prompts.Calibration(tuple(set(WORDS)), 1, "merging", True)
    builder = PromptBuilder(calibration, 100, 0)
    with pytest.raises(BenchError, match="does not suit"):
        asyncio.run(prompts.check(builder, merging, [10]))


def test_local_tokenizer_file(tmp_path):
    tokenizers = pytest.importorskip("tokenizers")
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    vocab = {"<s>": 0, "[UNK]": 1}
    for word in WORDS:
        vocab.setdefault(word, len(vocab))
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.post_processor = processors.TemplateProcessing(
        single="<s> $A", special_tokens=[("<s>", 0)])
    path = tmp_path / "tokenizer.json"
    tokenizer.save(str(path))

    count = prompts.local_counter(tmp_path)  # a model folder works as well as the file
    calibration = asyncio.run(calibrate(count, "local"))
    assert calibration.num_specials == 1
    builder = PromptBuilder(calibration, 3000, 1)
    assert asyncio.run(count(builder.build(3000))) == 3000
    assert len(tokenizer.encode(builder.build(123)).ids) == 123


def test_missing_tokenizer_file():
    with pytest.raises(BenchError, match="does not exist"):
        prompts.local_counter(__import__("pathlib").Path("/nonexistent/tokenizer.json"))


def test_a_file_that_is_not_a_tokenizer_is_a_user_error(tmp_path):
    pytest.importorskip("tokenizers")
    (tmp_path / "tokenizer.json").write_text('{"x":')
    with pytest.raises(BenchError, match=r"^--tokenizer .*tokenizer.json: not a tokenizer.json \("):
        prompts.local_counter(tmp_path)


@pytest.mark.parametrize("body", [b'[{"id": 1}]', b'"x"', b'{"count": null}', b'{"count": 1e400}',
                                  b'{"count": true}', b'{"tokens": 5}', b'{}'])
def test_a_tokenize_route_that_gives_no_token_count_is_no_tokenize(body):
    """Another server's /tokenize (a list of token objects, say) leaves prompt lengths approximate, as none does:
    reading its answer as a count must not end the run in a TypeError."""
    from hosttune.bench.client import session
    from hosttune.bench.prompts import has_tokenize

    async def probe(url):
        async with session(5.0) as client:
            return await has_tokenize(client, url)

    with loopback_http(lambda method, path, _: (200, body)) as url:
        assert asyncio.run(probe(url)) is False
