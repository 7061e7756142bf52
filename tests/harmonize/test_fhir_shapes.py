"""Valid FHIR R4 in the shapes real servers export must be read as FHIR, not rejected.

Each test writes small resources in the shapes of the FHIR R4 specification
(Bundle 2.36, References 2.3, Contained resources 2.40, Medication 12.19) and
compares the harmonised frame with what a hand computation in the test says
it must hold: a collection Bundle of per-patient Bundles; a transaction
Bundle whose Patients are POSTed with ``urn:uuid`` fullUrls and whose
DELETE/GET entries carry no resource; a subject naming a contained
Patient; Medications coded only through their ingredients; Patients
without a birth date or deceased without a date; records whose codes are in
no concept set; and a failed run, whose report must balance and come with
its quarantine.
"""

from __future__ import annotations

import json
import tempfile
import tomllib
import uuid
from datetime import date
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harmonize.errors import BundleTooDeep, HarmonizationFailed
from harmonize.fhir import NOT_READ, read_fhir
from harmonize.fhir_medications import MAX_BUNDLE_DEPTH
from harmonize.frame import DECEASED_UNDATED
from harmonize.records import OUTSIDE_CONCEPTS, RecordStore
from harmonize.report import HarmonizationReport, UnbalancedReport
from harmonize.run import harmonize, write_failed_outputs
from harmonize.spec import parse_spec

DEMO = Path(__file__).resolve().parents[2] / "fedstats" / "examples" / "demo" / "study.toml"
LOINC = "http://loinc.org"
RXNORM = "http://www.nlm.nih.gov/research/umls/rxnorm"
SBP = "8480-6"  # systolic blood pressure, the demo study's sbp
HEART_RATE = "8867-4"  # in no concept set of the demo study
SIMVASTATIN_INGREDIENT = "36567"
AMLODIPINE_INGREDIENT = "17767"
TODAY = date(2024, 6, 1)
VISIT = "2010-05-01"
FEW = settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# ---------------------------------------------------------------- resources
def patient(pid: str | None, birth: str | None = "1950-01-01", **extra: Any) -> dict[str, Any]:
    """A Patient who died two years after the visit, unless ``deceasedBoolean`` is given.

    (The death date gives the follow-up the demo study's one-year outcome needs.)
    """
    died = {} if "deceasedBoolean" in extra else {"deceasedDateTime": "2012-06-01"}
    resource: dict[str, Any] = {"resourceType": "Patient", "gender": "female", **died, **extra}
    if pid is not None:
        resource["id"] = pid
    if birth is not None:
        resource["birthDate"] = birth
    return resource


def encounter(subject: str, day: str = VISIT, **extra: Any) -> dict[str, Any]:
    return {
        "resourceType": "Encounter",
        "status": "finished",
        "class": {"code": "AMB"},
        "subject": {"reference": subject},
        "period": {"start": day},
        **extra,
    }


def observation(subject: str, value: float, day: str | None = "2010-04-01", code: str = SBP):
    resource: dict[str, Any] = {
        "resourceType": "Observation",
        "status": "final",
        "code": {"coding": [{"system": LOINC, "code": code}]},
        "subject": {"reference": subject},
        "valueQuantity": {"value": value, "unit": "mmHg", "code": "mm[Hg]"},
    }
    if day is not None:
        resource["effectiveDateTime"] = day
    return resource


def entries(*resources: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"resource": r} for r in resources]


def bundle(kind: str, items: list[dict[str, Any]]) -> dict[str, Any]:
    return {"resourceType": "Bundle", "type": kind, "entry": items}


def write(path: Path, document: dict[str, Any]) -> Path:
    path.write_text(json.dumps(document))
    return path


def write_ndjson(path: Path, resources: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in resources))
    return path


def study(*, min_age: int = 18, statin_codes: tuple[str, ...] = ()):
    """The demo study (outcome window one year), optionally with more statin codes."""
    raw = tomllib.loads(DEMO.read_text())
    raw["outcome"]["window_days"] = 365
    raw["cohort"]["min_age"] = min_age
    raw["concept_sets"]["statins"]["rxnorm"] += list(statin_codes)
    return parse_spec(raw)


def age(birth: str, index: str = VISIT) -> float:
    return (date.fromisoformat(index) - date.fromisoformat(birth)).days / 365.25


