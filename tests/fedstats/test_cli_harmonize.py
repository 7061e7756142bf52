"""`fedstats harmonize`: frame, report and quarantine written; exit codes per outcome."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
from typer.testing import CliRunner

from fedstats.cli import HarmonizeExit, app
from fedstats.datasets import default_data_dir

DEMO = Path(__file__).resolve().parents[2] / "examples" / "demo" / "study.toml"


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
    result = run(
        "--spec",
        str(DEMO),
        "--site",
        "x",
        "--omop",
        str(tmp_path / "nowhere"),
        "--out",
        str(tmp_path / "out"),
    )
    assert result.exit_code == HarmonizeExit.FAILED
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["status"] == "failed" and report["failure"]


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
