"""How real FHIR R4 exports name things: medication references, condition dates, stopped runs.

The records are small hand-written resources in the shapes of the FHIR R4
specification's examples: a MedicationRequest whose ``medicationReference``
points to a contained Medication (``#med1``), to a Bundle entry (its
``urn:uuid:`` fullUrl) or to an exported Medication (``Medication/abc``, in a
Bundle or in a Bulk Data ``Medication.ndjson``); a Condition with only a
``recordedDate``; and a run stopped by ``max_rejected_share``, whose report
must still balance.
"""

from __future__ import annotations

import json
import re
import tempfile
import tomllib
from datetime import date
from itertools import permutations
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from harmonize.errors import HarmonizationError, HarmonizationFailed
from harmonize.fhir import NOT_READ, read_fhir
from harmonize.fhir_mapping import MEDICATION_USED, clip
from harmonize.fhir_medications import MedicationIndex, survey
from harmonize.progress import ProgressCounter
from harmonize.records import RecordStore
from harmonize.report import HarmonizationReport
from harmonize.run import UNCLASSIFIED, harmonize, write_report
from harmonize.spec import parse_spec

DEMO = Path(__file__).resolve().parents[2] / "fedstats" / "examples" / "demo" / "study.toml"
RXNORM = "http://www.nlm.nih.gov/research/umls/rxnorm"
SNOMED = "http://snomed.info/sct"
STATIN = "314231"  # simvastatin 10 mg, in the demo study's statin concept set
NOT_A_STATIN = "197361"  # amlodipine 5 mg
DIABETES = "44054006"
TODAY = date(2024, 6, 1)
QUICK = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
fhir_ids = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9\-.]{0,20}", fullmatch=True)


# ---------------------------------------------------------------- small FHIR resources
def patient(pid: str, died: str | None = "2012-06-01") -> dict[str, Any]:
    resource = {"resourceType": "Patient", "id": pid, "birthDate": "1950-01-01", "gender": "male"}
    if died:
        resource["deceasedDateTime"] = died
    return resource


def encounter(eid: str, pid: str, day: str = "2010-05-01") -> dict[str, Any]:
    return {
        "resourceType": "Encounter",
        "id": eid,
        "status": "finished",
        "class": {"code": "AMB"},
        "subject": {"reference": f"Patient/{pid}"},
        "period": {"start": day},
    }


def medication(mid: str, code: str | None = STATIN) -> dict[str, Any]:
    resource: dict[str, Any] = {"resourceType": "Medication", "id": mid}
    if code is not None:
        resource["code"] = {"coding": [{"system": RXNORM, "code": code}]}
    return resource


def request(rid: str, pid: str, reference: str, **extra: Any) -> dict[str, Any]:
    return {
        "resourceType": "MedicationRequest",
        "id": rid,
        "status": "active",
        "intent": "order",
        "subject": {"reference": f"Patient/{pid}"},
        "authoredOn": "2010-01-01",
        "medicationReference": {"reference": reference},
        **extra,
    }


def condition(cid: str, pid: str, **dates: Any) -> dict[str, Any]:
    return {
        "resourceType": "Condition",
        "id": cid,
        "subject": {"reference": f"Patient/{pid}"},
        "code": {"coding": [{"system": SNOMED, "code": DIABETES}]},
        **dates,
    }


def bundle(*entries: tuple[str | None, dict[str, Any]]) -> dict[str, Any]:
    return {
        "resourceType": "Bundle",
        "type": "collection",
        "entry": [
            {"resource": resource, **({"fullUrl": url} if url else {})} for url, resource in entries
        ],
    }


def write_ndjson(path: Path, resources: list[Any]) -> Path:
    lines = [r if isinstance(r, bytes) else json.dumps(r).encode() for r in resources]
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path


def write_json(path: Path, document: dict[str, Any]) -> Path:
    path.write_text(json.dumps(document))
    return path


def read(paths: Any, **options: Any) -> RecordStore:
    store = RecordStore()
    read_fhir(paths, store, today=TODAY, max_rejected_share=options.pop("share", 1.0), **options)
    return store


def medication_codes(store: RecordStore) -> dict[str, list[str]]:
    """The codes of the medication rows, by the MedicationRequest's record_ref."""
    events = store.frame(
        "SELECT record_ref, code FROM events WHERE domain = 'medication' ORDER BY record_ref, code"
    )
    out: dict[str, list[str]] = {}
    for ref, code in zip(events.record_ref, events.code, strict=True):
        out.setdefault(ref, []).append(code)
    return out


