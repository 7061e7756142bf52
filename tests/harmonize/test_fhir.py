"""The FHIR R4 reader: real Synthea data, mutated records, errors, and streaming.

Every record read must end up represented by rows, excluded at read, or as one
quarantine row: ``read = represented + excluded_at_read + rejected`` per file.
The oracle for the real-data facts is the raw JSON, read with ``json`` alone.
"""

from __future__ import annotations

import copy
import json
import tempfile
import time
import tracemalloc
from dataclasses import dataclass
from datetime import date, timedelta
from functools import cache
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fedstats.datasets import default_data_dir
from harmonize.errors import HarmonizationError
from harmonize.fhir import read_fhir
from harmonize.fhir_mapping import MODELS, Rejection, validate
from harmonize.records import RecordStore

FHIR = default_data_dir() / "fhir"
BUNDLES = FHIR / "synthea_bundles"
BULK = FHIR / "synthea_bulk_10_patients"
KOEPP = BUNDLES / "Abdul_Koepp_e925b0f3-8006-43f6-aa31-94bd215e55e7.json"
TODAY = date(2024, 6, 1)
NOT_USED = "resource type not used by the spec"


# ---------------------------------------------------------------- helpers
def accounting(store: RecordStore) -> pd.DataFrame:
    """Per source: read, represented (distinct record_ref), excluded at read, rejected."""
    return store.frame(
        """
        WITH refs AS (
            SELECT record_ref FROM persons UNION SELECT record_ref FROM events
        ),
        represented AS (
            SELECT regexp_extract(record_ref, '^(.*):(line|entry|resource)', 1) AS source,
                   count(*) AS n
            FROM refs GROUP BY 1
        ),
        read AS (SELECT source, sum(n) AS n FROM read_counts GROUP BY 1),
        excluded AS (SELECT source, sum(n) AS n FROM excluded_at_read GROUP BY 1),
        rejected AS (SELECT source, count(*) AS n FROM rejected GROUP BY 1)
        SELECT read.source, read.n AS read,
               coalesce(represented.n, 0) AS represented,
               coalesce(excluded.n, 0) AS excluded,
               coalesce(rejected.n, 0) AS rejected
        FROM read
        LEFT JOIN represented USING (source)
        LEFT JOIN excluded USING (source)
        LEFT JOIN rejected USING (source)
        ORDER BY read.source
        """
    )


def assert_accounted(store: RecordStore) -> pd.DataFrame:
    table = accounting(store)
    unbalanced = table[table.read != table.represented + table.excluded + table.rejected]
    assert unbalanced.empty, unbalanced.to_string()
    return table


def write_ndjson(path: Path, resources: list[Any]) -> Path:
    with path.open("wb") as handle:
        for item in resources:
            line = item if isinstance(item, bytes) else json.dumps(item).encode()
            handle.write(line + b"\n")
    return path


def raw_bundle_resources() -> list[dict]:
    return [
        entry["resource"]
        for path in sorted(BUNDLES.glob("*.json"))
        for entry in json.loads(path.read_text())["entry"]
    ]


# ---------------------------------------------------------------- real data
@pytest.fixture(scope="module")
def bundles() -> RecordStore:
    store = RecordStore()
    read_fhir(BUNDLES, store)
    return store


@pytest.fixture(scope="module")
def bulk() -> RecordStore:
    store = RecordStore()
    read_fhir(BULK, store)
    return store


def test_bundles_every_record_accounted(bundles):
    table = assert_accounted(bundles)
    assert len(table) == 20
    raw = raw_bundle_resources()
    assert table.read.sum() == len(raw)
    assert bundles.totals()["rejected"] == 0
    counts = bundles.frame("SELECT record_type, sum(n) AS n FROM read_counts GROUP BY 1")
    assert dict(zip(counts.record_type, counts.n, strict=True))["Observation"] == 2335


