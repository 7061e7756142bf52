"""Reading the heart-disease files: counts per site, typed errors for malformed files."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fedstats import datasets
from fedstats.errors import DataFileError


def test_flamby_preparation_counts(heart):
    counts = heart.counts()
    assert counts["read"].to_dict() == {
        "cleveland": 303,
        "hungary": 294,
        "switzerland": 123,
        "va": 200,
    }
    assert counts["kept"].to_dict() == {
        "cleveland": 303,
        "hungary": 261,
        "switzerland": 46,
        "va": 130,
    }
    assert (counts["read"] == counts["kept"] + counts["excluded"]).all()
    frame = heart.frames["cleveland"]
    assert list(frame.columns) == [
        "age",
        "sex",
        "cp",
        "trestbps",
        "chol",
        "fbs",
        "restecg",
        "thalach",
        "exang",
        "oldpeak",
        "disease",
    ]
    assert set(frame["disease"]) == {0, 1}


def write_site_files(folder: Path, cleveland_text: str) -> None:
    target = folder / "heart_disease"
    target.mkdir(parents=True, exist_ok=True)
    good = "63.0,1.0,1.0,145.0,233.0,1.0,2.0,150.0,0.0,2.3,3.0,0.0,6.0,0\n"
    for name in datasets.HEART_FILES.values():
        (target / name).write_text(good * 3)
    (target / "processed.cleveland.data").write_text(cleveland_text)


def test_missing_folder_names_the_file(tmp_path):
    with pytest.raises(DataFileError, match=r"processed\.cleveland\.data: file not found"):
        datasets.heart_disease(tmp_path)


def test_wrong_field_count_names_file_and_line(tmp_path):
    write_site_files(tmp_path, "63,1,1,145,233,1,2,150,0,2.3,3,0,6,0\n63,1,1\n")
    with pytest.raises(DataFileError, match=r"processed\.cleveland\.data, line 2: 3 fields"):
        datasets.heart_disease(tmp_path)


@given(
    st.text(
        alphabet=st.characters(blacklist_categories=["Cs"], blacklist_characters=",\n\r"),
        min_size=1,
        max_size=6,
    )
)
@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
def test_any_bad_field_is_a_typed_error_or_a_number(tmp_path, field):
    write_site_files(tmp_path, f"63,1,1,145,{field},1,2,150,0,2.3,3,0,6,0\n" * 2)
    try:
        data = datasets.heart_disease(tmp_path)
    except DataFileError as error:
        assert "line 1, field 'chol'" in str(error)
    else:
        assert data.counts()["read"]["cleveland"] == 2
        chol = data.frames["cleveland"]["chol"]
        assert field.strip() == "?" or (len(chol) == 2 and chol.notna().all())