def run(folder: Path, spec=None, **options: Any):
    return harmonize(spec or study(), site="s", fhir=folder, latest_date=TODAY, **options)


# ---------------------------------------------------------------- Bundle of Bundles
@given(
    observations=st.lists(
        st.lists(st.integers(90, 200), min_size=1, max_size=4), min_size=1, max_size=5
    ),
    depth=st.integers(2, MAX_BUNDLE_DEPTH),
)
@FEW
def test_a_bundle_of_bundles_is_walked_to_its_resources(observations, depth):
    """A collection of per-patient Bundles (nested ``depth`` deep): every resource is a record.

    Hand computation: patient i's sbp is the value of its latest Observation
    (dated day j+1 of April 2010 for the j-th); every Observation is read.
    """
    per_patient = []
    expected_sbp = {}
    for i, values in enumerate(observations):
        pid = f"p{i}"
        obs = [
            observation(f"Patient/{pid}", v, f"2010-04-{j + 1:02d}") for j, v in enumerate(values)
        ]
        inner = bundle("collection", entries(patient(pid), encounter(f"Patient/{pid}"), *obs))
        for _ in range(depth - 2):  # wrap it further: depth counts the outer Bundle too
            inner = bundle("collection", entries(inner))
        per_patient.append(inner)
        expected_sbp[pid] = float(values[-1])
    with tempfile.TemporaryDirectory() as folder:
        write(Path(folder) / "all.json", bundle("collection", entries(*per_patient)))
        result = run(Path(folder))
    report = result.report
    n_obs = sum(len(v) for v in observations)
    assert report.read_by_type == {
        "Patient": len(observations),
        "Encounter": len(observations),
        "Observation": n_obs,
    }
    assert report.rejected == 0 and report.balanced
    assert result.frame["sbp"].to_dict() == expected_sbp


def test_bundles_nested_beyond_the_limit_are_a_typed_error_naming_the_entry(tmp_path):
    inner = bundle("collection", entries(patient("p1")))
    for _ in range(MAX_BUNDLE_DEPTH):
        inner = bundle("collection", entries(inner))
    path = write(tmp_path / "deep.json", inner)
    with pytest.raises(BundleTooDeep, match=r"deep\.json: entry 0(/entry 0)+: Bundles nested"):
        read_fhir(path, RecordStore())
    store = RecordStore()
    read_fhir(write(path, inner["entry"][0]["resource"]), store)  # one level less is read
    assert store.table("persons").person_id.tolist() == ["p1"]
    assert store.table("persons").record_ref.tolist() == [
        "deep.json:" + "/".join(["entry 0"] * MAX_BUNDLE_DEPTH)
    ]


# ---------------------------------------------------------------- transactions
@given(
    ids=st.lists(st.uuids(), min_size=2, max_size=4, unique=True),
    with_id=st.booleans(),
    seed=st.randoms(use_true_random=False),
)
@FEW
def test_a_transaction_bundle_resolves_urn_uuid_identities_and_skips_requests(ids, with_id, seed):
    """POSTed Patients are named by their fullUrl; DELETE and GET entries are not data.

    Hand computation: patient k is born in 1950 + k, has one visit and one
    sbp of 100 + k; its person id is its ``id`` if it has one, else its
    fullUrl. The entries come in any order (a reference may precede its
    Patient).
    """
    items: list[dict[str, Any]] = []
    expected: dict[str, tuple[float, float]] = {}
    for k, value in enumerate(ids):
        url = f"urn:uuid:{value}"
        pid = f"pat-{k}" if with_id else None
        birth = f"{1950 + k}-01-01"
        items.append(
            {
                "fullUrl": url,
                "resource": patient(pid, birth),
                "request": {"method": "POST", "url": "Patient"},
            }
        )
        for resource in (encounter(url), observation(url, 100 + k)):
            items.append(
                {
                    "fullUrl": f"urn:uuid:{uuid.UUID(int=seed.getrandbits(128))}",
                    "resource": resource,
                    "request": {"method": "POST", "url": resource["resourceType"]},
                }
            )
        expected[pid or url] = (age(birth), 100.0 + k)
    items += [
        {"request": {"method": "DELETE", "url": "Patient/old"}},
        {"request": {"method": "GET", "url": "Observation?code=8480-6"}},
        {"request": {"method": "DELETE", "url": "Encounter/e9"}},
    ]
    seed.shuffle(items)
    with tempfile.TemporaryDirectory() as folder:
        write(Path(folder) / "tx.json", bundle("transaction", items))
        result = run(Path(folder))
    report = result.report
    assert report.rejected == 0, report.to_text()
    assert report.excluded_by_reason["not data: a DELETE request"] == 2
    assert report.excluded_by_reason["not data: a GET request"] == 1
    assert report.read == 3 * len(ids) + 3 and report.balanced
    frame = result.frame
    got = {pid: (row.age, row.sbp) for pid, row in frame.iterrows()}
    assert got.keys() == expected.keys()
    for pid, (years, sbp) in expected.items():
        assert got[pid] == (pytest.approx(years), sbp)