def study():
    """The demo study, with its outcome window short enough for the patients here."""
    raw = tomllib.loads(DEMO.read_text())
    raw["outcome"]["window_days"] = 365
    return parse_spec(raw)


# ---------------------------------------------------------------- medication references
def test_contained_medication_codes_the_request(tmp_path):
    contained = request("r1", "p1", "#med1", contained=[medication("med1")])
    other = request("r2", "p1", "#m", contained=[medication("m", NOT_A_STATIN)])
    store = read(write_ndjson(tmp_path / "MedicationRequest.ndjson", [contained, other]))
    assert medication_codes(store) == {
        "MedicationRequest.ndjson:line 1": [STATIN],
        "MedicationRequest.ndjson:line 2": [NOT_A_STATIN],
    }
    assert store.totals()["rejected"] == 0


def test_missing_or_uncoded_contained_medication_is_quarantined_naming_the_reference(tmp_path):
    wrong_id = request("r1", "p1", "#other", contained=[medication("med1")])
    uncoded = request("r2", "p1", "#med1", contained=[medication("med1", code=None)])
    store = read(write_ndjson(tmp_path / "rx.ndjson", [wrong_id, uncoded]))
    rejected = store.table("rejected")
    assert rejected.location.tolist() == ["line 1", "line 2"]
    assert rejected.field.tolist() == ["medicationReference.reference"] * 2
    # the reason is the kind of problem (the report groups by it); the detail names the reference
    assert rejected.reason.tolist() == [
        "medicationReference names no contained Medication",
        "the contained Medication it names has no code",
    ]
    assert rejected.detail.tolist() == [
        "medicationReference '#other' names no contained Medication",
        "the contained Medication '#med1' has no code nor coded ingredient",
    ]


def test_bundle_references_by_full_url_and_by_id_resolve_to_later_entries(tmp_path):
    document = bundle(
        (None, patient("p1")),
        (None, request("r1", "p1", "urn:uuid:6f1c")),
        (None, request("r2", "p1", "Medication/abc")),
        (None, request("r3", "p1", "https://ehr.example.org/fhir/Medication/abc/_history/2")),
        ("urn:uuid:6f1c", medication("xyz", NOT_A_STATIN)),
        ("https://ehr.example.org/fhir/Medication/abc", medication("abc")),
    )
    store = read(write_json(tmp_path / "b.json", document))
    assert medication_codes(store) == {
        "b.json:entry 1": [NOT_A_STATIN],
        "b.json:entry 2": [STATIN],
        "b.json:entry 3": [STATIN],
    }
    excluded = store.table("excluded_at_read")
    assert excluded[["record_type", "reason", "n"]].values.tolist() == [
        ["Medication", MEDICATION_USED, 2]
    ]
    assert store.totals()["rejected"] == 0
    assert "3 medication requests coded by the exported Medication" in " ".join(store.notes())


def test_the_same_medication_in_every_patient_bundle_is_not_a_duplicate(tmp_path):
    for name in ("a", "b"):
        pid = f"p-{name}"
        write_json(
            tmp_path / f"{name}.json",
            bundle((None, request(f"r-{name}", pid, "Medication/m1")), (None, medication("m1"))),
        )
    store = read(tmp_path)
    assert medication_codes(store) == {"a.json:entry 0": [STATIN], "b.json:entry 0": [STATIN]}
    assert store.totals()["rejected"] == 0


def test_one_medication_id_with_two_codes_is_refused_for_its_requests(tmp_path):
    write_json(tmp_path / "a.json", bundle((None, medication("m1"))))
    write_json(tmp_path / "b.json", bundle((None, medication("m1", NOT_A_STATIN))))
    write_ndjson(tmp_path / "c.ndjson", [request("r1", "p1", "Medication/m1")])
    store = read(tmp_path)
    ((reason, detail),) = store.table("rejected")[["reason", "detail"]].values.tolist()
    assert reason == "medicationReference names Medications with different codes"
    assert detail.startswith("c.ndjson:line 1: medicationReference 'Medication/m1': ")
    assert "different codes" in detail and "b.json:entry 0" in detail