def test_bundles_patients_and_a_known_birth_date(bundles):
    persons = bundles.table("persons").set_index("person_id")
    assert len(persons) == 20
    koepp = persons.loc["018f428e-34f6-4707-8009-5ad742f901e7"]
    assert koepp.birth_date == pd.Timestamp("1956-08-03")  # Patient.birthDate in the file
    assert koepp.sex == "male" and pd.isna(koepp.death_date)
    assert koepp.record_ref == f"{KOEPP.name}:entry 0"
    riojas = persons.loc["829bb06a-42b9-433d-a8f6-560727c63da9"]
    assert riojas.death_date == pd.Timestamp("2008-12-14")  # deceasedDateTime 2008-12-14T03:11:33


def test_bundles_systolic_pressure_from_panel_components(bundles):
    """Each BP panel (55284-4) gives its own row plus one per component (8480-6, 8462-4)."""
    panels = [
        r
        for r in raw_bundle_resources()
        if r["resourceType"] == "Observation" and r.get("component")
    ]
    systolic_raw = [
        c["valueQuantity"]["value"]
        for r in panels
        for c in r["component"]
        if c["code"]["coding"][0]["code"] == "8480-6"
    ]
    assert len(panels) == 185 and len(systolic_raw) == 185
    sbp = bundles.frame(
        "SELECT * FROM events WHERE system = 'http://loinc.org' AND code = '8480-6'"
    )
    assert len(sbp) == 185
    assert set(sbp.unit) == {"mm[Hg]"} and set(sbp.domain) == {"measurement"}
    assert sorted(sbp.value) == pytest.approx(sorted(systolic_raw))
    panel_refs = bundles.frame("SELECT record_ref FROM events WHERE code = '55284-4'")
    assert set(sbp.record_ref) == set(panel_refs.record_ref)
    # every Observation coding and component coding is a row: 2335 + 2 * 185
    n = bundles.frame("SELECT count(*) AS n FROM events WHERE domain = 'measurement'").n[0]
    assert n == 2335 + 2 * 185


def test_bulk_every_record_accounted(bulk):
    table = assert_accounted(bulk).set_index("source")
    for path in BULK.glob("*.ndjson"):
        lines = sum(1 for line in path.read_bytes().splitlines() if line.strip())
        assert table.loc[path.name, "read"] == lines
    assert bulk.totals()["rejected"] == 0
    # the export log is counted and excluded, not read as resources
    log = bulk.frame("SELECT * FROM excluded_at_read WHERE source = 'log.ndjson'")
    assert log.record_type.tolist() == ["BulkDataExportLog"] and log.n.tolist() == [4]


def test_bulk_patients_events_and_dates_as_written(bulk):
    persons = bulk.table("persons")
    assert len(persons) == 13 and persons.person_id.is_unique
    assert persons.death_date.notna().sum() == 3
    per_domain = bulk.frame("SELECT domain, count(DISTINCT record_ref) AS n FROM events GROUP BY 1")
    assert dict(zip(per_domain.domain, per_domain.n, strict=True)) == {
        "visit": 1215,
        "condition": 555,
        "medication": 1745,
        "procedure": 2056,
    }
    # line 1: authoredOn 1989-05-27T23:58:16-04:00 (the date written, not UTC's 28th)
    first = bulk.frame(
        "SELECT * FROM events WHERE record_ref = 'MedicationRequest.000.ndjson:line 1'"
    )
    assert first.person_id.tolist() == ["79a66c97-6131-3213-f3c9-4606946ab056"]
    assert first.code.tolist() == ["314076"]
    assert first.event_date.tolist() == [pd.Timestamp("1989-05-27")]
    excluded = bulk.frame("SELECT sum(n) AS n FROM excluded_at_read WHERE reason = ?", [NOT_USED])
    assert excluded.n[0] == 11 + 16 + 1215 + 161 + 44 + 43 + 43 + 43


def test_both_folders_in_one_run():
    store = RecordStore()
    read_fhir([BUNDLES, BULK, BULK / "Patient.000.ndjson"], store)  # the file is read once
    assert len(store.table("persons")) == 33
    assert len(assert_accounted(store)) == 20 + 14