def test_a_patient_with_an_id_is_named_by_it_when_referenced_by_its_full_url(tmp_path):
    """``urn:uuid:X`` names the entry with that fullUrl, whose Patient's id is ``p9``."""
    url = "urn:uuid:0c3a4f7e-5b8d-4d0e-9a61-2f8e6c1d9b70"
    items = [
        {"fullUrl": url, "resource": patient("p9")},
        {"fullUrl": "https://h.example/fhir/Patient/p8", "resource": patient("p8", "1960-01-01")},
        {"resource": encounter(url)},
        {"resource": observation(url, 131)},
        {"resource": encounter("https://h.example/fhir/Patient/p8")},
        {"resource": observation("Patient/p8", 122)},
    ]
    write(tmp_path / "b.json", bundle("batch", items))
    frame = run(tmp_path).frame
    assert frame["sbp"].to_dict() == {"p8": 122.0, "p9": 131.0}
    assert frame["age"].to_dict() == pytest.approx(
        {"p8": age("1960-01-01"), "p9": age("1950-01-01")}
    )


# ---------------------------------------------------------------- contained Patient
def test_a_subject_naming_a_contained_patient_is_that_patient(tmp_path):
    """``subject: #newborn`` names the Patient in ``contained``: a person of its own.

    Hand computation: born 2010-03-01, index visit 2010-05-01, so age
    61/365.25 years, sex female; the Condition naming a missing ``#nobody``
    is the one rejection.
    """
    newborn = patient("newborn", "2010-03-01")
    visit = encounter("#newborn", id="e1", contained=[newborn])
    orphan = {
        "resourceType": "Condition",
        "id": "c1",
        "subject": {"reference": "#nobody"},
        "code": {"coding": [{"system": "http://snomed.info/sct", "code": "44054006"}]},
        "onsetDateTime": "2010-04-01",
    }
    write_ndjson(tmp_path / "Encounter.ndjson", [visit, orphan])
    result = run(tmp_path, study(min_age=0), max_rejected_share=0.5)
    frame = result.frame
    assert frame.index.tolist() == ["Encounter/e1#newborn"]
    assert frame["age"].iloc[0] == pytest.approx(61 / 365.25)
    assert frame["sex"].iloc[0] == "female"
    assert result.report.rejected_by_reason == {"subject names no contained Patient": 1}
    assert result.quarantine["detail"].tolist() == ["'#nobody'"]


# ---------------------------------------------------------------- ingredients
def medication(mid: str, *ingredient_codes: str, r5: bool = False) -> dict[str, Any]:
    def concept(code: str) -> dict[str, Any]:
        return {"coding": [{"system": RXNORM, "code": code}]}

    items = [
        {"item": {"concept": concept(c)}} if r5 else {"itemCodeableConcept": concept(c)}
        for c in ingredient_codes
    ]
    return {"resourceType": "Medication", "id": mid, "ingredient": items}


def prescription(subject: str, reference: str, **extra: Any) -> dict[str, Any]:
    return {
        "resourceType": "MedicationRequest",
        "status": "active",
        "intent": "order",
        "subject": {"reference": subject},
        "authoredOn": "2010-01-01",
        "medicationReference": {"reference": reference},
        **extra,
    }


