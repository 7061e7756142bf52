"""Damaged study files give typed errors that name the file (and the field), never a traceback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reports import StudyRecordError
from reports.recorder import StudyRecorder
from reports.records import FitRecord, parse_record
from reports.study import Study

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner),
    max_leaves=8,
)
SETTINGS = settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


def _fit_path(study: Path) -> Path:
    return study / "fits" / "logistic-record-dp.json"


@SETTINGS
@given(data=st.binary(max_size=200))
def test_any_bytes_in_a_fit_record_give_an_error_naming_the_file(demo_study, tmp_path, data):
    path = tmp_path / "fit.json"
    path.write_bytes(data)
    with pytest.raises(StudyRecordError) as raised:
        parse_record(FitRecord, path)
    assert str(path) in str(raised.value)


@SETTINGS
@given(
    field=st.sampled_from(["params", "privacy", "provenance", "notes", "conf_int", "converged"]),
    value=JSON,
)
def test_a_wrong_field_in_a_fit_record_is_named(demo_study, tmp_path, field, value):
    record = json.loads(_fit_path(demo_study).read_text())
    original = record["result"][field]
    record["result"][field] = value
    path = tmp_path / "fit.json"
    path.write_text(json.dumps(record))
    try:
        parse_record(FitRecord, path)
    except StudyRecordError as error:
        assert str(path) in str(error) and f"result.{field}" in str(error)
    else:  # only a value of the right shape may pass
        assert value == original or isinstance(value, dict | list | type(None) | bool)


@SETTINGS
@given(line=st.text(max_size=80))
def test_a_damaged_inventory_line_is_named(study_copy, line):
    path = study_copy / "inventory.jsonl"
    original = path.read_text()
    try:
        path.write_text(original + line.replace("\n", " ") + "\n")
        if not line.strip():
            Study.load(study_copy)  # a blank line is allowed
            return
        with pytest.raises(StudyRecordError) as raised:
            Study.load(study_copy)
        assert "inventory.jsonl" in str(raised.value) and "line" in str(raised.value)
    finally:
        path.write_text(original)


def test_a_damaged_fit_record_stops_the_study_naming_it(study_copy):
    path = _fit_path(study_copy)
    record = json.loads(path.read_text())
    del record["result"]["params"]
    path.write_text(json.dumps(record))
    with pytest.raises(StudyRecordError, match=r"logistic-record-dp\.json.*result\.params"):
        Study.load(study_copy)


def test_a_damaged_harmonisation_report_is_named(study_copy):
    path = study_copy / "harmonization" / "north.json"
    record = json.loads(path.read_text())
    record["patients"] = "many"
    path.write_text(json.dumps(record))
    with pytest.raises(StudyRecordError, match=r"north\.json.*'patients' must be int"):
        Study.load(study_copy)


def test_a_file_that_is_not_a_ledger_is_named(study_copy):
    (study_copy / "ledgers" / "south.ledger").unlink()
    (study_copy / "ledgers" / "south.ledger").write_bytes(b"not a database" * 100)
    with pytest.raises(StudyRecordError, match=r"south\.ledger: not a readable ledger"):
        Study.load(study_copy)


def test_a_missing_recorded_fit_is_named(study_copy):
    _fit_path(study_copy).unlink()
    with pytest.raises(StudyRecordError, match=r"logistic-record-dp\.json: file missing"):
        Study.load(study_copy)


def test_the_study_round_trips_the_recorded_fit(demo_study):
    study = Study.load(demo_study)
    fit = study.fit("logistic-record-dp")
    assert fit.reference == "logistic-exact"
    assert fit.result.privacy is not None
    secure = fit.result.privacy.secure_aggregation
    assert secure["threshold"] == 4 and secure["sites"] == 4 and secure["dropouts"] == []
    exact = study.fit("logistic-exact")
    assert exact.result.privacy is None
    assert {s.owner for s in fit.result.privacy.scopes} == {"north", "south", "east", "west"}


def test_the_inventory_and_harmonisation_reports_round_trip(demo_study, tmp_path):
    from harmonize.report import HarmonizationReport

    study = Study.load(demo_study)
    saved = study.inventory.save(tmp_path / "inventory.jsonl")
    assert saved.read_text() == (demo_study / "inventory.jsonl").read_text()
    assert len(study.inventory) > 0
    for path in (demo_study / "harmonization").glob("*.json"):
        report = HarmonizationReport.read_json(path)
        assert report.to_dict() == json.loads(path.read_text())
        assert report.balanced


def test_the_writer_checks_a_fit_record_against_the_readers_format(tmp_path) -> None:
    """A record the report could not read is refused when it is written, naming the field."""
    from studyfiles.errors import FitRecordError
    from studyfiles.fit_records import checked_result_record

    recorder = StudyRecorder(tmp_path / "study", study="s")
    with pytest.raises(FitRecordError, match="params"):
        recorder.record_fit(
            "broken", {"model": "logistic", "params": "not a table"}, description="x"
        )
    with pytest.raises(FitRecordError, match="not a valid fit record"):
        checked_result_record({"model": "logistic", "llf": float("nan")})
    assert not (tmp_path / "study" / "fits" / "broken.json").exists()


def test_a_stopped_harmonisation_shows_its_unprocessed_records(study_copy):
    """read = included + excluded + rejected + not processed: the report prints the last term."""
    from reports import build_report, render_html

    path = study_copy / "harmonization" / "north.json"
    record = json.loads(path.read_text())
    record["read"] += 17
    record["unprocessed"] = 17
    record["unprocessed_by_reason"] = {"file not reached (run stopped)": 17}
    path.write_text(json.dumps(record))
    html = render_html(build_report(Study.load(study_copy)))
    assert "not processed 17 (the run stopped before it reached them)" in html
    assert "file not reached (run stopped): 17" in html
    north = html[html.index("<h3>north") :]
    assert "NOT BALANCED" not in north[: north.index("</table>")]


def test_a_stopped_harmonisation_says_how_many_records_it_read(study_copy):
    """A run that never reached 17 records says so instead of calling them read."""
    from reports import build_report, render_html

    path = study_copy / "harmonization" / "north.json"
    record = json.loads(path.read_text())
    read = record["read"]
    record["read"] += 17
    record["unprocessed"] = record["not_read"] = 17
    record["unprocessed_by_reason"] = {"not read: the run stopped at an earlier file": 17}
    path.write_text(json.dumps(record))
    html = render_html(build_report(Study.load(study_copy)))
    assert f"{read + 17:,} in the sources, of which read {read:,} and not read 17 =" in html
    assert "NOT BALANCED" not in html
