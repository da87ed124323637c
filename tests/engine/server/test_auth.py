"""API keys: no key, a wrong key and a right key (401, 401, 200) on every protected route, streamed and
not; /health and /metrics stay open unless protected; the `openai` client with `api_key`; no key in the logs."""

import asyncio
import json
import urllib.request

import pytest
from aiohttp.test_utils import TestClient, TestServer

from hosttune_engine.config import EngineConfig
from hosttune_engine.errors import ConfigError
from hosttune_engine.server.app import build_app
from hosttune_engine.server.auth import KeyRing, load_keys
from hosttune_engine.server.config import ServerConfig
from hosttune_engine.server.state import ServerState

from .harness import ServerProcess, post

openai = pytest.importorskip("openai")

FILE_KEY = "ht-file-key-0123456789abcdef"
ENV_KEY = "ht-env-key-fedcba9876543210"
WRONG = "ht-wrong-key-000000000000000"


@pytest.fixture(scope="module")
def keyed(tiny_qwen2, tmp_path_factory):
    folder = tmp_path_factory.mktemp("keyed-server")
    key_file = folder / "keys"
    key_file.write_text(f"# the group's key\n{FILE_KEY}\n")
    proc = ServerProcess(tiny_qwen2, folder, ["--api-key-file", str(key_file), "--log-level", "debug",
                                             "--max-batch-size", "4"],
                         env={"HOSTTUNE_ENGINE_API_KEY": ENV_KEY})
    proc.wait_ready()
    yield proc
    proc.terminate()


def _get(url: str, headers: dict) -> tuple[int, dict, bytes]:
    req = urllib.request.Request(url, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


ROUTES = [
    ("/v1/completions", {"prompt": "Hello", "max_tokens": 2}),
    ("/v1/completions", {"prompt": "Hello", "max_tokens": 2, "stream": True}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "stream": True}),
    ("/tokenize", {"prompt": "Hello"}),
    ("/detokenize", {"tokens": [1, 2]}),
    ("/v1/models", None),
]


def _call(url: str, path: str, body, headers: dict) -> tuple[int, dict, bytes]:
    if body is None:
        return _get(url + path, headers)
    return post(url + path, body, headers=headers)


@pytest.mark.parametrize("path,body", ROUTES, ids=[f"{p}{'-stream' if b and b.get('stream') else ''}" for p, b in ROUTES])
def test_no_key_wrong_key_right_key(keyed, path, body):
    statuses = []
    for headers in ({}, {"Authorization": f"Bearer {WRONG}"}, {"Authorization": f"Bearer {FILE_KEY}"},
                    {"Authorization": f"bearer {ENV_KEY}"}):
        status, response_headers, raw = _call(keyed.url, path, body, headers)
        statuses.append(status)
        if status == 401:
            error = json.loads(raw)["error"]
            assert error["type"] == "AuthenticationError" and error["code"] == 401
            assert "Authorization: Bearer" in error["message"] and response_headers["WWW-Authenticate"] == "Bearer"
        elif body and body.get("stream"):
            assert raw.rstrip().endswith(b"data: [DONE]")
    assert statuses == [401, 401, 200, 200]


def test_a_key_in_another_scheme_or_a_prefix_of_a_key_is_refused(keyed):
    for value in (f"Basic {FILE_KEY}", FILE_KEY, f"Bearer {FILE_KEY[:-1]}", f"Bearer {FILE_KEY}x", "Bearer "):
        assert _get(keyed.url + "/v1/models", {"Authorization": value})[0] == 401, value


def test_health_and_metrics_stay_open(keyed):
    assert _get(keyed.url + "/health", {})[0] == 200
    assert _get(keyed.url + "/metrics", {})[0] == 200


def test_openai_client_with_api_key(keyed):
    client = openai.OpenAI(base_url=keyed.url + "/v1", api_key=FILE_KEY, max_retries=0, timeout=60)
    model = client.models.list().data[0].id
    out = client.completions.create(model=model, prompt="Hello", max_tokens=3, temperature=0)
    assert out.usage.completion_tokens == 3
    chunks = list(client.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}],
                                                 max_tokens=3, stream=True))
    assert chunks[-1].choices[0].finish_reason in ("length", "stop")
    wrong = openai.OpenAI(base_url=keyed.url + "/v1", api_key=WRONG, max_retries=0, timeout=60)
    with pytest.raises(openai.AuthenticationError):
        wrong.completions.create(model=model, prompt="Hello", max_tokens=3)


