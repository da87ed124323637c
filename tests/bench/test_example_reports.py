"""docs/bench-example's single-run reports are what the current report code makes of their recorded timings."""

import pytest

from benchmarks.bench_example_report import kept_results, rendered


@pytest.mark.parametrize("folder", kept_results(), ids=lambda folder: folder.name)
def test_an_example_report_is_the_current_report_of_its_recorded_timings(folder):
    assert (folder / "report.md").read_text() == rendered(folder), (
        f"{folder}/report.md is out of date: python benchmarks/bench_example_report.py --from-results")