@given(order=st.permutations(["MedicationRequest", "Medication", "Patient"]))
@QUICK
def test_bulk_ndjson_references_resolve_whatever_the_order_of_files(order):
    """The Medication file may come before or after the requests: the first pass indexes it."""
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        files = {
            "Patient": write_ndjson(root / "Patient.ndjson", [patient("p1")]),
            "MedicationRequest": write_ndjson(
                root / "MedicationRequest.ndjson",
                [request("r1", "p1", "Medication/m1"), request("r2", "p1", "Medication/m2")],
            ),
            "Medication": write_ndjson(
                root / "Medication.ndjson", [medication("m2", NOT_A_STATIN), medication("m1")]
            ),
        }
        store = read([files[name] for name in order])
        assert medication_codes(store) == {
            "MedicationRequest.ndjson:line 1": [STATIN],
            "MedicationRequest.ndjson:line 2": [NOT_A_STATIN],
        }
        assert store.totals() == {
            "unprocessed": 0,
            "read": 5,
            "excluded_at_read": 2,
            "rejected": 0,
        }


@given(reference=st.text(min_size=1, max_size=150))
@QUICK
def test_an_unresolvable_reference_is_quarantined_naming_it_the_file_and_line(reference):
    """Any reference text from outside: never a crash, one quarantine row that names it."""
    stripped = reference.strip()
    assume(stripped != "#m1")
    assume(not re.search(r"(?:^|/)Medication/m1(?:/_history/[A-Za-z0-9\-.]+)?$", stripped))
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        write_ndjson(root / "Medication.ndjson", [medication("m1")])
        write_ndjson(
            root / "MedicationRequest.ndjson",
            [patient("p1"), request("r1", "p1", reference, contained=[medication("m1")])],
        )
        store = read(root)
        assert medication_codes(store) == {}
        (row,) = store.table("rejected").itertuples()
        assert (row.source, row.location, row.record_type) == (
            "MedicationRequest.ndjson",
            "line 2",
            "MedicationRequest",
        )
        if not row.reason.startswith("not valid FHIR"):  # e.g. a reference of blanks
            # grouped by kind: the reason holds neither the file nor the reference
            assert row.reason in {
                "medicationReference matches no Medication in the export",
                "medicationReference names no contained Medication",
            }
            assert "MedicationRequest.ndjson" not in row.reason
            assert row.detail.startswith(
                "MedicationRequest.ndjson:line 2: "
            ) or row.detail.startswith("medicationReference")
            assert repr(clip(reference, 100)) in row.detail


def test_a_stopping_unresolved_reference_names_it_in_the_error(tmp_path):
    path = write_ndjson(tmp_path / "rx.ndjson", [request("r1", "p1", "Medication/gone")])
    with pytest.raises(HarmonizationError, match=r"line 1 .*'Medication/gone' matches no"):
        read(path, share=0.1)


@given(mid=fhir_ids, form=st.sampled_from(["{}", "https://h.example/fhir/{}", "{}/_history/7"]))
@QUICK
def test_index_resolves_every_form_of_a_medication_reference(mid, form):
    index = MedicationIndex()
    index.add(medication(mid), "m.ndjson:line 1")
    assert index.resolve(form.format(f"Medication/{mid}")) == [(RXNORM, STATIN)]
    for wrong in (f"Medication/{mid}x", f"Patient/{mid}"):
        unresolved = index.resolve(wrong)
        assert unresolved.reason == "medicationReference matches no Medication in the export"
        assert repr(wrong) in unresolved.detail


def test_index_stores_identical_codings_once():
    index = MedicationIndex()
    for i in range(3):
        index.add(medication(f"m{i}"), f"m.ndjson:line {i + 1}")
    values = list(index.entries.values())
    assert len(values) == 3 and all(v is values[0] for v in values)


def test_an_invalid_medication_is_rejected_and_so_are_requests_naming_it(tmp_path):
    broken = medication("m1") | {"code": "simvastatin"}  # a string where a CodeableConcept goes
    write_ndjson(tmp_path / "Medication.ndjson", [broken])
    write_ndjson(tmp_path / "rx.ndjson", [request("r1", "p1", "Medication/m1")])
    rejected = read(tmp_path).table("rejected")
    assert rejected.source.tolist() == ["Medication.ndjson", "rx.ndjson"]
    assert rejected.reason[0].startswith("not valid FHIR")
    assert rejected.reason[1] == "medicationReference names a Medication that is not valid FHIR"
    assert "(Medication.ndjson:line 1) is not valid FHIR" in rejected.detail[1]