# ---------------------------------------------------------------- examples
@cache
def base() -> dict[str, dict]:
    """One real resource of each kind: bulk (Patient/ refs) and bundle (urn:uuid refs)."""

    def first_line(name: str) -> dict:
        with (BULK / f"{name}.000.ndjson").open() as handle:
            return json.loads(handle.readline())

    bundle = [e["resource"] for e in json.loads(KOEPP.read_text())["entry"]]
    observations = [r for r in bundle if r["resourceType"] == "Observation"]
    return {
        "Patient": first_line("Patient"),
        "Condition": first_line("Condition"),
        "Encounter": first_line("Encounter"),
        "MedicationRequest": first_line("MedicationRequest"),
        "Procedure": first_line("Procedure"),
        "Observation": next(r for r in observations if "valueQuantity" in r),
        "BloodPressure": next(r for r in observations if "component" in r),
        "Immunization": next(r for r in bundle if r["resourceType"] == "Immunization"),
    }


def read_one(tmp_path: Path, resources: list[Any], **options: Any) -> RecordStore:
    store = RecordStore()
    read_fhir(
        write_ndjson(tmp_path / "in.ndjson", resources),
        store,
        today=options.pop("today", TODAY),
        max_rejected_share=options.pop("max_rejected_share", 1.0),
        **options,
    )
    assert_accounted(store)
    return store


def test_dates_are_the_calendar_date_written(tmp_path):
    obs = copy.deepcopy(base()["Observation"])
    late, early = copy.deepcopy(obs), copy.deepcopy(obs)
    late.update(id="late", effectiveDateTime="2020-01-02T23:30:00-05:00")
    early.update(id="early", effectiveDateTime="2020-01-02T00:30:00+14:00")
    store = read_one(tmp_path, [late, early])
    assert store.table("events").event_date.tolist() == [pd.Timestamp("2020-01-02")] * 2


def test_subject_references_and_history(tmp_path):
    proc = copy.deepcopy(base()["Procedure"])
    proc["subject"] = {"reference": "https://ehr.example.org/fhir/Patient/p-7/_history/3"}
    group = copy.deepcopy(base()["Procedure"]) | {"id": "g"}
    group["subject"] = {"reference": "Group/1"}
    store = read_one(tmp_path, [proc, group])
    assert store.table("events").person_id.tolist() == ["p-7"]
    rejected = store.table("rejected")
    assert rejected.field.tolist() == ["subject.reference"]
    assert rejected.reason[0].startswith("subject is not a Patient")


def test_validation_error_names_the_nested_field(tmp_path):
    bp = copy.deepcopy(base()["BloodPressure"])
    bp["component"][1]["valueQuantity"]["value"] = "high"
    store = read_one(tmp_path, [bp])
    row = store.table("rejected").iloc[0]
    assert (row.location, row.record_type, row.record_id) == ("line 1", "Observation", bp["id"])
    assert row.field == "component[1].valueQuantity.value"
    assert row.reason.startswith("not valid FHIR")


def test_status_comparator_and_deceased_decisions(tmp_path):
    wrong = copy.deepcopy(base()["Observation"]) | {"id": "w", "status": "entered-in-error"}
    censored = copy.deepcopy(base()["Observation"]) | {"id": "c"}
    censored["valueQuantity"] = {"value": 5, "comparator": "<", "code": "mg/dL"}
    dead = copy.deepcopy(base()["Patient"])
    dead.pop("deceasedDateTime", None)
    dead["deceasedBoolean"] = True
    store = read_one(tmp_path, [wrong, censored, dead])
    excluded = store.table("excluded_at_read")
    assert excluded[["record_type", "reason"]].values.tolist() == [
        ["Observation", "status entered-in-error"]
    ]
    events = store.table("events")
    assert events.value.isna().all() and events.unit.tolist() == ["mg/dL"]
    # deceased without a date is valid FHIR: a person, flagged, that the cohort excludes
    assert store.table("rejected").empty
    (person,) = store.table("persons").itertuples()
    assert person.deceased and pd.isna(person.death_date)


def test_single_resource_json_file(tmp_path):
    (tmp_path / "p.json").write_text(json.dumps(base()["Patient"]))
    store = RecordStore()
    read_fhir(tmp_path / "p.json", store)
    assert store.table("persons").record_ref.tolist() == ["p.json:resource"]


