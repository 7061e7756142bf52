"""Synthetic patients written once as FHIR R4 NDJSON and once as OMOP CDM 5.4 CSV.

The two sources hold exactly the same facts — birth date, sex, death,
visits, systolic blood pressure and BMI measurements, diabetes and
hypertension diagnoses, statin prescriptions — so harmonising either under
the same study specification must give the same analysis frame. Used by
the harmonisation tests and benchmark; nothing here is real patient data.

Coding: LOINC 8480-6 (systolic blood pressure, ``mm[Hg]``; OMOP 3004249),
39156-5 (BMI, ``kg/m2``; OMOP 3038553); SNOMED CT 44054006 (type 2
diabetes; OMOP 201826), 59621000 (essential hypertension; OMOP 320128);
RxNorm 314231 (simvastatin 10 mg oral tablet; OMOP 1539463).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import duckdb
import numpy as np
import pandas as pd

LOINC = "http://loinc.org"
SNOMED = "http://snomed.info/sct"
RXNORM = "http://www.nlm.nih.gov/research/umls/rxnorm"
MEASURES = {
    "sbp": ("8480-6", "Systolic blood pressure", "mm[Hg]", 3004249),
    "bmi": ("39156-5", "Body mass index", "kg/m2", 3038553),
}
CONDITIONS = {
    "diabetes": ("44054006", "Type 2 diabetes mellitus", 201826),
    "hypertension": ("59621000", "Essential hypertension", 320128),
}
STATIN = ("314231", "simvastatin 10 MG Oral Tablet", 1539463)
UCUM_CONCEPTS = {"mm[Hg]": 8876, "kg/m2": 9531}
GIVEN_NAMES = ("José", "Zoë", "Anne-Marie", "Seán", "Björn", "Renée", "Ola", "MARY  ANN", "Ľubomír")
FAMILY_NAMES = ("Müller-Lüdenscheidt", "O'Brien", "García", "Ñúñez", "Smith", "Dvořák", "d’Arcy")
POSTAL_CODES = ("sw1a 1aa", "02138-1234", "75001", "D-10115", "H3Z 2Y7")
"""Raw identifier values (accents, hyphens, apostrophes, case, spaces) for linkage tests."""


@dataclass(frozen=True)
class SyntheticEHR:
    """Tables of synthetic facts (one row per fact), shared by both writers."""

    patients: pd.DataFrame  # person_id, birth_date, sex, death_date (+ identifiers if asked)
    visits: pd.DataFrame  # visit_id, person_id, date
    measurements: pd.DataFrame  # id, person_id, kind, date, value
    conditions: pd.DataFrame  # id, person_id, kind, date
    prescriptions: pd.DataFrame  # id, person_id, date


def synthetic_ehr(
    n_patients: int, *, seed: int, measurements_per_patient: int = 4, identifiers: bool = False
) -> SyntheticEHR:
    """Reproducible synthetic patients with visits, labs, diagnoses, drugs and deaths.

    Every patient has a first visit and three more up to death or mid-2024,
    ``measurements_per_patient`` measurements (systolic blood pressure and BMI
    in turn) in the four years before the first visit, each condition with
    probability 0.3 before it and a statin prescription with probability 0.3
    in the year before it; a quarter die. Dates are ``datetime64[D]``
    columns. Built with array operations, so a benchmark can ask for 100,000
    patients and millions of measurements.

    ``identifiers=True`` adds raw ``given_name``, ``family_name`` and
    ``postal_code`` columns (drawn from :data:`GIVEN_NAMES`,
    :data:`FAMILY_NAMES`, :data:`POSTAL_CODES` by a generator of their own,
    so the other facts are those of ``identifiers=False``); the writers then
    put them in the FHIR Patient's official name and home address and in
    OMOP ``location.zip`` (OMOP has no name field).
    """
    rng = np.random.default_rng(seed)
    n = n_patients
    ids = pd.Series(np.arange(n)).map("p{:07d}".format).to_numpy(dtype=object)
    birth = np.datetime64("1930-01-01") + rng.integers(0, 60 * 365, n).astype("timedelta64[D]")
    sex = rng.choice(np.array(["female", "male"], dtype=object), n)
    first_visit = birth + rng.integers(20 * 365, 70 * 365, n).astype("timedelta64[D]")
    first_visit = np.minimum(first_visit, np.datetime64("2019-06-01"))
    dies = rng.random(n) < 0.25
    death = first_visit + rng.integers(30, 6000, n).astype("timedelta64[D]")
    death = np.where(dies & (death < np.datetime64("2024-01-01")), death, np.datetime64("NaT"))
    patients = pd.DataFrame(
        {"person_id": ids, "birth_date": birth, "sex": sex, "death_date": death}
    )
    if identifiers:
        named = np.random.default_rng([seed, 1])
        for column, values in (
            ("given_name", GIVEN_NAMES),
            ("family_name", FAMILY_NAMES),
            ("postal_code", POSTAL_CODES),
        ):
            patients[column] = named.choice(np.array(values, dtype=object), n)

    end = np.where(np.isnat(death), np.datetime64("2024-06-30"), death)
    span = np.maximum(1, (end - first_visit).astype(np.int64))
    offsets = np.sort(rng.integers(0, span[:, None], (n, 3)), axis=1)
    offsets = np.concatenate([np.zeros((n, 1), dtype=np.int64), offsets], axis=1)
    visits = pd.DataFrame(
        {
            "visit_id": _ids("v", n, 4),
            "person_id": np.repeat(ids, 4),
            "date": np.repeat(first_visit, 4) + offsets.ravel().astype("timedelta64[D]"),
        }
    )

    m = measurements_per_patient
    kinds = np.tile(np.array(["sbp", "bmi"], dtype=object), m // 2 + 1)[:m]
    kind = np.tile(kinds, n)
    is_sbp = kind == "sbp"
    value = np.where(is_sbp, rng.normal(135, 18, n * m), rng.normal(28, 5, n * m)).round(1)
    measurements = pd.DataFrame(
        {
            "id": _ids("m", n, m),
            "person_id": np.repeat(ids, m),
            "kind": kind,
            "date": np.repeat(first_visit, m)
            - rng.integers(0, 1500, n * m).astype("timedelta64[D]"),
            "value": value,
        }
    )

    condition_parts = []
    for kind_name in CONDITIONS:
        has = rng.random(n) < 0.3
        before = rng.integers(0, 3000, n).astype("timedelta64[D]")
        condition_parts.append(
            pd.DataFrame(
                {
                    "id": pd.Series(np.flatnonzero(has)).map(f"c{{}}-{kind_name}".format),
                    "person_id": ids[has],
                    "kind": kind_name,
                    "date": (first_visit - before)[has],
                }
            )
        )
    conditions = pd.concat(condition_parts, ignore_index=True)

    takes = rng.random(n) < 0.3
    before = rng.integers(0, 300, n).astype("timedelta64[D]")
    prescriptions = pd.DataFrame(
        {
            "id": pd.Series(np.flatnonzero(takes)).map("r{}".format),
            "person_id": ids[takes],
            "date": (first_visit - before)[takes],
        }
    )
    return SyntheticEHR(
        patients=patients,
        visits=visits,
        measurements=measurements,
        conditions=conditions,
        prescriptions=prescriptions,
    )


def _ids(prefix: str, n: int, per_patient: int) -> np.ndarray:
    """``"<prefix><patient>-<k>"`` for every patient and k < per_patient, patient-major."""
    patient = np.repeat(np.arange(n), per_patient).astype(str).astype(object)
    k = np.tile(np.arange(per_patient), n).astype(str).astype(object)
    return prefix + patient + "-" + k


def _iso(dates: pd.Series | np.ndarray) -> np.ndarray:
    """ISO dates as text (``None`` for a missing date)."""
    values = np.asarray(dates, dtype="datetime64[D]")
    text = values.astype(str).astype(object)
    text[np.isnat(values)] = None
    return text


def write_fhir_ndjson(ehr: SyntheticEHR, folder: str | Path) -> Path:
    """Write Bulk Data NDJSON files (one per resource type) into ``folder``."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    for name, resources in _fhir_resources(ehr).items():
        with (folder / f"{name}.000.ndjson").open("w", encoding="utf-8") as handle:
            for resource in resources:
                handle.write(json.dumps(resource, separators=(",", ":")) + "\n")
    return folder


