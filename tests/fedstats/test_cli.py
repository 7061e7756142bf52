"""`fedstats demo` prints the federated fit next to the pooled statsmodels fit."""

from __future__ import annotations

import re

from typer.testing import CliRunner

from fedstats.cli.main import app


def test_demo_prints_federated_fit_and_largest_difference(tmp_path):
    result = CliRunner().invoke(app, ["demo", "--out-dir", str(tmp_path / "demo-output")])
    assert result.exit_code == 0, result.output
    out = result.output
    assert "Federated logistic regression" in out
    assert "site 'switzerland' refused task 'prepare'" in out  # its cells are too small
    assert "The exact fit goes on without 'switzerland'" in out
    assert "Federated vs pooled statsmodels GLM Binomial" in out
    largest = re.search(r"coefficients ([0-9.e+-]+), standard errors ([0-9.e+-]+)", out)
    assert largest and float(largest.group(1)) < 1e-8 and float(largest.group(2)) < 1e-8
    assert "What left each site" in out and "logistic.summaries" in out
    assert "Under record-level differential privacy" in out
    assert "record-level DP at switzerland: this fit epsilon 1.000" in out
    assert (tmp_path / "demo-output" / "compliance-report.pdf").stat().st_size > 0
    assert str(tmp_path / "demo-output" / "compliance-report.html") in out


def test_demo_with_site_intercepts():
    result = CliRunner().invoke(app, ["demo", "--site-intercepts", "--no-private"])
    assert result.exit_code == 0, result.output
    assert "site[cleveland]" in result.output and "site[hungary]" in result.output
    assert "without 'switzerland'" in result.output
    assert "without 'va'" in result.output and "crossed with the design column 'sex'" in (
        result.output
    )


def test_demo_reports_a_missing_data_folder_without_traceback(tmp_path):
    """The synthetic private study needs no data file: it runs, then the demo fails."""
    out = tmp_path / "demo-output"
    result = CliRunner().invoke(app, ["demo", "--data-dir", str(tmp_path), "--out-dir", str(out)])
    assert result.exit_code == 2
    missing = f"{tmp_path / 'heart_disease'}: file not found: processed.cleveland.data"
    assert result.output.count(missing) == 1  # said once, at the end, not twice
    assert "Traceback" not in result.output
    assert (out / "compliance-report.html").stat().st_size > 0


def test_an_output_that_is_a_file_is_refused_before_any_work(tmp_path):
    """``demo --out-dir`` and ``harmonize --out`` naming a file: one line and exit 2, before
    the study runs (it used to run for its whole length, then end in a traceback)."""
    taken = tmp_path / "taken"
    taken.write_text("")
    result = CliRunner().invoke(app, ["demo", "--out-dir", str(taken)])
    assert result.exit_code == 2 and "is a file, not a folder" in result.output
    assert "Traceback" not in result.output and "Federated" not in result.output
    result = CliRunner().invoke(
        app, ["harmonize", "--spec", str(taken), "--site", "a", "--out", str(taken),
              "--fhir", str(taken)],
    )  # fmt: skip
    assert result.exit_code == 2 and "is a file, not a folder" in result.output


def test_a_missing_source_is_a_configuration_error_with_its_report(tmp_path):
    """``harmonize --fhir /nonexistent`` is exit 2 (configuration), not 3 (harmonisation
    failed), and still writes its failed report."""
    spec = tmp_path / "spec.toml"
    spec.write_text("")
    out = tmp_path / "out"
    missing = tmp_path / "nowhere.ndjson"
    result = CliRunner().invoke(
        app, ["harmonize", "--spec", str(spec), "--site", "a", "--out", str(out),
              "--fhir", str(missing)],
    )  # fmt: skip
    assert result.exit_code == 2, result.output
    assert f"no such file or folder: {missing}" in result.output
    assert '"status": "failed"' in (out / "report.json").read_text()


def test_dash_h_is_help_everywhere():
    for command in ([], ["harmonize"], ["site", "run"], ["budget", "show"]):
        result = CliRunner().invoke(app, [*command, "-h"])
        assert result.exit_code == 0, (command, result.output)
        assert "Usage" in result.output, command


def test_a_missing_protocol_file_is_named_as_given(tmp_path):
    """``site protocol FILE`` names the path it was given, not a site.toml it never read."""
    missing = tmp_path / "protocol.toml"
    result = CliRunner().invoke(app, ["site", "protocol", str(missing)])
    assert result.exit_code == 2
    assert "the path given to fedstats site protocol" in result.output
    assert "site.toml" not in result.output


def test_budget_show_prints_scopes_and_json(tmp_path):
    import json

    import dp_accounting

    import accounting

    path = tmp_path / "site_a.ledger"
    with accounting.Ledger(path) as ledger:
        scope = accounting.Scope(unit="patient", owner="site_a", study="s1")
        ledger.set_budget(scope, epsilon=3.0, delta=1e-6)
        ledger.charge(scope, dp_accounting.GaussianDpEvent(5.0), note="round 1")
        expected = ledger.spent(scope)
    table = CliRunner().invoke(app, ["budget", "show", "--ledger", str(path)])
    assert table.exit_code == 0, table.output
    assert "site_a" in table.output and "record-level" in table.output
    as_json = CliRunner().invoke(app, ["budget", "show", "--ledger", str(path), "--json"])
    document = json.loads(as_json.output)
    (row,) = document["scopes"]
    assert row["study"] == "s1" and row["entries"] == 1
    assert row["epsilon_rdp"] == expected.epsilon and row["budget_epsilon"] == 3.0
    assert abs(row["remaining"] - (3.0 - expected.epsilon)) < 1e-12


def test_budget_show_refuses_a_missing_ledger_without_creating_it(tmp_path):
    path = tmp_path / "nothing.ledger"
    result = CliRunner().invoke(app, ["budget", "show", "--ledger", str(path)])
    assert result.exit_code == 2 and "no ledger" in result.output
    assert not path.exists()
