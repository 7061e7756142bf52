"""A FHIR site and an OMOP site linked end to end through harmonize, then a vertical fit.

One synthetic population (:func:`harmonize.synthetic_ehr.synthetic_ehr` with
``identifiers=True``) is split into two overlapping parts: the hospital's part written as
FHIR R4 NDJSON (names in ``Patient.name``, postal codes in the home address, a tenth of the
shared patients with a typing error in the family name), the registry's as OMOP CDM CSV
(names in ``person_source_value`` as ``family^given``, which the study says with
``[identifiers] omop_names``; postal codes in ``location.zip``). Both are harmonised under
one study specification with a ``[linkage]`` table; the registry keeps only the outcome,
the hospital only the covariates. ``fedstats.link`` links them over the wire and
``fedstats.VerticalLogisticRegression`` is fitted.

Oracles: the true identity (the generator's patient ids: FHIR ``Patient.id`` at the
hospital, the OMOP ``person_id`` written for the same patient at the registry) for the
linkage; ``statsmodels`` GLM Binomial (``fit(tol=1e-12)``) on the rows joined by that
identity for the fit.
"""

from __future__ import annotations

import time
import tomllib
from pathlib import Path

import numpy as np
import pandas as pd

import fedstats
from harmonize.run import harmonize
from harmonize.spec import parse_spec
from harmonize.synthetic_ehr import (
    SyntheticEHR,
    person_keys,
    synthetic_ehr,
    write_fhir_ndjson,
    write_omop_csv,
)
from linkage.quality import quality
from tests.vertical.joined_oracle import joined_by_truth, statsmodels_on_joined
from tests.vertical.linked_population import LINKAGE, accepted_pairs

DEMO = Path(__file__).resolve().parents[2] / "fedstats" / "examples" / "demo" / "study.toml"
FORMULA = "died ~ age + C(sex) + diabetes + hypertension + statin"


STUDY_LINKAGE = {
    **LINKAGE,
    "fields": [
        {**field, "bits": 300} if field["name"] == "birth_date" else field
        for field in LINKAGE["fields"]
    ],
    "threshold": 0.9,
}
"""The study's ``[linkage]`` table. The generator draws names from 9 given names, 7 family
names and 5 postal codes, so a study of such a population weights the birth date more and
links at 0.9: at 100 bits and 0.8, two different people with the same names and postal
code and close birth dates reach the threshold (precision 0.87 on this population). At 300
bits, true pairs (a tenth misspelt) scored at least 0.95 and other candidates at most 0.87
under three secrets."""


def study_spec():
    raw = tomllib.loads(DEMO.read_text())
    raw["linkage"] = STUDY_LINKAGE
    raw["identifiers"] = {"omop_names": "person_source_value"}
    return parse_spec(raw)


def part(ehr: SyntheticEHR, ids: set[str]) -> SyntheticEHR:
    """The patients ``ids`` of ``ehr`` and their facts."""
    return SyntheticEHR(
        *(t[t["person_id"].isin(ids)].reset_index(drop=True) for t in ehr.__dict__.values())
    )


def misspelt(ehr: SyntheticEHR, who: list[str]) -> SyntheticEHR:
    """``ehr`` with the family name of ``who`` typed with its last letter doubled."""
    patients = ehr.patients.copy()
    chosen = patients["person_id"].isin(who)
    patients.loc[chosen, "family_name"] = patients.loc[chosen, "family_name"].map(
        lambda name: name + name[-1]
    )
    return SyntheticEHR(patients, *list(ehr.__dict__.values())[1:])


def test_a_fhir_hospital_and_an_omop_registry_linked_and_fitted(tmp_path):
    population = synthetic_ehr(480, seed=21, identifiers=True)
    ids = population.patients["person_id"].tolist()
    at_registry, at_hospital = set(ids[:360]), set(ids[120:])
    shared = sorted(at_registry & at_hospital)
    rng = np.random.default_rng(21)
    typos = list(rng.choice(shared, size=len(shared) // 10, replace=False))
    hospital_ehr = misspelt(part(population, at_hospital), typos)
    registry_ehr = part(population, at_registry)
    omop = write_omop_csv(registry_ehr, tmp_path / "omop")
    person = pd.read_csv(omop / "person.csv", dtype=str, keep_default_na=False)
    names = registry_ehr.patients.set_index("person_id")
    person["person_source_value"] = [
        f"{names.at[pid, 'family_name']}^{names.at[pid, 'given_name']}"
        for pid in registry_ehr.patients["person_id"]
    ]
    person.to_csv(omop / "person.csv", index=False)
    spec = study_spec()
    hospital = harmonize(
        spec, site="hospital", fhir=write_fhir_ndjson(hospital_ehr, tmp_path / "f")
    )
    registry = harmonize(spec, site="registry", omop=omop)
    frames = {
        "registry": registry.frame[["died"]],
        "hospital": hospital.frame.drop(columns="died"),
    }
    identifiers = {"registry": registry.identifiers, "hospital": hospital.identifiers}
    fed = fedstats.Federation.in_process(frames, identifiers=identifiers, linkage=spec.linkage)

    start = time.perf_counter()
    result = fedstats.link(
        fed, first="registry", second="hospital", linkage_id="registry-hospital",
        schema=spec.linkage, roles={"registry": "outcome", "hospital": "covariates"},
        record_dir=tmp_path / "study",
    )  # fmt: skip
    link_seconds = time.perf_counter() - start
    # the truth: a shared patient in both cohorts, by the generator's id
    omop_id = person_keys(registry_ehr)  # FHIR id -> OMOP person_id, at the registry
    truth = {
        (omop_id[pid], pid)
        for pid in shared
        if pid in hospital.frame.index and omop_id[pid] in registry.frame.index
    }
    linked = accepted_pairs(fed, "registry-hospital", "registry", "hospital")
    measured = quality(linked, truth)
    print(
        f"FHIR hospital ({len(hospital.frame)} patients) x OMOP registry "
        f"({len(registry.frame)}): {len(truth)} true pairs ({len(typos)} shared patients "
        f"misspelt), {result.pairs} linked, precision {measured.precision:.3f}, recall "
        f"{measured.recall:.3f}, {link_seconds:.2f} s"
    )
    assert len(truth) >= 80
    assert measured.precision == 1.0 and measured.recall == 1.0

    start = time.perf_counter()
    fit = fedstats.VerticalLogisticRegression(
        FORMULA, outcome_site="registry", covariate_sites=["hospital"],
        linkage_id="registry-hospital",
    ).fit(fed)  # fmt: skip
    fit_seconds = time.perf_counter() - start
    joined = joined_by_truth(frames["hospital"], frames["registry"], truth)
    _, reference = statsmodels_on_joined(joined, FORMULA)
    params_gap = np.abs(fit.params.to_numpy() - reference.params).max()
    bse_gap = np.abs(fit.bse.to_numpy() - reference.bse).max()
    print(
        f"vertical fit on the linked rows: max |params gap| {params_gap:.2e}, max |bse gap| "
        f"{bse_gap:.2e}, {fit_seconds:.2f} s"
    )
    assert params_gap <= 1e-6 and bse_gap <= 1e-6
    assert fit.n_obs == len(truth)
    assert (tmp_path / "study" / "linkages" / "registry-hospital.json").exists()