def test_no_key_reaches_the_log(keyed):
    for key in (FILE_KEY, WRONG):
        post(keyed.url + "/v1/completions", {"prompt": "Hello", "max_tokens": 2},
             headers={"Authorization": f"Bearer {key}"})
    log = keyed.log()
    assert "status=200" in log  # the requests were logged, at debug level
    for key in (FILE_KEY, ENV_KEY, WRONG):
        assert key not in log


# -- in-process: the app without an engine --------------------------------------------------------
async def _probe_statuses(config: ServerConfig, headers: dict) -> list[int]:
    async with TestClient(TestServer(build_app(ServerState(config)))) as client:
        return [(await client.get(path, headers=headers)).status for path in ("/health", "/metrics", "/version")]


def test_protect_probes_puts_health_and_metrics_behind_the_key():
    config = ServerConfig(EngineConfig(model="m"), api_keys=(FILE_KEY,), protect_probes=True)
    assert asyncio.run(_probe_statuses(config, {})) == [401, 401, 200]
    # with the key, /health says 503: there is no engine here, the server is still "starting"
    assert asyncio.run(_probe_statuses(config, {"Authorization": f"Bearer {FILE_KEY}"})) == [503, 200, 200]


def test_keys_are_not_in_the_config_repr():
    assert FILE_KEY not in repr(ServerConfig(EngineConfig(model="m"), api_keys=(FILE_KEY,)))
    assert FILE_KEY not in repr(KeyRing((FILE_KEY.encode(),)))


def test_load_keys_from_flags_files_and_environment(tmp_path):
    path = tmp_path / "keys"
    path.write_text("\n# comment\nkey-from-file-1\nkey-from-file-2\n")
    keys = load_keys(["key-from-flag"], [str(path)], {"HOSTTUNE_ENGINE_API_KEY": "key-from-env-1, key-from-env-2"})
    assert keys == ("key-from-flag", "key-from-file-1", "key-from-file-2", "key-from-env-1", "key-from-env-2")
    with pytest.raises(ConfigError, match="cannot read the API key file"):
        load_keys([], [str(tmp_path / "missing")], {})
    (tmp_path / "empty").write_text("# nothing\n")
    with pytest.raises(ConfigError, match="holds no key"):
        load_keys([], [str(tmp_path / "empty")], {})
    with pytest.raises(ConfigError, match="an API key from --api-key is shorter than 8 characters"):
        load_keys(["short"], [], {})
    (tmp_path / "short").write_text("long-enough-key\nshort\n")
    with pytest.raises(ConfigError, match=f"from the API key file {tmp_path / 'short'} line 2 is shorter than 8 "):
        load_keys([], [str(tmp_path / "short")], {})
    with pytest.raises(ConfigError, match="from \\$HOSTTUNE_ENGINE_API_KEY is shorter than 8"):
        load_keys([], [], {"HOSTTUNE_ENGINE_API_KEY": "long-enough-key,abc"})


def test_a_key_file_that_is_not_utf8_is_one_error_naming_it_and_its_line(tmp_path, capsys):
    from hosttune_engine.server.cli import main

    path = tmp_path / "keys"
    path.write_bytes(b"# keys\nlong-enough-key\n\xff\xfe-key\n")
    with pytest.raises(SystemExit) as exit_:
        main(["serve", "--model", str(tmp_path), "--api-key-file", str(path)])
    assert exit_.value.code == 2
    assert capsys.readouterr().err == (f"hosttune-engine: error: the API key file {path} line 3 is not UTF-8 text; "
                                       "write each key as text, one a line\n")


def test_protect_probes_without_a_key_is_a_config_error():
    with pytest.raises(ConfigError, match="needs an API key"):
        ServerConfig(EngineConfig(model="m"), protect_probes=True)


def test_an_environment_key_of_only_commas_or_spaces_is_refused_not_served_open():
    """A set variable that holds no key (a template left empty between commas) would serve with no key checked;
    an empty one reads as unset, as vLLM's VLLM_API_KEY does."""
    for value in (",", " , ", "  "):
        with pytest.raises(ConfigError, match="\\$HOSTTUNE_ENGINE_API_KEY holds no key"):
            load_keys([], [], {"HOSTTUNE_ENGINE_API_KEY": value})
    assert load_keys([], [], {"HOSTTUNE_ENGINE_API_KEY": ""}) == ()
    assert load_keys([], [], {"HOSTTUNE_ENGINE_API_KEY": "long-enough-key,"}) == ("long-enough-key",)
