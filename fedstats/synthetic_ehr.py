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
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

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


@dataclass(frozen=True)
class SyntheticEHR:
    """Tables of synthetic facts (one row per fact), shared by both writers."""

    patients: pd.DataFrame  # person_id, birth_date, sex, death_date
    visits: pd.DataFrame  # visit_id, person_id, date
    measurements: pd.DataFrame  # id, person_id, kind, date, value
    conditions: pd.DataFrame  # id, person_id, kind, date
    prescriptions: pd.DataFrame  # id, person_id, date


def synthetic_ehr(n_patients: int, *, seed: int, measurements_per_patient: int = 4) -> SyntheticEHR:
    """Reproducible synthetic patients with visits, labs, diagnoses, drugs and deaths."""
    rng = np.random.default_rng(seed)
    ids = [f"p{i:07d}" for i in range(n_patients)]
    birth = pd.to_datetime("1930-01-01") + pd.to_timedelta(
        rng.integers(0, 60 * 365, n_patients), unit="D"
    )
    sex = rng.choice(["female", "male"], n_patients)
    first_visit = birth + pd.to_timedelta(rng.integers(20 * 365, 70 * 365, n_patients), unit="D")
    first_visit = first_visit.where(
        first_visit < pd.Timestamp("2020-01-01"), pd.Timestamp("2019-06-01")
    )
    dies = rng.random(n_patients) < 0.25
    death = first_visit + pd.to_timedelta(rng.integers(30, 6000, n_patients), unit="D")
    death = pd.Series(death).where(dies & (death < pd.Timestamp("2024-01-01")))
    patients = pd.DataFrame(
        {
            "person_id": ids,
            "birth_date": birth.date,
            "sex": sex,
            "death_date": [d.date() if pd.notna(d) else None for d in death],
        }
    )
    visits, measures, conditions, scripts = [], [], [], []
    for i, pid in enumerate(ids):
        start = first_visit[i]
        end = death.iloc[i] if pd.notna(death.iloc[i]) else pd.Timestamp("2024-06-30")
        days = sorted(rng.integers(0, max(1, (end - start).days), 3))
        for k, offset in enumerate([0, *days]):
            visits.append((f"v{i}-{k}", pid, (start + timedelta(days=int(offset))).date()))
        for m in range(measurements_per_patient):
            kind = "sbp" if m % 2 == 0 else "bmi"
            when = (start - timedelta(days=int(rng.integers(0, 1500)))).date()
            value = rng.normal(135, 18) if kind == "sbp" else rng.normal(28, 5)
            measures.append((f"m{i}-{m}", pid, kind, when, round(float(value), 1)))
        for kind in CONDITIONS:
            if rng.random() < 0.3:
                when = (start - timedelta(days=int(rng.integers(0, 3000)))).date()
                conditions.append((f"c{i}-{kind}", pid, kind, when))
        if rng.random() < 0.3:
            when = (start - timedelta(days=int(rng.integers(0, 300)))).date()
            scripts.append((f"r{i}", pid, when))
    return SyntheticEHR(
        patients=patients,
        visits=pd.DataFrame(visits, columns=["visit_id", "person_id", "date"]),
        measurements=pd.DataFrame(measures, columns=["id", "person_id", "kind", "date", "value"]),
        conditions=pd.DataFrame(conditions, columns=["id", "person_id", "kind", "date"]),
        prescriptions=pd.DataFrame(scripts, columns=["id", "person_id", "date"]),
    )


