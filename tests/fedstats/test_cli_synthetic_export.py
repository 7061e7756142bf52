"""`fedstats synthetic-export`: a site's synthetic FHIR or OMOP export, harmonised as a real one.

The README's harmonisation examples and the deployment guide use it as the
stand-in for a site's export; these tests attack what they rely on.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from fedstats.cli.main import SYNTHETIC_MARK, app

DEMO = Path(__file__).resolve().parents[2] / "fedstats" / "examples" / "demo" / "study.toml"


def run(*args: str):
    return CliRunner().invoke(app, [*args])


def export(site: str, kind: str, folder: Path, *extra: str):
    return run("synthetic-export", "--site", site, f"--{kind}", str(folder), *extra)


def harmonised(site: str, kind: str, folder: Path, out: Path) -> pd.DataFrame:
    result = run(
        "harmonize",
        "--spec",
        str(DEMO),
        "--site",
        site,
        f"--{kind}",
        str(folder),
        "--out",
        str(out),
    )
    assert result.exit_code == 0, result.output
    return pd.read_parquet(out / "frame.parquet")


def test_a_sites_fhir_and_omop_exports_harmonise_to_the_same_frame(tmp_path: Path) -> None:
    """The same site's patients, once as FHIR NDJSON and once as OMOP CSV (seeded by its
    name): harmonised under the demo study they give the same analysis frame, with enough
    deaths and survivors for a logistic fit under the default disclosure rules."""
    for kind in ("fhir", "omop"):
        result = export("region_0", kind, tmp_path / kind, "--patients", "300")
        assert result.exit_code == 0, result.output
        assert "300 synthetic patients of site 'region_0'" in result.output
        assert "no real person" in (tmp_path / kind / SYNTHETIC_MARK).read_text()
    fhir = harmonised("region_0", "fhir", tmp_path / "fhir", tmp_path / "from-fhir")
    omop = harmonised("region_0", "omop", tmp_path / "omop", tmp_path / "from-omop")
    assert len(fhir) == len(omop)

    def rows(frame: pd.DataFrame) -> pd.DataFrame:  # person ids differ between the formats
        columns = sorted(frame.columns)
        return frame[columns].sort_values(columns).reset_index(drop=True)

    pd.testing.assert_frame_equal(
        rows(fhir), rows(omop), check_dtype=False, check_categorical=False
    )
    assert len(fhir) > 100 and fhir["died"].sum() >= 10 and (1 - fhir["died"]).sum() >= 10


def test_each_site_gets_other_patients_and_a_rerun_writes_the_same(tmp_path: Path) -> None:
    def files(folder: Path) -> dict[str, bytes]:
        return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}

    assert export("north", "fhir", tmp_path / "a", "--patients", "60").exit_code == 0
    first = files(tmp_path / "a")
    assert export("north", "fhir", tmp_path / "a", "--patients", "60").exit_code == 0
    assert files(tmp_path / "a") == first  # written again: same files, same bytes
    assert export("south", "fhir", tmp_path / "b", "--patients", "60").exit_code == 0
    other = files(tmp_path / "b")
    assert other.keys() == first.keys()
    assert other["Patient.000.ndjson"] != first["Patient.000.ndjson"]
    assert export("south", "fhir", tmp_path / "c", "--patients", "60", "--seed", "7").exit_code == 0
    assert files(tmp_path / "c")["Patient.000.ndjson"] != other["Patient.000.ndjson"]


def test_a_folder_holding_other_files_is_refused_and_left_alone(tmp_path: Path) -> None:
    real = tmp_path / "export"
    real.mkdir()
    (real / "Patient.000.ndjson").write_text('{"resourceType": "Patient", "id": "real"}\n')
    result = export("north", "fhir", real)
    assert result.exit_code == 2
    assert "did not write" in result.output and "nothing is overwritten" in result.output
    assert [p.name for p in real.iterdir()] == ["Patient.000.ndjson"]
    assert (real / "Patient.000.ndjson").read_text().count("real") == 1


def test_exactly_one_format_is_asked_for(tmp_path: Path) -> None:
    both = run(
        "synthetic-export", "--site", "x", "--fhir", str(tmp_path / "f"), "--omop", str(tmp_path)
    )
    neither = run("synthetic-export", "--site", "x")
    for result in (both, neither):
        assert result.exit_code == 2 and "exactly one folder" in result.output
    assert not (tmp_path / "f").exists()


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(patients=st.one_of(st.integers(max_value=49), st.integers(min_value=100_001), st.text()))
def test_a_bad_number_of_patients_is_refused_before_anything_is_written(
    tmp_path: Path, patients: object
) -> None:
    folder = tmp_path / "never"
    result = export("x", "fhir", folder, "--patients", str(patients))
    assert result.exit_code == 2, result.output
    assert not folder.exists()
