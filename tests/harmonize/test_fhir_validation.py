"""Validating only what the frame relies on gives the frame, and the counts, of full validation.

A harmonisation run reads plain NDJSON Observations and Encounters without
validating them and validates in full the ones the frame relies on
(:mod:`harmonize.fhir`). The oracle is the same run with every record
validated as it is read (``validate_all=True``, the reader as it always
was), and, for an invalid record the fast run does not reject, the full run
on the same files with that record replaced by its valid *twin* (the record
before it was corrupted): the twin must leave the frame as it is and be
counted exactly as the fast run counts the invalid record. Lines that are
not JSON objects must be rejected with their line number whatever their
text looks like; :func:`harmonize.fhir_json.plain_rows` must give exactly
the rows ``fhir.resources`` and :mod:`harmonize.fhir_mapping` give; and
:func:`harmonize.fhir_json.parse_json` must read what ``json`` reads.
"""

from __future__ import annotations

import copy
import json
import math
import tempfile
import tomllib
from collections import Counter
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from harmonize.errors import HarmonizationFailed
from harmonize.fhir_decisions import decide
from harmonize.fhir_json import parse_json, plain_rows, record_key
from harmonize.fhir_mapping import Exclusion, Rejection, Rows
from harmonize.records import OUTSIDE_CONCEPTS
from harmonize.run import Harmonized, harmonize
from harmonize.spec import StudySpec, load_spec, parse_spec

DEMO = Path(__file__).resolve().parents[2] / "fedstats" / "examples" / "demo" / "study.toml"
TODAY = date(2024, 6, 1)
LOINC = "http://loinc.org"
SBP, BMI, HEART_RATE = "8480-6", "39156-5", "8867-4"  # heart rate: in no concept set
UNIT = {SBP: "mm[Hg]", BMI: "kg/m2", HEART_RATE: "/min"}
FEW = settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])

CORRUPTIONS = {
    # each leaves the record plain (read without validation) but not valid FHIR
    "unknown element": lambda r: r.update(bogus=1),
    "display not a string": lambda r: r["subject"].update(display=7),
    "meta.lastUpdated not an instant": lambda r: r.update(meta={"lastUpdated": "yesterday"}),
    "id not an id": lambda r: r.update(id=f"{r['id']} !"),
    "text without div": lambda r: r.update(text={"status": "generated"}),
}


# ---------------------------------------------------------------- the records
@dataclass
class Record:
    """One NDJSON line: the resource written, and the valid twin it was corrupted from."""

    file: str
    resource: dict[str, Any]
    twin: dict[str, Any] | None = None  # set when ``resource`` is a corrupted copy


@dataclass
class Export:
    records: list[Record] = field(default_factory=list)

    def write(self, folder: Path, swap: tuple[str, int] | None = None) -> Path:
        """The NDJSON files; ``swap`` = (file, index): that record written as its twin."""
        folder.mkdir(parents=True, exist_ok=True)
        lines: dict[str, list[str]] = {}
        for record in self.records:
            resource = record.resource
            if swap == (record.file, len(lines.get(record.file, []))):
                resource = record.twin
            lines.setdefault(record.file, []).append(json.dumps(resource))
        for name, text in lines.items():
            (folder / name).write_text("\n".join(text) + "\n")
        return folder

    def corrupted(self) -> dict[str, tuple[str, int]]:
        """``"<file>:line N"`` of each corrupted record -> (file, index in its file)."""
        seen: Counter[str] = Counter()
        out = {}
        for record in self.records:
            if record.twin is not None:
                out[f"{record.file}:line {seen[record.file] + 1}"] = (
                    record.file,
                    seen[record.file],
                )
            seen[record.file] += 1
        return out


def observation(oid: str, pid: str, code: str, day: str, value: float) -> dict[str, Any]:
    return {
        "resourceType": "Observation",
        "id": oid,
        "status": "final",
        "code": {"coding": [{"system": LOINC, "code": code}]},
        "subject": {"reference": f"Patient/{pid}"},
        "effectiveDateTime": day,
        "valueQuantity": {"value": value, "unit": UNIT[code], "code": UNIT[code]},
    }


def encounter(eid: str, pid: str, day: str) -> dict[str, Any]:
    return {
        "resourceType": "Encounter",
        "id": eid,
        "status": "finished",
        "class": {"code": "AMB"},
        "subject": {"reference": f"Patient/{pid}"},
        "period": {"start": day},
    }


days = st.dates(date(2004, 1, 1), date(2013, 12, 31)).map(date.isoformat)
visit_days = st.dates(date(2005, 1, 1), date(2012, 12, 31)).map(date.isoformat)
values = st.sampled_from([48.0, 95.5, 120.0, 135.2, 150.0, 190.0, 300.0, 18.5, 27.0, 45.0, 90.0])


