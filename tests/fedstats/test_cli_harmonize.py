"""`fedstats harmonize`: frame, report and quarantine written; exit codes per outcome."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
from typer.testing import CliRunner

from fedstats.cli.main import HarmonizeExit, app
from fedstats.datasets import default_data_dir

DEMO = Path(__file__).resolve().parents[2] / "fedstats" / "examples" / "demo" / "study.toml"


def run(*args: str):
    return CliRunner().invoke(app, ["harmonize", *args])


def test_omop_site_is_harmonised_and_reported(tmp_path):
    omop = default_data_dir() / "omop" / "synthea27nj_5.4"
    result = run("--spec", str(DEMO), "--site", "nj", "--omop", str(omop), "--out", str(tmp_path))
    assert result.exit_code == HarmonizeExit.OK, result.output
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["balanced"] and report["status"] == "ok"
    assert report["read"] == report["included"] + report["excluded"] + report["rejected"]
    frame = pd.read_parquet(tmp_path / "frame.parquet")
    assert len(frame) == report["patients"] > 0
    assert (tmp_path / "quarantine.csv").exists() and (tmp_path / "report.txt").exists()


def test_empty_cohort_has_its_own_exit_code_and_a_report(tmp_path):
    spec = DEMO.read_text().replace("entry_start = 2005-01-01", "entry_start = 1800-01-01")
    spec = spec.replace("entry_end = 2250-12-31", "entry_end = 1801-01-01")
    path = tmp_path / "study.toml"
    path.write_text(spec)
    omop = default_data_dir() / "omop" / "synthea27nj_5.4"
    result = run(
        "--spec", str(path), "--site", "nj", "--omop", str(omop), "--out", str(tmp_path / "out")
    )
    assert result.exit_code == HarmonizeExit.EMPTY_COHORT
    assert json.loads((tmp_path / "out" / "report.json").read_text())["status"] == "empty cohort"


def test_failures_have_their_own_exit_code_and_a_report(tmp_path):
    """A source that cannot be harmonised (a folder without OMOP tables) is exit 3 with its
    failed report; a source that does not exist is a configuration error, exit 2
    (``test_a_missing_source_is_a_configuration_error_with_its_report``)."""
    (tmp_path / "no-tables").mkdir()
    result = run(
        "--spec",
        str(DEMO),
        "--site",
        "x",
        "--omop",
        str(tmp_path / "no-tables"),
        "--out",
        str(tmp_path / "out"),
    )
    assert result.exit_code == HarmonizeExit.FAILED
    assert "no person table" in result.output
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["status"] == "failed" and report["failure"]
    missing = run("--spec", str(DEMO), "--site", "x", "--omop", str(tmp_path / "nowhere"),
                  "--out", str(tmp_path / "out2"))  # fmt: skip
    assert missing.exit_code == HarmonizeExit.CONFIGURATION
    assert json.loads((tmp_path / "out2" / "report.json").read_text())["status"] == "failed"


def test_configuration_errors(tmp_path):
    bad = tmp_path / "study.toml"
    bad.write_text("[study]\nname = 'x'\n")
    result = run(
        "--spec", str(bad), "--site", "x", "--omop", str(tmp_path), "--out", str(tmp_path / "out")
    )
    assert result.exit_code == HarmonizeExit.CONFIGURATION
    assert "invalid study specification" in result.output
    assert json.loads((tmp_path / "out" / "report.json").read_text())["status"] == "failed"
    neither = run("--spec", str(DEMO), "--site", "x", "--out", str(tmp_path / "o2"))
    assert neither.exit_code == HarmonizeExit.CONFIGURATION


def test_fhir_site_with_workers_memory_limit_and_latest_date(tmp_path):
    """The MIMIC-style date option reaches the reader; worker processes are noted."""
    from harmonize.synthetic_ehr import synthetic_ehr, write_fhir_ndjson

    fhir = write_fhir_ndjson(synthetic_ehr(60, seed=5), tmp_path / "fhir")
    common = ["--spec", str(DEMO), "--site", "s", "--fhir", str(fhir)]
    options = ["--workers", "2", "--memory-limit", "256MB"]
    early = run(*common, "--out", str(tmp_path / "early"), *options, "--latest-date", "2000-01-01")
    assert early.exit_code == HarmonizeExit.FAILED  # nearly every record is after 2000
    assert "in the future (after 2000-01-01)" in early.output
    # the failed run writes its reason table and its quarantine, and its counts balance
    failed = json.loads((tmp_path / "early" / "report.json").read_text())
    quarantine = pd.read_csv(tmp_path / "early" / "quarantine.csv")
    assert failed["balanced"] and failed["status"] == "failed"
    assert len(quarantine) == failed["rejected"] == sum(failed["rejected_by_reason"].values()) > 0
    assert "date in the future (after 2000-01-01)" in failed["rejected_by_reason"]
    assert failed["read"] - failed["not_read"] == sum(failed["read_by_type"].values())
    result = run(*common, "--out", str(tmp_path / "out"), *options, "--latest-date", "2030-01-01")
    assert result.exit_code == HarmonizeExit.OK, result.output
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["balanced"] and report["rejected"] == 0
    assert "Patient.000.ndjson: validated by 2 worker processes" in report["notes"]
