"""`hosttune --version`, and the one-line hint when the bench extra is not installed."""

from importlib import util

from typer.testing import CliRunner

import hosttune
from hosttune.bench import extra
from hosttune.cli import app

runner = CliRunner()


def test_version_prints_the_package_version():
    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0 and result.output == f"hosttune {hosttune.__version__}\n"


def test_bench_without_its_extra_says_how_to_install_it(monkeypatch):
    real = util.find_spec
    monkeypatch.setattr(extra, "find_spec", lambda name: None if name == "matplotlib" else real(name))
    result = runner.invoke(app, ["bench", "--url", "http://127.0.0.1:9", "--requests", "1"])
    assert result.exit_code == 2
    assert result.output == "hosttune: hosttune bench needs matplotlib: pip install 'hosttune[bench]'\n"