@st.composite
def exports(draw: st.DrawFn) -> Export:
    """A few patients with visits and measurements, some corrupted, some repeated or odd.

    Measurements fall before and after the visits (inside and outside the
    look-back), some implausible (300 mm[Hg]) or outside the concept sets
    (heart rate); a few records share an id (validated as read; one that repeats a
    corrupted record's invalid id is itself corrupted, with its valid twin), are
    cancelled, or are of a shape the reader validates as it reads
    (a partial date, a missing unit, an absolute subject). Only visits and
    measurements in the concept sets are corrupted, so that full validation
    rejects each corrupted record (one outside the concept sets is excluded
    by both runs: see the last test).
    """
    export = Export()
    n_patients = draw(st.integers(1, 4))
    serial = 0
    ids: list[str] = []
    invalid_ids: set[str] = set()  # ids a corruption made invalid ("r1 !")
    for i in range(n_patients):
        pid = f"p{i}"
        died = draw(st.sampled_from([None, None, "2009-06-01", "2011-02-03", "2013-12-31"]))
        person: dict[str, Any] = {"resourceType": "Patient", "id": pid, "gender": "female"}
        # born 1990-06-15: 18 years old on 2008-06-15, within the visits' years
        person["birthDate"] = draw(st.sampled_from(["1940-02-03", "1990-06-15", "1999-12-31"]))
        if died:
            person["deceasedDateTime"] = died
        export.records.append(Record("Patient.000.ndjson", person))
        kinds = ["Encounter"] * draw(st.integers(1, 3)) + ["Observation"] * draw(st.integers(0, 6))
        for kind in kinds:
            serial += 1
            rid = f"r{serial}"
            if kind == "Encounter":
                resource = encounter(rid, pid, draw(visit_days))
            else:
                code = draw(st.sampled_from([SBP, SBP, BMI, HEART_RATE]))
                resource = observation(rid, pid, code, draw(days), draw(values))
            twin = None
            what = draw(st.sampled_from(["valid"] * 5 + ["corrupt"] * 3 + ["odd", "repeat"]))
            if what == "corrupt" and HEART_RATE not in json.dumps(resource):
                twin = resource
                resource = copy.deepcopy(resource)
                CORRUPTIONS[draw(st.sampled_from(sorted(CORRUPTIONS)))](resource)
            elif what == "odd":
                _odd(resource, draw(st.integers(0, 3)))
            elif what == "repeat" and (
                choices := ids
                if HEART_RATE not in json.dumps(resource)
                else [i for i in ids if i not in invalid_ids]
            ):
                repeated = draw(st.sampled_from(choices))
                if repeated in invalid_ids:  # a corrupted record's id: this one is corrupted too
                    twin, resource = resource, copy.deepcopy(resource)
                resource["id"] = repeated
            ids.append(resource["id"] if isinstance(resource["id"], str) else rid)
            if twin is not None and resource.get("id") != rid:
                invalid_ids.add(ids[-1])
            export.records.append(Record(f"{kind}.000.ndjson", resource, twin))
    order = draw(st.permutations(range(len(export.records))))
    export.records = [export.records[k] for k in order]
    return export


def _odd(resource: dict[str, Any], which: int) -> None:
    """A shape the reader validates as it reads it (not plain)."""
    if which == 0:
        resource["status"] = "cancelled"
    elif which == 1:
        resource["subject"]["reference"] = "https://ehr.example.org/Patient/" + (
            resource["subject"]["reference"].removeprefix("Patient/")
        )
    elif resource["resourceType"] == "Observation":
        if which == 2:
            resource["effectiveDateTime"] = resource["effectiveDateTime"][:7]  # partial
        else:
            del resource["valueQuantity"]["unit"], resource["valueQuantity"]["code"]
    else:
        resource["period"] = {"end": resource["period"]["start"]}  # no start: no date


def study() -> StudySpec:
    """The demo study with a one-year outcome window (so that short follow-ups count)."""
    raw = tomllib.loads(DEMO.read_text())
    raw["outcome"]["window_days"] = 365
    return parse_spec(raw)


def run(folder: Path, validate_all: bool, **options: Any) -> Harmonized:
    return harmonize(
        study(),
        site="s",
        fhir=folder,
        latest_date=TODAY,
        max_rejected_share=1.0,
        workers=options.pop("workers", 1),
        validate_all=validate_all,
        **options,
    )


def quarantine_rows(result: Harmonized) -> set[tuple]:
    frame = result.quarantine.astype(object).where(result.quarantine.notna(), None)
    return set(map(tuple, frame.itertuples(index=False)))


