"""The same synthetic patients, written as FHIR and as OMOP, harmonise to identical frames."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from harmonize.run import harmonize
from harmonize.spec import load_spec
from harmonize.synthetic_ehr import person_keys, synthetic_ehr, write_fhir_ndjson, write_omop_csv

DEMO = Path(__file__).resolve().parents[2] / "fedstats" / "examples" / "demo" / "study.toml"


@pytest.mark.parametrize("seed", [1, 2])
def test_fhir_and_omop_give_identical_frames(tmp_path, seed):
    ehr = synthetic_ehr(300, seed=seed)
    spec = load_spec(DEMO)
    from_fhir = harmonize(spec, site="s", fhir=write_fhir_ndjson(ehr, tmp_path / "fhir"))
    from_omop = harmonize(spec, site="s", omop=write_omop_csv(ehr, tmp_path / "omop"))
    fhir_frame = from_fhir.frame.rename(index=person_keys(ehr)).sort_index()
    omop_frame = from_omop.frame.sort_index()
    assert len(fhir_frame) > 100
    pd.testing.assert_frame_equal(fhir_frame, omop_frame, check_names=False)
    for result in (from_fhir, from_omop):
        assert result.report.balanced, result.report.to_text()
        assert result.report.status == "ok"
    assert from_fhir.report.fingerprint == from_omop.report.fingerprint
    assert from_fhir.report.patients == from_omop.report.patients


def test_a_fhir_site_and_an_omop_site_fit_one_stratified_cox_model(tmp_path):
    """From raw FHIR and OMOP exports to a federated Cox fit equal to the pooled one."""
    import tomllib

    import numpy as np
    from lifelines import CoxPHFitter

    import fedstats
    from harmonize.spec import parse_spec

    raw = tomllib.loads(DEMO.read_text())
    raw["outcome"] = {"name": "died", "kind": "time_to_event", "event": "death"}
    spec = parse_spec(raw)
    fhir = write_fhir_ndjson(synthetic_ehr(400, seed=11), tmp_path / "fhir")
    omop = write_omop_csv(synthetic_ehr(400, seed=12), tmp_path / "omop")
    north = harmonize(spec, site="north", fhir=fhir)
    south = harmonize(spec, site="south", omop=omop)
    frames = {"north": north.frame, "south": south.frame}
    fed = fedstats.Federation.in_process(frames)  # fingerprints agree
    formula = "Surv(died_time, died) ~ age + C(sex) + diabetes + hypertension"
    fit = fedstats.CoxPH(formula, missing="drop").fit(fed)
    pooled = pd.concat([f.assign(site=s) for s, f in frames.items()], ignore_index=True).dropna(
        subset=["age", "sex", "diabetes", "hypertension"]
    )
    pooled["male"] = (pooled["sex"] == "male").astype(float)
    reference = CoxPHFitter().fit(
        pooled[["died_time", "died", "age", "male", "diabetes", "hypertension", "site"]],
        "died_time", "died", strata=["site"], fit_options={"precision": 1e-10},
    )  # fmt: skip
    names = ["age", "male", "diabetes", "hypertension"]
    ours = fit.params[["age", "C(sex)[T.male]", "diabetes", "hypertension"]].to_numpy()
    assert np.max(np.abs(ours - reference.params_[names].to_numpy())) < 1e-6
