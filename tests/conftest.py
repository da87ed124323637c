import os
from pathlib import Path

import pytest

FIXTURES = Path(__file__).parent / "fixtures"

# Under pytest-xdist the workers share the machine's cores. Each torch process otherwise starts one OpenMP
# thread per core, and threads that outnumber the cores spin waiting for each other: on 2 cores with 2
# workers a CPU decode step took 5x longer than with one thread each. Set before any test imports torch;
# the engine and bench servers the tests start inherit it.
if os.environ.get("PYTEST_XDIST_WORKER_COUNT"):
    _share = max(1, (os.cpu_count() or 1) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"]))
    os.environ.setdefault("OMP_NUM_THREADS", str(_share))


@pytest.fixture
def fixture_text():
    def read(*parts: str) -> str:
        return FIXTURES.joinpath(*parts).read_text(encoding="utf-8")

    return read