def _fhir_resources(ehr: SyntheticEHR) -> dict[str, Iterator[dict]]:
    """Generators of FHIR R4 resources, by resource type."""

    def ref(pid: str) -> dict:
        return {"reference": f"Patient/{pid}"}

    def coded(system: str, code: str, display: str) -> dict:
        return {"coding": [{"system": system, "code": code, "display": display}]}

    p, v, m, c, r = ehr.patients, ehr.visits, ehr.measurements, ehr.conditions, ehr.prescriptions
    ambulatory = {"system": "http://terminology.hl7.org/CodeSystem/v3-ActCode", "code": "AMB"}
    measure = {kind: coded(LOINC, code, display) for kind, (code, display, *_) in MEASURES.items()}
    condition = {
        kind: coded(SNOMED, code, display) for kind, (code, display, _) in CONDITIONS.items()
    }
    statin = coded(RXNORM, STATIN[0], STATIN[1])
    named = "given_name" in p.columns
    none = [None] * len(p)
    return {
        "Patient": (
            {
                "resourceType": "Patient",
                "id": pid,
                **(_names_and_address(given, family, postal) if named else {}),
                "gender": sex,
                "birthDate": birth,
                **({"deceasedDateTime": death} if death else {}),
            }
            for pid, sex, birth, death, given, family, postal in zip(
                p["person_id"],
                p["sex"],
                _iso(p["birth_date"]),
                _iso(p["death_date"]),
                p["given_name"] if named else none,
                p["family_name"] if named else none,
                p["postal_code"] if named else none,
                strict=True,
            )
        ),
        "Encounter": (
            {
                "resourceType": "Encounter",
                "id": vid,
                "status": "finished",
                "class": ambulatory,
                "subject": ref(pid),
                "period": {"start": day},
            }
            for vid, pid, day in zip(v["visit_id"], v["person_id"], _iso(v["date"]), strict=True)
        ),
        "Observation": (
            {
                "resourceType": "Observation",
                "id": mid,
                "status": "final",
                "code": measure[kind],
                "subject": ref(pid),
                "effectiveDateTime": day,
                "valueQuantity": {
                    "value": float(value),
                    "unit": MEASURES[kind][2],
                    "system": "http://unitsofmeasure.org",
                    "code": MEASURES[kind][2],
                },
            }
            for mid, pid, kind, day, value in zip(
                m["id"], m["person_id"], m["kind"], _iso(m["date"]), m["value"], strict=True
            )
        ),
        "Condition": (
            {
                "resourceType": "Condition",
                "id": cid,
                "code": condition[kind],
                "subject": ref(pid),
                "onsetDateTime": day,
            }
            for cid, pid, kind, day in zip(
                c["id"], c["person_id"], c["kind"], _iso(c["date"]), strict=True
            )
        ),
        "MedicationRequest": (
            {
                "resourceType": "MedicationRequest",
                "id": rid,
                "status": "completed",
                "intent": "order",
                "medicationCodeableConcept": statin,
                "subject": ref(pid),
                "authoredOn": day,
            }
            for rid, pid, day in zip(r["id"], r["person_id"], _iso(r["date"]), strict=True)
        ),
    }