# ---------------------------------------------------------------- errors
def test_rejected_share_over_threshold_stops_the_run(tmp_path):
    good = [copy.deepcopy(base()["Condition"]) | {"id": f"c{i}"} for i in range(8)]
    bad = [b"{not json", {"resourceType": "Condition", "id": "x"}]
    path = write_ndjson(tmp_path / "Condition.000.ndjson", good + bad)
    store = RecordStore()
    with pytest.raises(HarmonizationError) as caught:
        read_fhir(path, store, max_rejected_share=0.1)
    message = str(caught.value)
    assert "Condition.000.ndjson" in message and "2 of 10 records rejected" in message
    assert "line 9" in message and "malformed JSON" in message
    assert store.totals() == {"unprocessed": 0, "read": 10, "excluded_at_read": 0, "rejected": 2}
    read_fhir(path, RecordStore(), max_rejected_share=0.2)  # 20 % is not over 20 %


@pytest.mark.parametrize(
    ("content", "words"),
    [
        (b'{"resourceType": "Bundle", "entry": [', "not valid JSON"),
        (b"\xff\xfe\x00garbage", "not valid JSON"),
        (b"[1, 2]", "not a FHIR Bundle or resource"),
        (b'{"resourceType": "Bundle", "entry": 5}', "Bundle.entry is not a list"),
    ],
)
def test_unusable_json_file_is_an_error_naming_it(tmp_path, content, words):
    path = tmp_path / "broken.json"
    path.write_bytes(content)
    with pytest.raises(HarmonizationError, match=words) as caught:
        read_fhir(path, RecordStore())
    assert "broken.json" in str(caught.value)


def test_missing_paths_and_name_clashes(tmp_path):
    with pytest.raises(HarmonizationError, match="no such file"):
        read_fhir(tmp_path / "nowhere.ndjson", RecordStore())
    with pytest.raises(HarmonizationError, match=r"no \.json or \.ndjson"):
        read_fhir(tmp_path, RecordStore())
    for folder in ("a", "b"):
        (tmp_path / folder).mkdir()
        write_ndjson(tmp_path / folder / "Patient.000.ndjson", [base()["Patient"]])
    with pytest.raises(HarmonizationError, match="share the file name"):
        read_fhir([tmp_path / "a", tmp_path / "b"], RecordStore())
    with pytest.raises(ValueError, match="max_rejected_share"):
        read_fhir(tmp_path / "a", RecordStore(), max_rejected_share=1.5)


# ---------------------------------------------------------------- properties
@dataclass
class Case:
    """One mutated input record and what must become of it."""

    kind: str
    mutation: str
    record: Any  # a resource (dict) or a raw line (bytes)
    expect: str  # "rows", "rejected", "excluded" or "nothing" (a blank line)
    field: str | None = None  # expected rejection field, when known
    shows: tuple[str, str] | None = None  # (events column, value) the rows must show


RESOURCE_TYPE = {"BloodPressure": "Observation"}
DATE = {  # where each kind's date is, and every element that could stand in for it
    "Patient": (["birthDate"], ["birthDate"]),
    "Condition": (["onsetDateTime"], ["onsetDateTime", "recordedDate"]),
    "Encounter": (["period", "start"], ["period"]),
    "MedicationRequest": (["authoredOn"], ["authoredOn"]),
    "Procedure": (["performedPeriod", "start"], ["performedPeriod"]),
    "Observation": (["effectiveDateTime"], ["effectiveDateTime", "issued"]),
    "BloodPressure": (["effectiveDateTime"], ["effectiveDateTime", "issued"]),
}
CODE = {
    "Condition": ["code"],
    "Encounter": ["type", 0],
    "MedicationRequest": ["medicationCodeableConcept"],
    "Procedure": ["code"],
    "Observation": ["code"],
    "BloodPressure": ["component", 0, "code"],
}
REQUIRED = {  # dropping any of these makes the record unusable (a Patient has none)
    "Condition": ["subject"],
    "Encounter": ["status", "class", "subject", "period"],
    "MedicationRequest": ["status", "intent", "subject", "medicationCodeableConcept"],
    "Procedure": ["status", "subject", "performedPeriod"],
    "Observation": ["status", "code", "subject"],
    "BloodPressure": ["status", "code", "subject"],
}
COMPLEX = {  # elements of a complex type: a scalar or list there is a type error
    "Patient": ["meta", "text", "maritalStatus"],
    "Condition": ["code", "subject", "clinicalStatus"],
    "Encounter": ["class", "subject", "period"],
    "MedicationRequest": ["subject", "medicationCodeableConcept", "requester"],
    "Procedure": ["code", "subject", "performedPeriod"],
    "Observation": ["code", "subject", "valueQuantity"],
    "BloodPressure": ["code", "subject", "meta"],
}
QUANTITY = {"Observation": ["valueQuantity"], "BloodPressure": ["component", 1, "valueQuantity"]}
BAD_DATES = ["2020-13-45", "2020-02-30", "2020/01/01", "01-02-2020", "yesterday", "", "2020-1-1"]
_EVENT_ONLY = ("unknown code", "not happened", "subject not a Patient", "drop required")
codes = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9.\-]{0,15}", fullmatch=True)