# ---------------------------------------------------------------- the property
@FEW
@given(export=exports())
def test_validating_what_the_frame_relies_on_gives_full_validations_frame_and_counts(export):
    """Same frame and counts as full validation; each difference is an unused invalid twin.

    Oracle: ``validate_all=True`` (every record validated as read). Every
    record the fast run rejects, full validation rejects with the same row
    of the quarantine. A record only full validation rejects must be one
    of the corrupted ones, and the full run with its valid twin in its place
    must give the same frame and count the twin as the fast run counts the
    corrupted record (the difference of the two runs' reason tables).
    """
    with tempfile.TemporaryDirectory() as root:
        folder = export.write(Path(root) / "export")
        fast, full = run(folder, False), run(folder, True)
        pd.testing.assert_frame_equal(fast.frame, full.frame)
        for result in (fast, full):
            result.report.check_balance()
        fast_report, full_report = fast.report, full.report
        assert fast_report.read == full_report.read
        assert fast_report.read_by_type == full_report.read_by_type
        assert fast_report.included == full_report.included
        assert fast_report.cohort_exclusions == full_report.cohort_exclusions
        assert full_report.not_validated == 0
        assert fast_report.not_validated <= fast_report.excluded
        fast_rows, full_rows = quarantine_rows(fast), quarantine_rows(full)
        assert fast_rows <= full_rows
        unused = {f"{row[0]}:{row[1]}": row for row in full_rows - fast_rows}
        corrupted = export.corrupted()
        assert set(unused) <= set(corrupted), sorted(set(unused) - set(corrupted))
        expected_excluded = Counter(full_report.excluded_by_reason)
        expected_rejected = Counter(full_report.rejected_by_reason)
        for ref in sorted(unused):
            twin = run(export.write(Path(root) / ref.replace(":", "_"), swap=corrupted[ref]), True)
            pd.testing.assert_frame_equal(twin.frame, full.frame)
            gained = Counter(twin.report.excluded_by_reason)
            gained.subtract(full_report.excluded_by_reason)
            lost = Counter(full_report.rejected_by_reason)
            lost.subtract(twin.report.rejected_by_reason)
            assert +gained == Counter({next(iter(+gained)): 1}), (ref, gained)
            assert +lost == Counter({unused[ref][5]: 1}), (ref, lost)
            assert twin.report.included == full_report.included
            expected_excluded += +gained
            expected_rejected -= +lost
    assert Counter(fast_report.excluded_by_reason) == +expected_excluded
    assert Counter(fast_report.rejected_by_reason) == +expected_rejected


def test_an_invalid_latest_value_is_rejected_and_the_one_before_enters():
    """Hand computation: p1's sbp values 120 (2010-01-02) and 150 (2010-03-04, not valid FHIR).

    The frame relies on the later one; validated, it is rejected with the
    reason ``fhir.resources`` gives, and 120 enters, as with full validation.
    The earlier 110 (2009) and a corrupted 99 (2008) are never relied on:
    the latter is counted as an earlier value, not rejected.
    """
    valid_late = observation("o2", "p1", SBP, "2010-03-04", 150.0)
    invalid_late = copy.deepcopy(valid_late) | {"bogus": 1}
    early_invalid = observation("o4", "p1", SBP, "2008-05-06", 99.0) | {"bogus": 2}
    export = Export(
        [
            Record("Patient.000.ndjson", {"resourceType": "Patient", "id": "p1",
                   "gender": "male", "birthDate": "1950-01-01", "deceasedDateTime": "2012-01-01"}),
            Record("Encounter.000.ndjson", encounter("e1", "p1", "2010-05-01")),
            Record("Observation.000.ndjson", observation("o1", "p1", SBP, "2010-01-02", 120.0)),
            Record("Observation.000.ndjson", invalid_late, valid_late),
            Record("Observation.000.ndjson", observation("o3", "p1", SBP, "2009-01-01", 110.0)),
            Record("Observation.000.ndjson", early_invalid),
        ]
    )  # fmt: skip
    with tempfile.TemporaryDirectory() as root:
        fast = run(export.write(Path(root)), False)
    assert fast.frame["sbp"].to_dict() == {"p1": 120.0}
    quarantine = fast.quarantine
    assert quarantine["location"].tolist() == ["line 2"]
    assert quarantine["reason"].iloc[0].startswith("not valid FHIR")
    assert quarantine["field"].iloc[0] == "bogus"
    report = fast.report
    assert report.rejected_by_reason == {quarantine["reason"].iloc[0]: 1}
    unused = "matched the study but not used (an earlier value, or outside the windows)"
    assert report.excluded_by_reason[unused] == 2  # 110 and the corrupted 99
    assert report.not_validated == 2
    assert any("2 records not validated with fhir.resources" in note for note in report.notes)