def test_medications_coded_only_through_their_ingredients_match_the_concept_sets(tmp_path):
    """R4 ``Medication.ingredient[].itemCodeableConcept`` codes the Medication.

    Hand computation: p1's Medication (exported) and p2's (contained) have
    the simvastatin ingredient, in the study's statin set here; p3's has
    amlodipine; p4's is written the R5 way (``item.concept``), which is not
    R4: that Medication and the request naming it are rejected.
    """
    people = [patient(f"p{i}") for i in (1, 2, 3, 4)]
    visits = [encounter(f"Patient/p{i}") for i in (1, 2, 3, 4)]
    requests = [
        prescription("Patient/p1", "Medication/simva"),
        prescription(
            "Patient/p2",
            "#m",
            contained=[medication("m", AMLODIPINE_INGREDIENT, SIMVASTATIN_INGREDIENT)],
        ),
        prescription("Patient/p3", "Medication/amlo"),
        prescription("Patient/p4", "Medication/r5"),
    ]
    meds = [
        medication("simva", SIMVASTATIN_INGREDIENT),
        medication("amlo", AMLODIPINE_INGREDIENT),
        medication("r5", SIMVASTATIN_INGREDIENT, r5=True),
    ]
    write_ndjson(tmp_path / "all.ndjson", people + visits + requests + meds)
    spec = study(statin_codes=(SIMVASTATIN_INGREDIENT,))
    result = run(tmp_path, spec, max_rejected_share=0.2)
    assert result.frame["statin"].to_dict() == {"p1": 1, "p2": 1, "p3": 0, "p4": 0}
    # the R5 Medication has no code R4 can read: it is outside the concept sets, and the
    # request naming it is quarantined because that Medication is not valid FHIR R4
    ((location, reason),) = result.quarantine[["location", "reason"]].values.tolist()
    assert location == "line 12"
    assert reason == "medicationReference names a Medication that is not valid FHIR"
    # outside the concept sets: the R5 Medication (at read) and p3's amlodipine request
    assert result.report.excluded_by_reason[OUTSIDE_CONCEPTS] == 2


# ---------------------------------------------------------------- undated Patients
def test_patients_without_birth_date_or_deceased_without_date_are_cohort_exclusions(tmp_path):
    """Valid FHIR, not data errors: each is excluded from the cohort with its reason.

    Hand computation: p1 (born 1950) and p4 (``deceasedBoolean: false``)
    are in the frame; p2 has no birth date, p3 is deceased without a date.
    """
    people = [
        patient("p1"),
        patient("p2", birth=None),
        patient("p3", deceasedBoolean=True),
        patient("p4", "1970-06-01", deceasedBoolean=False),
    ]
    visits = [encounter(f"Patient/p{i}") for i in (1, 2, 3, 4)]
    visits.append(encounter("Patient/p4", "2011-06-01"))  # p4's follow-up: alive, no death date
    write_ndjson(tmp_path / "all.ndjson", people + visits)
    result = run(tmp_path)
    report = result.report
    assert report.rejected == 0
    assert report.cohort_exclusions == {"birth date unknown": 1, DECEASED_UNDATED: 1}
    assert result.frame["age"].to_dict() == pytest.approx(
        {"p1": age("1950-01-01"), "p4": age("1970-06-01")}
    )
    assert report.excluded_by_reason["patient not in the analysis frame"] == 4  # 2 + 2 visits


# ---------------------------------------------------------------- outside the concept sets
FLAWS = {
    "no date": lambda o: o.pop("effectiveDateTime"),
    "no unit": lambda o: o["valueQuantity"].pop("code") and o["valueQuantity"].pop("unit"),
    "partial date": lambda o: o.update(effectiveDateTime="2010-04"),
    "future date": lambda o: o.update(effectiveDateTime="2099-01-01"),
    "not a number": lambda o: o["valueQuantity"].update(value="high"),
    "no code": lambda o: o.pop("code") and o.update(code={"text": "pulse"}),
}