def at(resource: dict, path: list) -> Any:
    for step in path:
        resource = resource[step]
    return resource


def put(resource: dict, path: list, value: Any) -> None:
    at(resource, path[:-1])[path[-1]] = value


@st.composite
def cases(draw: st.DrawFn) -> Case:
    kinds = [*DATE, "Immunization", "garbage"]
    kind = draw(st.sampled_from(kinds))
    if kind == "garbage":
        line = draw(st.one_of(st.text(max_size=30).map(str.encode), st.binary(max_size=30)))
        line = line.replace(b"\n", b" ")
        if not line.strip():
            return Case(kind, "blank", line, "nothing")
        try:
            parsed = json.loads(line)
        except (ValueError, RecursionError):
            parsed = None
        if isinstance(parsed, dict) and isinstance(parsed.get("resourceType"), str):
            return Case(kind, "valid JSON resource", {"resourceType": "Basic"}, "excluded")
        return Case(kind, "garbage", line, "rejected")
    record = copy.deepcopy(base()[kind])
    if kind == "Immunization":
        return Case(kind, "unused type", record, "excluded")
    mutations = ["valid", "duplicate", "drop required", "wrong type", "bad date",
                 "partial date", "future date", "missing date", "unknown code",
                 "not happened", "subject not a Patient"]  # fmt: skip
    mutations = [m for m in mutations if kind != "Patient" or m not in _EVENT_ONLY]
    mutations += {
        "Patient": ["no gender", "bad gender", "deceased without date"],
        "Observation": ["unknown unit", "missing unit"],
        "BloodPressure": ["unknown unit", "missing unit"],
        "MedicationRequest": ["medication reference"],
    }.get(kind, [])
    mutation = draw(st.sampled_from(mutations))
    date_path, date_fields = DATE[kind]
    expect, field, shows = "rejected", None, None
    if mutation in ("valid", "duplicate"):
        expect = "rows"
    elif mutation == "no gender":
        record.pop("gender", None)
        expect = "rows"
    elif mutation == "drop required":
        record.pop(draw(st.sampled_from(REQUIRED[kind])))
    elif kind == "Patient" and mutation == "missing date":
        record.pop("birthDate")  # valid FHIR: the frame builder excludes it from the cohort
        expect = "rows"
    elif mutation == "wrong type":
        value = draw(st.one_of(st.integers(), st.booleans(), st.lists(st.integers(), max_size=2)))
        record[draw(st.sampled_from(COMPLEX[kind]))] = value
    elif mutation == "bad date":
        put(record, date_path, draw(st.sampled_from(BAD_DATES)))
        field = ".".join(date_path)
    elif mutation == "partial date":
        put(record, date_path, draw(st.sampled_from(["2019", "2019-07"])))
        field = ".".join(date_path)
    elif mutation == "future date":
        day = TODAY + timedelta(days=draw(st.integers(1, 20_000)))
        put(record, date_path, day.isoformat())
        field = ".".join(date_path)
    elif mutation == "missing date":
        for name in date_fields:
            record.pop(name, None)
    elif mutation == "unknown code":
        coding = at(record, CODE[kind])["coding"][0]
        coding.update(code=draw(codes), system=draw(st.sampled_from(["urn:x", "http://loinc.org"])))
        expect, shows = "rows", ("code", coding["code"])
    elif mutation == "not happened":
        if kind == "Condition":
            record["verificationStatus"]["coding"][0]["code"] = "entered-in-error"
        else:
            record["status"] = "entered-in-error"
        expect = "excluded"
    elif mutation == "subject not a Patient":
        record["subject"] = {"reference": draw(st.sampled_from(["Group/1", "Device/d", "#c1"]))}
        field = "subject.reference"
    elif mutation == "bad gender":
        record["gender"] = draw(st.sampled_from(["F", "M", "xyz"]))
        field = "gender"
    elif mutation == "deceased without date":
        record.pop("deceasedDateTime", None)
        record["deceasedBoolean"] = True  # valid FHIR: a cohort exclusion, not an error
        expect = "rows"
    elif mutation == "unknown unit":
        unit = draw(st.sampled_from(["furlong/fortnight", "xyz"]))
        at(record, QUANTITY[kind])["code"] = unit
        expect, shows = "rows", ("unit", unit)
    elif mutation == "missing unit":
        quantity = at(record, QUANTITY[kind])
        quantity.pop("unit"), quantity.pop("code")
        field = ".".join(str(s) for s in QUANTITY[kind]).replace(".1.", "[1].") + ".code"
    elif mutation == "medication reference":
        record.pop("medicationCodeableConcept")
        record["medicationReference"] = {"reference": "Medication/m1"}
        field = "medicationReference.reference"  # the unresolved reference itself
    return Case(kind, mutation, record, expect, field, shows)