# ---------------------------------------------------------------- lines that are not records
@st.composite
def broken_lines(draw: st.DrawFn) -> bytes:
    """Text that a quick look could take for a plain Observation, but is no JSON object."""
    plain = json.dumps(observation("x", "p1", SBP, "2010-01-02", 120.0)).encode()
    kind = draw(st.sampled_from(["cut", "array", "scalar", "garbage", "two objects"]))
    if kind == "cut":
        return plain[: draw(st.integers(1, len(plain) - 1))]
    if kind == "array":
        return b"[" + plain + b"]"
    if kind == "two objects":
        return plain + b" " + plain
    if kind == "scalar":
        return draw(st.sampled_from([b"1", b"null", b'"Observation"', b"true", b"-0.5e3"]))
    text = draw(st.binary(min_size=1, max_size=40)).replace(b"\n", b" ")
    assume(text.strip())
    return text


@FEW
@given(
    lines=st.lists(st.tuples(st.booleans(), broken_lines()), min_size=1, max_size=10),
    validate_all=st.booleans(),
)
def test_a_line_that_is_no_json_object_is_rejected_with_its_line_number(lines, validate_all):
    """Whatever it looks like, a line that does not parse to an object is quarantined, never
    dropped: its location is its line number and it counts as read."""
    good = [json.dumps(observation(f"o{i}", "p1", SBP, "2010-01-02", 120.0)).encode()
            for i in range(len(lines))]  # fmt: skip
    written, expected = [], {}
    for (before, broken), line in zip(lines, good, strict=True):
        for item in [broken, line] if before else [line, broken]:
            written.append(item)
            if item is broken:
                try:
                    parsed = json.loads(broken)
                except (ValueError, RecursionError):
                    parsed = None
                if isinstance(parsed, dict):  # garbage can be an object; then it is read
                    continue
                expected[f"line {len(written)}"] = broken
    patient = {"resourceType": "Patient", "id": "p1", "gender": "male", "birthDate": "1950-01-01"}
    with tempfile.TemporaryDirectory() as root:
        folder = Path(root)
        (folder / "Observation.000.ndjson").write_bytes(b"\n".join(written) + b"\n")
        (folder / "Patient.000.ndjson").write_text(json.dumps(patient) + "\n")
        result = run(folder, validate_all)
    quarantine = result.quarantine.set_index("location")
    for location in expected:
        assert location in quarantine.index, (location, expected[location])
        reason = quarantine.loc[location, "reason"]
        assert reason.startswith(("malformed JSON", "not a JSON object", "missing resourceType"))
    report = result.report
    assert report.read == len(written) + 1
    report.check_balance()


# ---------------------------------------------------------------- the quick look is exact
valid_codings = st.lists(
    st.builds(
        lambda system, code: {"system": system, "code": code},
        st.sampled_from([LOINC, "http://snomed.info/sct"]),
        st.sampled_from([SBP, BMI, HEART_RATE, "44054006"]),
    ),
    min_size=1,
    max_size=3,
)
odd_codings = st.lists(
    st.fixed_dictionaries(
        {},
        optional={
            "system": st.sampled_from([LOINC, "urn:x", "", 5, None]),
            "code": st.sampled_from([SBP, "", None, 7, " x", "a b"]),
            "display": st.sampled_from(["Systolic", 3]),
        },
    ),
    max_size=3,
)
concepts = st.one_of(
    st.builds(lambda coding: {"coding": coding}, valid_codings),
    st.builds(lambda coding: {"coding": coding}, valid_codings),
    st.builds(lambda coding: {"coding": coding, "text": "t"}, odd_codings),
    st.sampled_from([None, {"text": "pulse"}, {"coding": "x"}, [], 5]),
)
numbers = st.one_of(
    st.floats(allow_nan=False, allow_infinity=False, width=64),
    st.integers(-(2**70), 2**70),
    st.sampled_from(["12", True, None]),
)
quantities = st.one_of(
    st.builds(
        lambda value, unit: {"value": value, "unit": unit, "code": unit,
                             "system": "http://unitsofmeasure.org"},
        numbers,
        st.sampled_from(["mm[Hg]", "kg/m2"]),
    ),
    st.fixed_dictionaries(
        {},
        optional={
            "value": numbers,
            "unit": st.sampled_from(["mm[Hg]", "", " mm", 4]),
            "code": st.sampled_from(["mm[Hg]", "kg/m2", ""]),
            "comparator": st.sampled_from(["<", ">=", "about", None]),
            "system": st.sampled_from(["http://unitsofmeasure.org", 5]),
        },
    ),
    st.sampled_from([None, "5 mm", []]),
)  # fmt: skip
date_texts = st.one_of(
    days,
    st.sampled_from(
        ["2015-03-04T23:30:00-05:00", "2015-03-04T00:30:00+14:00", "2015-06-30T23:59:60Z",
         "2015-03-04T10:00:00.123456789Z", "2015-03", "2015", "2015-02-30",
         "2015-03-04T10:00:00", "2099-01-01", "0001-01-01", " 2015-03-04",
         "2015-03-04T24:00:00Z", 20150304, None]
    ),
)  # fmt: skip
subjects = st.one_of(
    st.builds(
        lambda reference: {"reference": reference},
        st.sampled_from(
            ["Patient/p1", "Patient/p-1.a/_history/2", "https://x.org/fhir/Patient/p1",
             "urn:uuid:p1", "#c1", "Group/1", " Patient/p1", "Patient/p1\n", "a/Patient/p1",
             "", "Patient/", 9, None]
        ),
    ),
    st.sampled_from([{"reference": "Patient/p1", "display": "Ann"}, None, "Patient/p1", {}]),
)  # fmt: skip
MUTABLE = {
    "Observation": {
        "id": st.sampled_from(["b.2", "bad id", 5, None]),
        "status": st.sampled_from(
            ["final", "amended", "cancelled", "entered-in-error", "bogus", 3]
        ),
        "subject": subjects,
        "code": concepts,
        "effectiveDateTime": date_texts,
        "effectivePeriod": st.just({"start": "2015-01-01"}),
        "issued": st.sampled_from(["2015-03-04T10:00:00Z", "nope"]),
        "valueQuantity": quantities,
        "valueString": st.just("high"),
        "component": st.one_of(
            st.lists(
                st.fixed_dictionaries({"code": concepts}, optional={"valueQuantity": quantities}),
                max_size=2,
            ),
            st.sampled_from(["x", [None]]),
        ),
        "category": st.sampled_from([[{"coding": [{"code": "vital-signs"}]}], "vital"]),
        "contained": st.just([{"resourceType": "Patient", "id": "c1"}]),
    },
    "Encounter": {
        "id": st.sampled_from(["b.2", "bad id", 5, None]),
        "status": st.sampled_from(["finished", "cancelled", "entered-in-error", "bogus", 3]),
        "subject": subjects,
        "class": st.sampled_from([{"code": "AMB"}, "AMB", None]),
        "period": st.one_of(
            st.builds(lambda start: {"start": start}, date_texts),
            st.sampled_from([{"end": "2015-01-01"}, "2015-01-01", None]),
        ),
        "type": st.one_of(st.lists(concepts, max_size=3), st.sampled_from([{"coding": []}, None])),
    },
}