def write_fhir_ndjson(ehr: SyntheticEHR, folder: str | Path) -> Path:
    """Write Bulk Data NDJSON files (one per resource type) into ``folder``."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)

    def ref(pid: str) -> dict:
        return {"reference": f"Patient/{pid}"}

    def write(name: str, resources) -> None:
        with (folder / f"{name}.000.ndjson").open("w", encoding="utf-8") as handle:
            for resource in resources:
                handle.write(json.dumps(resource, separators=(",", ":")) + "\n")

    write(
        "Patient",
        (
            {
                "resourceType": "Patient",
                "id": p.person_id,
                "gender": p.sex,
                "birthDate": p.birth_date.isoformat(),
                **({"deceasedDateTime": p.death_date.isoformat()} if p.death_date else {}),
            }
            for p in ehr.patients.itertuples()
        ),
    )
    write(
        "Encounter",
        (
            {
                "resourceType": "Encounter",
                "id": v.visit_id,
                "status": "finished",
                "class": {
                    "system": "http://terminology.hl7.org/CodeSystem/v3-ActCode",
                    "code": "AMB",
                },
                "subject": ref(v.person_id),
                "period": {"start": v.date.isoformat()},
            }
            for v in ehr.visits.itertuples()
        ),
    )
    write(
        "Observation",
        (
            {
                "resourceType": "Observation",
                "id": m.id,
                "status": "final",
                "code": {
                    "coding": [
                        {
                            "system": LOINC,
                            "code": MEASURES[m.kind][0],
                            "display": MEASURES[m.kind][1],
                        }
                    ]
                },
                "subject": ref(m.person_id),
                "effectiveDateTime": m.date.isoformat(),
                "valueQuantity": {
                    "value": m.value,
                    "unit": MEASURES[m.kind][2],
                    "system": "http://unitsofmeasure.org",
                    "code": MEASURES[m.kind][2],
                },
            }
            for m in ehr.measurements.itertuples()
        ),
    )
    write(
        "Condition",
        (
            {
                "resourceType": "Condition",
                "id": c.id,
                "code": {
                    "coding": [
                        {
                            "system": SNOMED,
                            "code": CONDITIONS[c.kind][0],
                            "display": CONDITIONS[c.kind][1],
                        }
                    ]
                },
                "subject": ref(c.person_id),
                "onsetDateTime": c.date.isoformat(),
            }
            for c in ehr.conditions.itertuples()
        ),
    )
    write(
        "MedicationRequest",
        (
            {
                "resourceType": "MedicationRequest",
                "id": r.id,
                "status": "completed",
                "intent": "order",
                "medicationCodeableConcept": {
                    "coding": [{"system": RXNORM, "code": STATIN[0], "display": STATIN[1]}]
                },
                "subject": ref(r.person_id),
                "authoredOn": r.date.isoformat(),
            }
            for r in ehr.prescriptions.itertuples()
        ),
    )
    return folder


def write_omop_csv(ehr: SyntheticEHR, folder: str | Path) -> Path:
    """Write OMOP CDM 5.4 CSV tables (with a small CONCEPT table) into ``folder``.

    Observation periods run from each person's earliest to latest record, the
    follow-up a FHIR source implies, so both sources give the same frame.
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    key = {pid: i + 1 for i, pid in enumerate(ehr.patients["person_id"])}
    p = ehr.patients
    births = pd.to_datetime(p["birth_date"])
    pd.DataFrame(
        {
            "person_id": p["person_id"].map(key),
            "gender_concept_id": p["sex"].map({"female": 8532, "male": 8507}),
            "year_of_birth": births.dt.year,
            "month_of_birth": births.dt.month,
            "day_of_birth": births.dt.day,
            "birth_datetime": births.dt.strftime("%Y-%m-%d 00:00:00"),
            "race_concept_id": 0,
            "ethnicity_concept_id": 0,
            "person_source_value": p["person_id"],
            "gender_source_value": p["sex"],
        }
    ).to_csv(folder / "person.csv", index=False)
    dates = pd.concat(
        [
            ehr.visits[["person_id", "date"]],
            ehr.measurements[["person_id", "date"]],
            ehr.conditions[["person_id", "date"]],
            ehr.prescriptions[["person_id", "date"]],
            p.dropna(subset=["death_date"]).rename(columns={"death_date": "date"})[
                ["person_id", "date"]
            ],
        ]
    )
    span = dates.groupby("person_id")["date"].agg(["min", "max"]).reset_index()
    pd.DataFrame(
        {
            "observation_period_id": range(1, len(span) + 1),
            "person_id": span["person_id"].map(key),
            "observation_period_start_date": span["min"],
            "observation_period_end_date": span["max"],
            "period_type_concept_id": 32817,
        }
    ).to_csv(folder / "observation_period.csv", index=False)
    v = ehr.visits
    pd.DataFrame(
        {
            "visit_occurrence_id": range(1, len(v) + 1),
            "person_id": v["person_id"].map(key),
            "visit_concept_id": 9202,
            "visit_start_date": v["date"],
            "visit_end_date": v["date"],
            "visit_type_concept_id": 32817,
        }
    ).to_csv(folder / "visit_occurrence.csv", index=False)
    m = ehr.measurements
    pd.DataFrame(
        {
            "measurement_id": range(1, len(m) + 1),
            "person_id": m["person_id"].map(key),
            "measurement_concept_id": m["kind"].map(lambda k: MEASURES[k][3]),
            "measurement_date": m["date"],
            "measurement_type_concept_id": 32817,
            "value_as_number": m["value"],
            "unit_concept_id": m["kind"].map(lambda k: UCUM_CONCEPTS[MEASURES[k][2]]),
            "unit_source_value": m["kind"].map(lambda k: MEASURES[k][2]),
        }
    ).to_csv(folder / "measurement.csv", index=False)
    c = ehr.conditions
    pd.DataFrame(
        {
            "condition_occurrence_id": range(1, len(c) + 1),
            "person_id": c["person_id"].map(key),
            "condition_concept_id": c["kind"].map(lambda k: CONDITIONS[k][2]),
            "condition_start_date": c["date"],
            "condition_type_concept_id": 32817,
        }
    ).to_csv(folder / "condition_occurrence.csv", index=False)
    r = ehr.prescriptions
    pd.DataFrame(
        {
            "drug_exposure_id": range(1, len(r) + 1),
            "person_id": r["person_id"].map(key),
            "drug_concept_id": STATIN[2],
            "drug_exposure_start_date": r["date"],
            "drug_exposure_end_date": r["date"],
            "drug_type_concept_id": 32817,
        }
    ).to_csv(folder / "drug_exposure.csv", index=False)
    d = p.dropna(subset=["death_date"])
    pd.DataFrame(
        {
            "person_id": d["person_id"].map(key),
            "death_date": d["death_date"],
            "death_type_concept_id": 32817,
        }
    ).to_csv(folder / "death.csv", index=False)
    concepts = [(k[3], k[1], "Measurement", "LOINC", k[0]) for k in MEASURES.values()]
    concepts += [(k[2], k[1], "Condition", "SNOMED", k[0]) for k in CONDITIONS.values()]
    concepts += [(STATIN[2], STATIN[1], "Drug", "RxNorm", STATIN[0])]
    concepts += [(cid, unit, "Unit", "UCUM", unit) for unit, cid in UCUM_CONCEPTS.items()]
    pd.DataFrame(
        [
            {
                "concept_id": cid,
                "concept_name": name,
                "domain_id": domain,
                "vocabulary_id": vocab,
                "concept_class_id": "Clinical Observation",
                "standard_concept": "S",
                "concept_code": code,
                "valid_start_date": "1970-01-01",
                "valid_end_date": "2099-12-31",
            }
            for cid, name, domain, vocab, code in concepts
        ]
    ).to_csv(folder / "concept.csv", index=False)
    return folder


def person_keys(ehr: SyntheticEHR) -> dict[str, str]:
    """FHIR patient id -> OMOP person_id (as text), to compare frames across sources."""
    return {pid: str(i + 1) for i, pid in enumerate(ehr.patients["person_id"])}