def assemble(drawn: list[Case]) -> list[Case]:
    """Give each resource a fresh id; a duplicate takes the id of an earlier accepted one."""
    accepted: dict[str, list[str]] = {}
    out = []
    for i, case in enumerate(drawn):
        if isinstance(case.record, dict) and case.kind in DATE:
            resource_type = RESOURCE_TYPE.get(case.kind, case.kind)
            earlier = accepted.setdefault(resource_type, [])
            if case.mutation == "duplicate" and earlier:
                case.record["id"] = earlier[0]
                case = Case(case.kind, case.mutation, case.record, "rejected", "id")
            else:
                case.record["id"] = f"r{i}"
            if case.expect == "rows":
                earlier.append(case.record["id"])
        out.append(case)
    return out


def write_cases(folder: Path, drawn: list[Case], as_bundle: bool) -> tuple[Path, list[str]]:
    if not as_bundle:
        path = write_ndjson(folder / "mutated.ndjson", [c.record for c in drawn])
        return path, [f"line {i + 1}" for i in range(len(drawn))]
    entries = [
        {"resource": c.record} if isinstance(c.record, dict) else {"fullUrl": "urn:uuid:x"}
        for c in drawn
    ]
    path = folder / "mutated.json"
    path.write_text(json.dumps({"resourceType": "Bundle", "type": "collection", "entry": entries}))
    return path, [f"entry {i}" for i in range(len(drawn))]


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(drawn=st.lists(cases(), min_size=1, max_size=12), as_bundle=st.booleans())
def test_mutated_records_are_each_accounted_for_once(drawn, as_bundle):
    drawn = assemble(drawn)
    if as_bundle:  # a Bundle entry is never blank: a garbage entry has no resource
        drawn = [
            Case(c.kind, c.mutation, c.record, "rejected") if c.expect == "nothing" else c
            for c in drawn
        ]
    with tempfile.TemporaryDirectory() as folder:
        path, locations = write_cases(Path(folder), drawn, as_bundle)
        store = RecordStore()
        read_fhir(path, store, max_rejected_share=1.0, today=TODAY)
        # the same file under a threshold: an error exactly when the share is crossed
        n_read = sum(c.expect != "nothing" for c in drawn)
        n_rejected = sum(c.expect == "rejected" for c in drawn)
        crossed = n_read > 0 and n_rejected / n_read > 0.25
        try:
            read_fhir(path, RecordStore(), max_rejected_share=0.25, today=TODAY)
        except HarmonizationError as error:
            assert crossed and path.name in str(error)
        else:
            assert not crossed
    assert_accounted(store)
    totals = store.totals()
    assert totals["read"] == n_read
    assert totals["excluded_at_read"] == sum(c.expect == "excluded" for c in drawn)
    rejected = store.table("rejected").set_index("location")
    assert rejected.index.is_unique and (rejected.reason.str.len() > 0).all()
    refs = set(store.frame("SELECT record_ref FROM persons UNION SELECT record_ref FROM events")
               .record_ref)  # fmt: skip
    for case, location in zip(drawn, locations, strict=True):
        ref = f"{path.name}:{location}"
        what = f"{case.kind} / {case.mutation} at {location}: {case.record!r:.300}"
        assert (location in rejected.index) == (case.expect == "rejected"), what
        assert (ref in refs) == (case.expect == "rows"), what
        if case.field is not None:
            assert rejected.loc[location, "field"] == case.field, what
        if case.shows is not None:
            column, value = case.shows
            rows = store.frame(f"SELECT {column} FROM events WHERE record_ref = ?", [ref])
            assert value in set(rows[column]), what


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=10),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=10,
)