# ---------------------------------------------------------------- condition dates
@pytest.mark.parametrize(
    ("dates", "day", "by_recorded"),
    [
        ({"recordedDate": "2009-03-04"}, "2009-03-04", True),
        ({"onsetString": "in childhood", "recordedDate": "2009-03-04"}, "2009-03-04", True),
        ({"onsetPeriod": {"end": "2008-01-01"}, "recordedDate": "2009-03-04"}, "2009-03-04", True),
        ({"onsetDateTime": "2008-02-03", "recordedDate": "2009-03-04"}, "2008-02-03", False),
        ({"onsetPeriod": {"start": "2007-01-01"}, "recordedDate": "2009"}, "2007-01-01", False),
    ],
)
def test_condition_dated_by_onset_else_recorded_date(tmp_path, dates, day, by_recorded):
    store = read(write_ndjson(tmp_path / "c.ndjson", [condition("c1", "p1", **dates)]))
    assert [str(d)[:10] for d in store.table("events").event_date] == [day]
    noted = [n for n in store.notes() if "recordedDate" in n]
    assert noted == (["1 condition dated by recordedDate (no onset)"] if by_recorded else [])


def test_condition_without_any_date_is_still_rejected(tmp_path):
    store = read(write_ndjson(tmp_path / "c.ndjson", [condition("c1", "p1")]))
    assert store.table("rejected")[["field", "reason"]].values.tolist() == [
        ["onset[x]", "missing date"]
    ]


# ---------------------------------------------------------------- a whole site's run
def test_referenced_medications_and_recorded_dates_reach_the_analysis_frame(tmp_path):
    """End to end: the statin and diabetes columns come from references and recordedDate."""
    write_ndjson(tmp_path / "Patient.ndjson", [patient("p1"), patient("p2"), patient("p3")])
    write_ndjson(tmp_path / "Encounter.ndjson", [encounter(f"e{i}", f"p{i}") for i in (1, 2, 3)])
    write_ndjson(
        tmp_path / "MedicationRequest.ndjson",
        [
            request("r1", "p1", "#med1", contained=[medication("med1")]),
            request("r2", "p2", "Medication/statin"),
            request("r3", "p3", "Medication/other"),
        ],
    )
    write_ndjson(
        tmp_path / "Medication.ndjson",
        [medication("statin"), medication("other", NOT_A_STATIN)],
    )
    write_ndjson(
        tmp_path / "Condition.ndjson",
        [
            condition("c1", "p1", recordedDate="2009-03-04"),
            condition("c2", "p2", onsetDateTime="2009-03-04"),
        ],
    )
    result = harmonize(study(), site="s", fhir=tmp_path, latest_date=TODAY)
    report = result.report
    assert report.status == "ok", report.to_text()
    assert report.rejected == 0 and report.unprocessed == 0 and report.balanced
    assert result.frame["statin"].tolist() == [1, 1, 0]
    assert result.frame["diabetes"].tolist() == [1, 1, 0]
    assert "1 condition dated by recordedDate (no onset)" in report.notes
    assert "1 condition dated by recordedDate (no onset)" in report.to_text()
    assert report.excluded_by_reason[MEDICATION_USED] == 2


# ---------------------------------------------------------------- stopped runs
@given(
    good=st.integers(min_value=2, max_value=6),
    later=st.lists(st.integers(min_value=0, max_value=5), min_size=1, max_size=3),
    blank_lines=st.booleans(),
)
@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_a_stopped_run_balances_with_its_unprocessed_records(good, later, blank_lines):
    """read = included + excluded + rejected + unprocessed, in the report and its JSON."""
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        first = [patient("p1"), *(encounter(f"e{i}", "p1") for i in range(good - 1))]
        bad = [b"{not json", request("r1", "p1", "Medication/missing")]
        write_ndjson(root / "a.ndjson", first + bad)
        for number, n in enumerate(later):
            records: list[Any] = [encounter(f"x{number}-{i}", "p1") for i in range(n)]
            if blank_lines:
                records = [b"  ", *records, b""]
            write_ndjson(root / f"b{number}.ndjson", records)
        with pytest.raises(HarmonizationFailed) as caught:
            harmonize(study(), site="s", fhir=root, latest_date=TODAY, max_rejected_share=0.1)
        report = caught.value.report
        assert report.rejected == 2
        assert report.unprocessed_by_reason == {
            UNCLASSIFIED: good,
            **({NOT_READ: sum(later)} if sum(later) else {}),
        }
        assert report.read == good + 2 + sum(later)
        assert report.read == report.included + report.excluded + report.rejected + (
            report.unprocessed
        )
        assert report.balanced
        assert f"+ unprocessed {good + sum(later)}" in report.to_text()
        assert "NOT BALANCED" not in report.to_text()
        write_report(report, root / "out")
        written = json.loads((root / "out" / "report.json").read_text())
        assert written["balanced"] is True and written["unprocessed"] == good + sum(later)
        assert HarmonizationReport.read_json(root / "out" / "report.json").balanced


