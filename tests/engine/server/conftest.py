"""Server test setup: the tiny Qwen2 model served by a real `python -m hosttune_engine serve` process.

All traffic goes to 127.0.0.1; every wait is bounded.
"""

import pytest

from .harness import ServerProcess


@pytest.fixture(scope="session")
def tiny_qwen2(tiny_models):
    return tiny_models["qwen2"]


@pytest.fixture(scope="session")
def server(tiny_qwen2, tmp_path_factory):
    """One server for the tests that do not stop it: --max-batch-size 4 --max-queue 4, on CPU."""
    proc = ServerProcess(tiny_qwen2, tmp_path_factory.mktemp("server-log"),
                         ["--max-batch-size", "4", "--max-queue", "4"])
    proc.wait_ready()
    yield proc
    proc.terminate()


@pytest.fixture(scope="module")
def client(server):
    """The official `openai` client on the shared server (the test skips where the package is missing)."""
    openai = pytest.importorskip("openai")
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def model(client):
    """The name the shared server serves, as /v1/models lists it."""
    return client.models.list().data[0].id
