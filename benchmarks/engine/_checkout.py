"""A benchmark run as a file (`python benchmarks/engine/run_all.py`) imports `benchmarks`, `hosttune` and
`hosttune_engine` from this checkout, whether or not they are installed; imported as a module (the tests,
`python -m benchmarks.engine.run_all`) it needs none of this."""

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO), str(REPO / "engine")]