@st.composite
def fuzzed(draw: st.DrawFn) -> dict:
    """A real resource with one to three elements (or sub-elements) set to arbitrary JSON."""
    kind = draw(st.sampled_from([k for k in DATE]))
    record = copy.deepcopy(base()[kind])
    model = MODELS[RESOURCE_TYPE.get(kind, kind)]
    names = sorted({f.alias or n for n, f in model.model_fields.items()} | set(record))
    for _ in range(draw(st.integers(1, 3))):
        path = [draw(st.sampled_from(names))]
        inner = record.get(path[0])
        if isinstance(inner, dict) and inner and draw(st.booleans()):
            path.append(draw(st.sampled_from(sorted(inner))))
        put(record, path, draw(json_values))
    return record


def test_a_primitive_extension_given_as_json_text_is_rejected_not_a_crash():
    """fhir.resources parses a string in ``_gender`` as JSON and its validator then fails with
    AttributeError on the number it finds (found by the fuzz test below)."""
    rejection = validate("Patient", {"resourceType": "Patient", "id": "x", "_gender": "0"})
    assert isinstance(rejection, Rejection) and "not valid FHIR" in rejection.reason


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(records=st.lists(fuzzed(), min_size=1, max_size=8))
def test_arbitrary_json_in_any_element_never_crashes_the_reader(records):
    with tempfile.TemporaryDirectory() as folder:
        path = write_ndjson(Path(folder) / "fuzzed.ndjson", records)
        store = RecordStore()
        read_fhir(path, store, max_rejected_share=1.0, today=TODAY)
    assert_accounted(store)
    assert store.totals()["read"] == len(records)
    assert (store.table("rejected").reason.str.len() > 0).all()


# ---------------------------------------------------------------- streaming
class CountingStore(RecordStore):
    """A store that records the size of every append."""

    def __init__(self) -> None:
        super().__init__()
        self.appends: list[tuple[str, int]] = []

    def append(self, table, rows):  # type: ignore[override]
        frame = rows if isinstance(rows, pd.DataFrame) else pd.DataFrame(list(rows))
        self.appends.append((table, len(frame)))
        super().append(table, frame)


def write_observations(path: Path, n: int) -> int:
    """``n`` copies of a real Observation (body height, ~700 bytes) with distinct ids."""
    template = base()["Observation"]
    with path.open("w") as handle:
        for i in range(n):
            handle.write(json.dumps(template | {"id": f"o{i}"}) + "\n")
    return path.stat().st_size