@st.composite
def plain_looking(draw: st.DrawFn) -> dict[str, Any]:
    """A valid plain Observation or Encounter with up to four elements changed or removed."""
    kind = draw(st.sampled_from(["Observation", "Encounter"]))
    if kind == "Observation":
        resource = observation("a1", "p1", SBP, "2015-03-04", 120.0)
    else:
        resource = encounter("a1", "p1", "2010-05-01")
    mutable = MUTABLE[kind]
    for name in draw(st.lists(st.sampled_from(sorted(mutable)), max_size=4, unique=True)):
        if name in resource and draw(st.integers(0, 4)) == 0:
            del resource[name]
        else:
            resource[name] = draw(mutable[name])
    return resource


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(resource=plain_looking())
def test_plain_rows_are_the_rows_of_the_validated_resource(resource):
    """When the quick look gives rows, ``fhir.resources`` either refuses the resource as
    not valid FHIR or it maps to exactly those rows: no mapping problem (a date, a unit, a
    subject, a status) goes unseen by the quick look, and no row differs."""
    ref = "Observation.000.ndjson:line 3"
    rows = plain_rows(copy.deepcopy(resource), ref, TODAY)
    decision = decide(copy.deepcopy(resource), ref, TODAY)
    outcome = decision.outcome
    if rows is None:
        return
    assert not isinstance(outcome, Exclusion), outcome
    if isinstance(outcome, Rejection):
        assert outcome.reason.startswith("not valid FHIR"), (outcome, resource)
        return
    assert isinstance(outcome, Rows) and outcome.subject is None and not outcome.persons
    assert outcome.rows == rows, (outcome.rows, rows)


def test_the_benchmark_shapes_are_plain():
    """The synthetic export's Observations and Encounters are read without validation."""
    from harmonize.synthetic_ehr import synthetic_ehr, write_fhir_ndjson

    with tempfile.TemporaryDirectory() as root:
        folder = write_fhir_ndjson(synthetic_ehr(5, seed=1), Path(root))
        for name in ("Observation", "Encounter"):
            for number, line in enumerate(
                (folder / f"{name}.000.ndjson").read_bytes().split(b"\n")
            ):
                if line:
                    resource = json.loads(line)
                    assert plain_rows(resource, f"x:line {number + 1}", TODAY) is not None


# ---------------------------------------------------------------- parsing
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats() | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner),
    max_leaves=15,
)


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return (math.isnan(a) and math.isnan(b)) or (
            a == b and math.copysign(1, a) == math.copysign(1, b)
        )
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


