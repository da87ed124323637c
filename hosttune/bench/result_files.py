"""The files `hosttune bench --out` writes, by name. A folder holds one run's results: once a run has
written its files, the result files an earlier run left there that this run did not write are removed,
so no file in the folder comes from another run. Files of other names are never touched."""

from __future__ import annotations

from pathlib import Path

from hosttune.bench.plot import CDF_FILE, SWEEP_FILE, TIMELINE_FILE
from hosttune.bench.report_csv import REQUESTS_FILE, SERVER_FILE, SUMMARY_FILE

RESULTS_FILE = "results.json"
REPORT_FILE = "report.md"
NAMES = (RESULTS_FILE, REPORT_FILE, REQUESTS_FILE, SUMMARY_FILE, SERVER_FILE, CDF_FILE, TIMELINE_FILE, SWEEP_FILE)


def remove_earlier(folder: Path, written: list[str]) -> list[str]:
    """Remove the result files in folder that this run did not write; return their names."""
    earlier = [name for name in NAMES if name not in written and (folder / name).is_file()]
    for name in earlier:
        (folder / name).unlink()
    return earlier
