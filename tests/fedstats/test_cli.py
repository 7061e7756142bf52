"""`fedstats demo` prints the federated fit next to the pooled statsmodels fit."""

from __future__ import annotations

import re

from typer.testing import CliRunner

from fedstats.cli import app


def test_demo_prints_federated_fit_and_largest_difference():
    result = CliRunner().invoke(app, ["demo"])
    assert result.exit_code == 0, result.output
    out = result.output
    assert "Federated logistic regression" in out
    assert "Federated vs pooled statsmodels GLM Binomial" in out
    largest = re.search(r"coefficients ([0-9.e+-]+), standard errors ([0-9.e+-]+)", out)
    assert largest and float(largest.group(1)) < 1e-8 and float(largest.group(2)) < 1e-8
    assert "What left each site" in out and "logistic.summaries" in out


def test_demo_with_site_intercepts():
    result = CliRunner().invoke(app, ["demo", "--site-intercepts"])
    assert result.exit_code == 0, result.output
    assert "site[switzerland]" in result.output


def test_demo_reports_a_missing_data_folder_without_traceback(tmp_path):
    result = CliRunner().invoke(app, ["demo", "--data-dir", str(tmp_path)])
    assert result.exit_code == 2
    assert "file not found" in result.output and "Traceback" not in result.output