def test_large_ndjson_is_flushed_in_batches(tmp_path):
    """20,000 Observations with batches of 1,000 rows: the store receives 20 appends."""
    n, batch = 20_000, 1_000
    path = tmp_path / "Observation.000.ndjson"
    write_observations(path, n)
    store = CountingStore()
    started = time.perf_counter()
    read_fhir(path, store, batch_size=batch)
    elapsed = time.perf_counter() - started
    events = [rows for table, rows in store.appends if table == "events"]
    assert events == [batch] * (n // batch)
    assert store.totals() == {"unprocessed": 0, "read": n, "excluded_at_read": 0, "rejected": 0}
    print(f"\n{n / elapsed:,.0f} Observations/s ({n} in {elapsed:.1f} s)")


def test_memory_is_bounded_by_the_batch_not_the_file(tmp_path):
    """tracemalloc's peak: a fixed cost for the batch, plus the ids kept to refuse duplicates.

    Parsed, each of these ~800-byte lines takes several kB of Python objects;
    a reader holding the file (or its rows) would exceed the bound many times.
    The id set is the only part that grows with the input (~100 bytes per
    resource, plus the set's table).
    """
    n, batch = 5_000, 500
    path = tmp_path / "Observation.000.ndjson"
    size = write_observations(path, n)
    read_fhir(path, RecordStore(), batch_size=batch)  # warm caches outside the measure
    store = RecordStore()
    tracemalloc.start()
    try:
        read_fhir(path, store, batch_size=batch)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert store.totals()["read"] == n
    assert peak < 2e6 + 250 * n, f"peak {peak / 1e6:.2f} MB for a {size / 1e6:.2f} MB file"


def test_unvalidated_rows_read_in_one_process_are_bounded_by_the_batch(tmp_path):
    """tracemalloc's peak when every record is read without validation, in this process.

    Such records give no decision to apply, only rows; they must still be
    handed to the store by the batch, not held for the whole file. What
    grows with the input is the first pass's id keys (8 bytes a record,
    sorted once by numpy): the bound allows 50 bytes a record, where the
    rows held for the file take several hundred.
    """
    from harmonize.fhir import FhirReading

    n, batch = 20_000, 500
    path = tmp_path / "Observation.000.ndjson"
    template = base()["Observation"] | {"subject": {"reference": "Patient/p1"}}  # plain
    path.write_text("".join(json.dumps(template | {"id": f"o{i}"}) + "\n" for i in range(n)))

    def read() -> FhirReading:
        with FhirReading(path, RecordStore(), batch_size=batch, workers=1, defer=True) as reading:
            reading.read()
        return reading

    read()  # warm caches outside the measure
    tracemalloc.start()
    try:
        reading = read()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert reading.unvalidated[path.name] == n  # all read without validation
    assert peak < 2e6 + 50 * n, f"peak {peak / 1e6:.2f} MB for {n} unvalidated records"


# ---------------------------------------------------------------- worker processes
def test_worker_processes_give_the_same_store_as_one_process(tmp_path, monkeypatch):
    """Decisions taken in worker processes are applied in file order: same rows, same quarantine.

    Small blocks put duplicates, malformed lines and invalid resources in
    blocks other than their first occurrence's.
    """
    import harmonize.fhir_blocks as fhir_blocks
    from harmonize.synthetic_ehr import synthetic_ehr, write_fhir_ndjson

    folder = write_fhir_ndjson(synthetic_ehr(40, seed=3), tmp_path / "fhir")
    observations = (folder / "Observation.000.ndjson").read_bytes().splitlines()
    first = json.loads(observations[0])
    invalid = {**first, "id": "bad-1", "status": 17}
    future = {**first, "id": "future-1", "effectiveDateTime": "2999-01-01"}
    mutated = [*observations[:50], b"{not json", json.dumps(first).encode(),
               json.dumps(invalid).encode(), json.dumps(future).encode(),
               json.dumps({"resourceType": "Immunization", "id": "i1"}).encode(),
               *observations[50:]]  # fmt: skip
    (folder / "Observation.000.ndjson").write_bytes(b"\n".join(mutated) + b"\n")
    monkeypatch.setattr(fhir_blocks, "BLOCK_BYTES", 2_000)  # about 7 lines

    def tables(workers: int) -> dict[str, pd.DataFrame]:
        store = RecordStore()
        read_fhir(folder, store, today=date(2030, 1, 1), max_rejected_share=1.0, workers=workers)
        assert_accounted(store)
        return {
            name: store.table(name).sort_values(list(store.table(name).columns), ignore_index=True)
            for name in ("persons", "events", "read_counts", "excluded_at_read", "rejected")
        }

    one, two = tables(1), tables(2)
    for name in one:
        pd.testing.assert_frame_equal(one[name], two[name], obj=name)
    reasons = dict(zip(one["rejected"]["record_id"], one["rejected"]["reason"], strict=True))
    assert reasons[first["id"]] == "duplicated id"
    assert "future" in reasons["future-1"] and "not valid FHIR" in reasons["bad-1"]
    assert len(one["rejected"]) == 4