@settings(max_examples=300, deadline=None)
@given(
    value=json_values,
    ascii_only=st.booleans(),
    noise=st.one_of(st.none(), st.binary(max_size=12)),
)
def test_parse_json_reads_what_json_reads(value, ascii_only, noise):
    """Equal values for JSON ``json.dumps`` writes (NaN and Infinity included), and an error
    exactly when ``json.loads`` raises one, for those bytes with noise appended."""
    text = json.dumps(value, ensure_ascii=ascii_only).encode("utf-8", "surrogatepass")
    if noise is not None:
        text += noise
    try:
        expected = json.loads(text)
    except (ValueError, RecursionError):
        with pytest.raises((ValueError, RecursionError)):
            parse_json(text)
        return
    assert _same(parse_json(text), expected)


def test_integers_beyond_64_bits_become_the_nearest_double():
    """The one documented difference from ``json``: no mapped element is an integer."""
    assert parse_json(b"[123456789012345678901234567890]") == [
        float(123456789012345678901234567890)
    ]


def test_record_keys_tell_types_and_ids_apart():
    assert record_key("Observation", "a") == record_key("Observation", "a")
    assert record_key("Observation", "a") != record_key("Encounter", "a")
    assert record_key("Observation", 5) == record_key("Observation", "5")
    assert record_key("Observation", None) is None and record_key("Observation", True) is None


# ---------------------------------------------------------------- processes and failures
def test_worker_processes_give_the_same_run_as_one_process(tmp_path, monkeypatch):
    """Blocks read and validated by two workers: the same frame, report counts and quarantine."""
    import harmonize.fhir_blocks as fhir_blocks
    from harmonize.synthetic_ehr import synthetic_ehr, write_fhir_ndjson

    folder = write_fhir_ndjson(synthetic_ehr(60, seed=5, measurements_per_patient=6), tmp_path)
    path = folder / "Observation.000.ndjson"
    lines = path.read_bytes().splitlines()
    corrupt = json.loads(lines[-1]) | {"bogus": 1}  # the last sbp of the last patient
    path.write_bytes(b"\n".join([*lines[:-1], json.dumps(corrupt).encode(), b"{cut"]) + b"\n")
    monkeypatch.setattr(fhir_blocks, "BLOCK_BYTES", 3_000)
    one, two = run(folder, False, workers=1), run(folder, False, workers=2)
    pd.testing.assert_frame_equal(one.frame, two.frame)
    for name in ("read", "included", "excluded_by_reason", "rejected_by_reason", "not_validated"):
        assert getattr(one.report, name) == getattr(two.report, name), name
    assert quarantine_rows(one) == quarantine_rows(two)
    assert "validated by 2 worker processes" in " ".join(two.report.notes)


def test_a_file_whose_relied_on_records_fail_stops_the_run_and_balances(tmp_path):
    """Every sbp the frame takes is not valid FHIR: 6 of 13 records of the file rejected while
    validating (46 %, over 10 %): the run stops with a balanced report naming the file. The
    frame built before had quarantined an implausible bmi (8 kg/m2); no frame comes of the
    run, so that record is unclassified like the others, not rejected."""
    patients, observations = [], []
    for i in range(6):
        patients.append({"resourceType": "Patient", "id": f"p{i}", "gender": "male",
                         "birthDate": "1950-01-01", "deceasedDateTime": "2012-01-01"})  # fmt: skip
        observations.append(encounter(f"e{i}", f"p{i}", "2010-05-01"))
        observations.append(observation(f"o{i}", f"p{i}", SBP, "2010-01-02", 120.0) | {"bogus": 1})
    observations.append(observation("b0", "p0", BMI, "2010-01-02", 8.0))
    (tmp_path / "Patient.000.ndjson").write_text("\n".join(map(json.dumps, patients)) + "\n")
    (tmp_path / "Mixed.000.ndjson").write_text("\n".join(map(json.dumps, observations)) + "\n")
    with pytest.raises(HarmonizationFailed) as caught:
        harmonize(load_spec(DEMO), site="s", fhir=tmp_path, latest_date=TODAY, workers=1)
    report = caught.value.report
    report.check_balance()
    assert "Mixed.000.ndjson: 6 of 13 records rejected" in str(caught.value)
    assert report.rejected == 6 and report.read == 19
    assert report.unprocessed == 19 - 6  # read, mapped to rows, never classified
    assert set(caught.value.quarantine["reason"].str[:14]) == {"not valid FHIR"}


def test_outside_the_concept_sets_an_unused_invalid_record_is_never_rejected(tmp_path):
    """A heart-rate Observation not valid FHIR, for a patient in the frame: counted outside
    the concept sets both ways (full validation excludes it at read, the frame by its rows)."""
    person = {"resourceType": "Patient", "id": "p1", "gender": "male", "birthDate": "1950-01-01",
              "deceasedDateTime": "2012-01-01"}  # fmt: skip
    rate = observation("h1", "p1", HEART_RATE, "2010-01-02", 70.0) | {"bogus": 1}
    (tmp_path / "Patient.000.ndjson").write_text(json.dumps(person) + "\n")
    (tmp_path / "Encounter.000.ndjson").write_text(json.dumps(encounter("e", "p1", "2010-05-01")))
    (tmp_path / "Observation.000.ndjson").write_text(json.dumps(rate) + "\n")
    for validate_all in (False, True):
        report = run(tmp_path, validate_all).report
        assert report.excluded_by_reason[OUTSIDE_CONCEPTS] == 1 and report.rejected == 0