@given(
    flaws=st.lists(st.sampled_from(sorted(FLAWS)), min_size=1, max_size=8),
    valid_outside=st.integers(0, 3),
)
@FEW
def test_records_outside_the_concept_sets_never_stop_a_run(flaws, valid_outside):
    """Heart-rate Observations (in no concept set) with any flaw are unused, not rejected.

    They are the whole of file b, far over the default ``max_rejected_share``
    of 10 %; the run goes on. Hand computation: the frame's sbp is the
    latest valid sbp (128, on 2010-04-20); every heart-rate Observation,
    flawed or not, is counted as outside the concept sets; the one sbp
    without a date (line 13 of file a, 1 of 13 records) is the only rejection.
    """
    outside = []
    for flaw in flaws:
        record = observation("Patient/p1", 70, code=HEART_RATE)
        FLAWS[flaw](record)
        outside.append(record)
    outside += [observation("Patient/p1", 60 + i, code=HEART_RATE) for i in range(valid_outside)]
    inside = [observation("Patient/p1", 110 + i, f"2010-04-{i + 1:02d}") for i in range(9)]
    inside += [observation("Patient/p1", 128, "2010-04-20"), observation("Patient/p1", 150, None)]
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        write_ndjson(root / "a.ndjson", [patient("p1"), encounter("Patient/p1"), *inside])
        write_ndjson(root / "b.ndjson", outside)
        result = run(root)
    report = result.report
    assert result.frame["sbp"].to_dict() == {"p1": 128.0}
    assert report.excluded_by_reason[OUTSIDE_CONCEPTS] == len(outside)
    assert report.rejected_by_reason == {"missing date": 1}
    assert report.rejected_examples == {"missing date": "a.ndjson:line 13"}
    report.check_balance()


# ---------------------------------------------------------------- failed runs
@given(
    bad=st.integers(3, 8),
    good=st.integers(0, 3),
    later=st.integers(0, 4),
    missing_medications=st.integers(1, 3),
)
@FEW
def test_a_failed_run_writes_its_reason_table_and_quarantine_and_balances(
    bad, good, later, missing_medications
):
    """The run stops at the first file; its report groups the reasons and balances.

    Hand computation: file a holds one Patient, ``good`` visits, ``bad``
    sbp Observations without a date and ``missing_medications`` requests
    naming Medications that do not exist (each a different one); file b
    (``later`` visits) is never read.
    """
    first = [patient("p1"), *(encounter("Patient/p1") for _ in range(good))]
    first += [observation("Patient/p1", 120, day=None) for _ in range(bad)]
    first += [
        prescription("Patient/p1", f"Medication/gone-{i}") for i in range(missing_medications)
    ]
    rejected = bad + missing_medications
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        write_ndjson(root / "a.ndjson", first)
        if later:
            write_ndjson(root / "b.ndjson", [encounter("Patient/p1") for _ in range(later)])
        with pytest.raises(HarmonizationFailed) as caught:
            run(root, max_rejected_share=0.1)
        failed = caught.value
        paths = write_failed_outputs(failed, root / "out")
        quarantine = pd.read_csv(paths["quarantine"])
        written = json.loads(paths["report_json"].read_text())
        text = paths["report_text"].read_text()
    report = failed.report
    assert report.rejected == rejected
    assert report.rejected_by_reason == {
        "missing date": bad,
        "medicationReference matches no Medication in the export": missing_medications,
    }
    assert report.rejected_examples["missing date"] == f"a.ndjson:line {good + 2}"
    assert len(quarantine) == rejected and set(quarantine["source"]) == {"a.ndjson"}
    assert sorted(d for d in quarantine["detail"].dropna()) == sorted(
        f"a.ndjson:line {good + bad + 2 + i}: medicationReference 'Medication/gone-{i}' matches "
        "no Medication in the export (no Bundle entry or NDJSON line with that id or fullUrl)"
        for i in range(missing_medications)
    )
    read = 1 + good + bad + missing_medications
    assert report.read == read + later and report.not_read == later
    assert report.unprocessed == later + 1 + good  # not read, and mapped but not classified
    assert report.included + report.excluded == 0
    report.check_balance()
    assert written["balanced"] and written["rejected_by_reason"] == report.rejected_by_reason
    if later:
        assert f"records {read + later}, of which read {read} and not read {later}" in text
        assert report.unprocessed_by_reason[NOT_READ] == later
    else:
        assert f"records read {read} =" in text


def test_an_unbalanced_report_is_refused():
    """The invariant the run asserts can fail: a record that disappeared is caught."""
    good = HarmonizationReport(
        "s", "fhir", [], "st", "d", "ok", read=3, included=2, rejected=1,
        read_by_type={"Patient": 3}, rejected_by_reason={"missing date": 1},
    )  # fmt: skip
    good.check_balance()
    fields = {k: v for k, v in good.to_dict().items() if k != "balanced"}
    for change in (
        {"included": 1},
        {"rejected_by_reason": {}},
        {"read_by_type": {"Patient": 2}},
        {"not_read": 1},
    ):
        with pytest.raises(UnbalancedReport, match="does not balance"):
            HarmonizationReport(**(fields | change)).check_balance()
