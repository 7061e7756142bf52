"""`fedstats --version` prints the installed distribution's version and exits."""

from __future__ import annotations

from importlib.metadata import version

from typer.testing import CliRunner

from fedstats.cli.main import app


def test_version_prints_the_installed_version():
    result = CliRunner().invoke(app, ["--version"])
    assert result.exit_code == 0, result.output
    assert result.output == f"fedstats {version('fedstats')}\n"


def test_version_runs_no_command():
    """Eager: it answers before a command is parsed, even beside one."""
    result = CliRunner().invoke(app, ["--version", "budget", "show", "--ledger", "none"])
    assert result.exit_code == 0, result.output
    assert result.output.startswith("fedstats ") and "no ledger" not in result.output
