"""docs/bench-example's reports are what the current report code makes of their recorded timings (a sweep's: of its
steps' summaries)."""

import pytest

from benchmarks.bench_example_report import OUT, kept_results, kept_steps, rendered, rendered_sweep


@pytest.mark.parametrize("folder", kept_results(), ids=lambda folder: folder.name)
def test_an_example_report_is_the_current_report_of_its_recorded_timings(folder):
    assert (folder / "report.md").read_text() == rendered(folder), (
        f"{folder}/report.md is out of date: python benchmarks/bench_example_report.py --from-results")


@pytest.mark.parametrize("folder", kept_steps(), ids=lambda folder: folder.name)
def test_an_example_sweep_report_is_the_current_report_of_its_kept_steps(folder):
    """Its latency_vs_rate.png is drawn from the same steps (--from-results): a sweep kept no timings, and its plot
    went stale with the plot code."""
    assert (folder / "report.md").read_text() == rendered_sweep(folder), (
        f"{folder}/report.md is out of date: python benchmarks/bench_example_report.py --from-results")


def test_every_example_sweep_keeps_the_steps_its_plot_is_drawn_from():
    plotted = {png.parent for png in OUT.glob("*/latency_vs_rate.png")}
    assert plotted and set(kept_steps()) == plotted