def test_a_report_from_before_the_unprocessed_count_still_loads():
    record = HarmonizationReport("s", "fhir", [], "st", "d", "ok", read=3, included=3).to_dict()
    del record["unprocessed"], record["unprocessed_by_reason"]
    assert HarmonizationReport.from_dict(record).balanced


def test_a_broken_json_file_stops_the_run_before_anything_is_read(tmp_path):
    write_ndjson(tmp_path / "a.ndjson", [patient("p1")])
    (tmp_path / "b.json").write_text("{broken")
    store = RecordStore()
    with pytest.raises(HarmonizationError, match=r"b\.json: not valid JSON"):
        read_fhir(tmp_path, store)
    assert store.totals()["read"] == 0


# ---------------------------------------------------------------- progress
def test_progress_reports_records_done_of_the_counted_total(tmp_path):
    write_ndjson(tmp_path / "a.ndjson", [patient(f"p{i}") for i in range(2500)] + [b""])
    write_json(tmp_path / "b.json", bundle(*((None, encounter(f"e{i}", "p1")) for i in range(30))))
    calls: list[tuple[int, int | None]] = []
    read(tmp_path, progress=lambda done, total: calls.append((done, total)))
    assert calls == [(0, 2530), (1000, 2530), (2000, 2530), (2530, 2530)]


@pytest.mark.parametrize("steps", list(permutations([1, 999, 1000, 1])))
def test_progress_counter_reports_each_time_another_thousand_is_passed(steps):
    calls: list[int] = []
    counter = ProgressCounter(lambda done, total: calls.append(done), total=None)
    for n in steps:
        counter.advance(n)
    done = 0
    expected = []
    for n in steps:
        before, done = done, done + n
        if done // 1000 > before // 1000:
            expected.append(done)
    assert calls == expected


def test_survey_counts_lines_entries_and_single_resources(tmp_path):
    a = write_ndjson(tmp_path / "a.ndjson", [b"", patient("p1"), b"   ", b"{bad"])
    b = write_json(tmp_path / "b.json", bundle((None, patient("p2")), (None, medication("m"))))
    c = write_json(tmp_path / "c.json", medication("n"))
    found = survey([a, b, c])
    assert found.records == {a: 2, b: 2, c: 1} and found.total == 5
    assert set(found.medications.entries) == {"Medication/m", "Medication/n"}


def test_harmonize_passes_progress_through(tmp_path):
    write_ndjson(tmp_path / "a.ndjson", [patient("p1"), encounter("e1", "p1")])
    calls: list[tuple[int, int | None]] = []
    harmonize(
        study(), site="s", fhir=tmp_path, latest_date=TODAY, progress=lambda *a: calls.append(a)
    )
    assert calls == [(0, 2), (2, 2)]


def test_worker_processes_resolve_references_like_one_process(tmp_path):
    """Workers return the unresolved reference; the main process resolves it with the index."""
    requests = [request(f"r{i}", "p1", f"Medication/m{i % 3}") for i in range(40)]
    write_ndjson(tmp_path / "MedicationRequest.ndjson", requests)
    write_ndjson(tmp_path / "Medication.ndjson", [medication("m0"), medication("m1")])
    one, several = read(tmp_path, workers=1), read(tmp_path, workers=2)
    assert medication_codes(several) == medication_codes(one)
    assert len(medication_codes(one)) == 27  # m2 is not exported: 13 requests rejected
    assert several.table("rejected").equals(one.table("rejected"))
