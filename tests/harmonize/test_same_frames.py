"""The same synthetic patients, written as FHIR and as OMOP, harmonise to identical frames."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from fedstats.synthetic_ehr import person_keys, synthetic_ehr, write_fhir_ndjson, write_omop_csv
from harmonize.run import harmonize
from harmonize.spec import load_spec

DEMO = Path(__file__).resolve().parents[2] / "examples" / "demo" / "study.toml"


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