def _person(pid: str, **extra: Any) -> dict[str, Any]:
    return {"resourceType": "Patient", "id": pid, "gender": "male", "birthDate": "1950-01-01"} | (
        extra
    )


def _write(folder: Path, files: dict[str, list[dict[str, Any]]]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name, resources in files.items():
        (folder / name).write_text("".join(json.dumps(r) + "\n" for r in resources))
    return folder


def test_the_last_record_of_a_follow_up_is_validated_before_it_keeps_a_patient(tmp_path):
    """Hand computation (outcome: death within 365 days of the index visit, 2010-01-01).

    p1 is alive; her records after the index are a visit on 2010-06-01 and a
    heart-rate Observation on 2011-06-01 that is not valid FHIR. Only that
    Observation would make her follow-up reach a year: full validation
    excludes her (follow-up shorter than the outcome window), and so must the
    run that validates only what the frame relies on.
    """
    rate = observation("h1", "p1", HEART_RATE, "2011-06-01", 70.0) | {"bogus": 1}
    visits = [encounter("e1", "p1", "2010-01-01"), encounter("e2", "p1", "2010-06-01")]
    files = {"Patient.000.ndjson": [_person("p1")], "Encounter.000.ndjson": visits,
             "Observation.000.ndjson": [rate]}  # fmt: skip
    folder = _write(tmp_path / "invalid", files)
    for validate_all in (False, True):
        result = run(folder, validate_all)
        assert result.frame.empty
        assert result.report.cohort_exclusions == {"follow-up shorter than the outcome window": 1}
    swapped = _write(tmp_path / "valid", files | {"Observation.000.ndjson": [
        observation("h1", "p1", HEART_RATE, "2011-06-01", 70.0)]})  # fmt: skip
    assert run(swapped, True).frame.index.tolist() == ["p1"]  # the valid one would keep her


def test_a_unit_converted_through_a_molar_mass_has_every_record_validated(tmp_path):
    """Hand computation: a concept set of total cholesterol (2093-3) and glucose (2345-7)
    converted to mg/dL. p1's latest value is cholesterol 5.0 mmol/L (2010-03-01); an
    older glucose 5.0 mmol/L (2009-03-01) is not valid FHIR. The molar mass is the first
    listed analyte any code of the unit's records names: with the glucose record, glucose's
    (180.156 g/mol: 90.08 mg/dL); without it, cholesterol's (386.65 g/mol: 193.33 mg/dL).
    Full validation rejects the glucose record; so must the fast run, which gives 193.33."""
    raw = tomllib.loads(DEMO.read_text())
    raw["outcome"]["window_days"] = 365
    raw["concept_sets"]["lipid"] = {"loinc": ["2093-3", "2345-7"]}
    raw["covariates"].append(
        {"name": "lipid", "kind": "last_value", "concepts": "lipid", "unit": "mg/dL",
         "range": [10, 1000], "lookback_days": 1825}
    )  # fmt: skip
    spec = parse_spec(raw)

    def lab(oid: str, code: str, day: str, bogus: bool) -> dict[str, Any]:
        resource = observation(oid, "p1", SBP, day, 5.0)
        resource["code"]["coding"][0]["code"] = code
        resource["valueQuantity"] |= {"unit": "mmol/L", "code": "mmol/L"}
        return resource | ({"bogus": 1} if bogus else {})

    files = {
        "Patient.000.ndjson": [_person("p1", deceasedDateTime="2010-09-01")],
        "Encounter.000.ndjson": [encounter("e1", "p1", "2010-05-01")],
        "Observation.000.ndjson": [lab("c", "2093-3", "2010-03-01", False),
                                   lab("g", "2345-7", "2009-03-01", True)],
    }  # fmt: skip
    folder = _write(tmp_path, files)
    results = [
        harmonize(spec, site="s", fhir=folder, latest_date=TODAY, workers=1, validate_all=full,
                  max_rejected_share=1.0)
        for full in (False, True)
    ]  # fmt: skip
    for result in results:
        assert result.frame["lipid"].tolist() == [pytest.approx(5.0 * 386.65 / 10)]
        assert result.quarantine["location"].tolist() == ["line 2"]


# ---------------------------------------------------------------- the first pass
def _compact(resource: dict[str, Any]) -> str:
    return json.dumps(resource, separators=(",", ":"))


PLAIN_LINES = {
    "observation": lambda i: _compact(observation(f"o{i}", "p1", SBP, "2010-01-02", 1.0)),
    "encounter": lambda i: _compact(encounter(f"e{i}", "p1", "2010-01-02")),
    "repeated id": lambda i: _compact(encounter("e0", "p1", "2010-01-02")),
}
OTHER_LINES = {
    "spaced": lambda i: json.dumps(observation(f"s{i}", "p1", SBP, "2010-01-02", 1.0)),
    "blank": lambda i: "   ",
    "empty": lambda i: "",
    "escaped id": lambda i: '{"resourceType":"Observation","id":"x\\u0041' + str(i) + '"}',
    "second id": lambda i: '{"resourceType":"Observation","id":"a","id":"b' + str(i) + '"}',
    "second type": lambda i: '{"resourceType":"Encounter","id":"m' + str(i)
    + '","resourceType":"Medication","code":{"coding":[{"code":"1"}]}}',
    "medication": lambda i: '{"resourceType":"Medication","id":"m' + str(i) + '"}',
    "contained": lambda i: '{"resourceType":"Observation","id":"c' + str(i)
    + '","contained":[{"resourceType":"Patient","id":"p"}]}',
    "not json": lambda i: '{"resourceType":"Observation","id":"q' + str(i) + '",',
    "cut type": lambda i: '{"resourceType":"Observation"',
}  # fmt: skip


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    kinds=st.lists(st.sampled_from(sorted(PLAIN_LINES) * 4 + sorted(OTHER_LINES)), max_size=30),
    final_newline=st.booleans(),
    block_bytes=st.integers(50, 3_000),
)
def test_a_block_surveyed_whole_is_surveyed_as_line_by_line(kinds, final_newline, block_bytes):
    """Lines, records, Medications and id keys of each block: the same whether the block is
    searched whole (when every line is plain) or line by line."""
    from harmonize.fhir_blocks import _survey_lines, _survey_plain_block, renumber, split

    table = PLAIN_LINES | OTHER_LINES
    text = "\n".join(table[kind](i) for i, kind in enumerate(kinds))
    with tempfile.TemporaryDirectory() as root:
        path = Path(root) / "x.ndjson"
        path.write_text(text + ("\n" if final_newline and kinds else ""))
        blocks = split(path, block_bytes)
        slow = [_survey_lines(block, True) for block in blocks]
        quick = [_survey_plain_block(block) for block in blocks]
        for block, by_line, whole_block in zip(renumber(blocks, slow), slow, quick, strict=True):
            if whole_block is not None:
                assert whole_block == by_line, block
        if kinds and all(kind in PLAIN_LINES for kind in kinds) and final_newline:
            assert all(whole_block is not None for whole_block in quick)


