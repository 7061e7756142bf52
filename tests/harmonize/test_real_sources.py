"""The real inputs in the shared data folder harmonise under the demo specification.

For each source every record read is accounted for: read = included +
excluded + rejected, and the analysis frame is not empty.
"""

from __future__ import annotations

from datetime import date
from pathlib import Path

import pytest

from fedstats.datasets import default_data_dir
from harmonize.run import harmonize
from harmonize.spec import load_spec

DEMO = Path(__file__).resolve().parents[2] / "fedstats" / "examples" / "demo" / "study.toml"
DATA = default_data_dir()

SOURCES = {
    "synthea bundles": {"fhir": DATA / "fhir" / "synthea_bundles"},
    "synthea bulk ndjson": {"fhir": DATA / "fhir" / "synthea_bulk_10_patients"},
    "synthea27nj omop 5.4": {"omop": DATA / "omop" / "synthea27nj_5.4"},
    # MIMIC-IV shifts every date into 2100-2200 for de-identification.
    "mimic-iv demo omop 5.3": {
        "omop": DATA / "omop" / "mimic_iv_demo_5.3",
        "latest_date": date(2300, 12, 31),
    },
}


@pytest.mark.parametrize("name", list(SOURCES))
def test_real_source_harmonises_and_accounts_for_every_record(name):
    result = harmonize(load_spec(DEMO), site=name.replace(" ", "_"), **SOURCES[name])
    report = result.report
    assert report.status == "ok", report.to_text()
    assert report.read > 0
    assert report.read == report.included + report.excluded + report.rejected
    assert len(result.frame) == report.patients > 0
    assert list(result.frame.columns) == load_spec(DEMO).columns()
    assert report.fingerprint["spec_digest"] == load_spec(DEMO).digest


def test_sites_harmonised_under_one_spec_can_be_combined():
    import fedstats

    frames = {
        name.split()[0] + str(i): harmonize(load_spec(DEMO), site="s", **kw).frame
        for i, (name, kw) in enumerate(SOURCES.items())
    }
    fed = fedstats.Federation.in_process(frames)
    assert set(fed.sites) == set(frames)