def _names_and_address(given: str, family: str, postal: str) -> dict:
    """A Patient's names (a nickname first, then the official name) and addresses (a work
    address first, then home), so that a reader must choose as FHIR says."""
    return {
        "name": [
            {"use": "nickname", "given": ["Nick"], "family": "Name"},
            {"use": "official", "given": [given, "Second"], "family": family, "prefix": ["Dr."]},
        ],
        "address": [
            {"use": "work", "postalCode": "99999"},
            {"use": "home", "line": ["1 Main St"], "postalCode": postal},
        ],
    }


def write_omop_csv(ehr: SyntheticEHR, folder: str | Path) -> Path:
    """Write OMOP CDM 5.4 CSV tables (with a small CONCEPT table) into ``folder``."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    for name, table in omop_tables(ehr).items():
        table.to_csv(folder / f"{name}.csv", index=False)
    return folder


def write_omop_duckdb(ehr: SyntheticEHR, path: str | Path) -> Path:
    """Write the OMOP CDM 5.4 tables of :func:`omop_tables` into a new DuckDB file."""
    path = Path(path)
    if path.exists():
        raise FileExistsError(f"{path} exists; give a new file name")
    with duckdb.connect(str(path)) as connection:
        for name, table in omop_tables(ehr).items():
            connection.register("_table", table)
            connection.execute(f"CREATE TABLE {name} AS SELECT * FROM _table")
            connection.unregister("_table")
    return path


def omop_tables(ehr: SyntheticEHR) -> dict[str, pd.DataFrame]:
    """The OMOP CDM 5.4 tables holding the facts of ``ehr``, by table name.

    Observation periods run from each person's earliest to latest record, the
    follow-up a FHIR source implies, so both sources give the same frame.
    """
    key = pd.Series(np.arange(1, len(ehr.patients) + 1), index=ehr.patients["person_id"])
    p = ehr.patients
    births = pd.to_datetime(p["birth_date"])
    tables: dict[str, pd.DataFrame] = {}
    named = "postal_code" in p.columns
    tables["person"] = pd.DataFrame(
        {
            "person_id": p["person_id"].map(key),
            "gender_concept_id": p["sex"].map({"female": 8532, "male": 8507}),
            "year_of_birth": births.dt.year,
            "month_of_birth": births.dt.month,
            "day_of_birth": births.dt.day,
            "birth_datetime": births,
            "race_concept_id": 0,
            "ethnicity_concept_id": 0,
            "person_source_value": p["person_id"],
            "gender_source_value": p["sex"],
        }
    )
    if named:
        codes = pd.Series(pd.unique(p["postal_code"]))
        location = pd.Series(np.arange(1, len(codes) + 1), index=codes)
        tables["person"]["location_id"] = p["postal_code"].map(location).to_numpy()
        tables["location"] = pd.DataFrame(
            {"location_id": location.to_numpy(), "zip": location.index, "city": "Springfield"}
        )
    deaths = p.dropna(subset=["death_date"])
    dates = pd.concat(
        [
            ehr.visits[["person_id", "date"]],
            ehr.measurements[["person_id", "date"]],
            ehr.conditions[["person_id", "date"]],
            ehr.prescriptions[["person_id", "date"]],
            deaths.rename(columns={"death_date": "date"})[["person_id", "date"]],
        ]
    )
    span = dates.groupby("person_id")["date"].agg(["min", "max"]).reset_index()
    tables["observation_period"] = pd.DataFrame(
        {
            "observation_period_id": np.arange(1, len(span) + 1),
            "person_id": span["person_id"].map(key),
            "observation_period_start_date": span["min"],
            "observation_period_end_date": span["max"],
            "period_type_concept_id": 32817,
        }
    )
    v = ehr.visits
    tables["visit_occurrence"] = pd.DataFrame(
        {
            "visit_occurrence_id": np.arange(1, len(v) + 1),
            "person_id": v["person_id"].map(key),
            "visit_concept_id": 9202,
            "visit_start_date": v["date"],
            "visit_end_date": v["date"],
            "visit_type_concept_id": 32817,
        }
    )
    m = ehr.measurements
    measure = MEASURES
    tables["measurement"] = pd.DataFrame(
        {
            "measurement_id": np.arange(1, len(m) + 1),
            "person_id": m["person_id"].map(key),
            "measurement_concept_id": m["kind"].map({k: s[3] for k, s in measure.items()}),
            "measurement_date": m["date"],
            "measurement_type_concept_id": 32817,
            "value_as_number": m["value"],
            "unit_concept_id": m["kind"].map({k: UCUM_CONCEPTS[s[2]] for k, s in measure.items()}),
            "unit_source_value": m["kind"].map({k: s[2] for k, s in measure.items()}),
        }
    )
    c = ehr.conditions
    tables["condition_occurrence"] = pd.DataFrame(
        {
            "condition_occurrence_id": np.arange(1, len(c) + 1),
            "person_id": c["person_id"].map(key),
            "condition_concept_id": c["kind"].map({k: s[2] for k, s in CONDITIONS.items()}),
            "condition_start_date": c["date"],
            "condition_type_concept_id": 32817,
        }
    )
    r = ehr.prescriptions
    tables["drug_exposure"] = pd.DataFrame(
        {
            "drug_exposure_id": np.arange(1, len(r) + 1),
            "person_id": r["person_id"].map(key),
            "drug_concept_id": STATIN[2],
            "drug_exposure_start_date": r["date"],
            "drug_exposure_end_date": r["date"],
            "drug_type_concept_id": 32817,
        }
    )
    tables["death"] = pd.DataFrame(
        {
            "person_id": deaths["person_id"].map(key),
            "death_date": deaths["death_date"],
            "death_type_concept_id": 32817,
        }
    )
    concepts = [(k[3], k[1], "Measurement", "LOINC", k[0]) for k in MEASURES.values()]
    concepts += [(k[2], k[1], "Condition", "SNOMED", k[0]) for k in CONDITIONS.values()]
    concepts += [(STATIN[2], STATIN[1], "Drug", "RxNorm", STATIN[0])]
    concepts += [(cid, unit, "Unit", "UCUM", unit) for unit, cid in UCUM_CONCEPTS.items()]
    tables["concept"] = pd.DataFrame(
        [
            {
                "concept_id": cid,
                "concept_name": name,
                "domain_id": domain,
                "vocabulary_id": vocab,
                "concept_class_id": "Clinical Observation",
                "standard_concept": "S",
                "concept_code": code,
                "valid_start_date": pd.Timestamp("1970-01-01"),
                "valid_end_date": pd.Timestamp("2099-12-31"),
            }
            for cid, name, domain, vocab, code in concepts
        ]
    )
    return tables


def person_keys(ehr: SyntheticEHR) -> dict[str, str]:
    """FHIR patient id -> OMOP person_id (as text), to compare frames across sources."""
    return {pid: str(i + 1) for i, pid in enumerate(ehr.patients["person_id"])}