def _escaped(line: str) -> str:
    return line.replace('"Observation"', '"Observ\\u0061tion"')


def _typed_twice(line: str) -> str:
    first = '{"resourceType": "Observation"'
    return line.replace(first, '{"resourceType": "Patient", "resourceType": "Observation"')


def _utf16(line: str) -> bytes:
    return line.encode("utf-16")


@pytest.mark.parametrize("spell", [_escaped, _typed_twice, _utf16])
def test_a_twin_spelled_otherwise_is_found_before_its_plain_twin_is_read(tmp_path, spell):
    """Two Observations share an id; the second spells itself so that its bytes do not begin
    ``{"resourceType":"Observation"`` (an escape, the key written twice, UTF-16, all of which
    ``json`` reads as the same resource). The run that validates only what the frame relies
    on must still see the shared id and validate both, as full validation does: same frame,
    same counts, same quarantine (the second refused as a duplicated id)."""
    sbp = observation("o1", "p1", SBP, "2010-01-02", 120.0)
    twin = observation("o1", "p1", SBP, "2010-01-03", 130.0)
    _write(tmp_path, {"Patient.000.ndjson": [_person("p1", deceasedDateTime="2012-01-01")],
                      "Encounter.000.ndjson": [encounter("e", "p1", "2010-05-01")],
                      "Observation.000.ndjson": [sbp]})  # fmt: skip
    line = spell(json.dumps(twin))
    # the file's last line, with no newline after it (a UTF-16 line ending in one is malformed)
    (tmp_path / "Observation.001.ndjson").write_bytes(
        line if isinstance(line, bytes) else line.encode()
    )
    assert json.loads(line) == twin
    fast, full = run(tmp_path, False), run(tmp_path, True)
    pd.testing.assert_frame_equal(fast.frame, full.frame)
    assert quarantine_rows(fast) == quarantine_rows(full)
    assert fast.report.rejected_by_reason == full.report.rejected_by_reason
    assert fast.report.excluded_by_reason == full.report.excluded_by_reason
    assert "duplicated id" in set(full.quarantine["reason"])
