"""Reading the packaged datasets: counts per site, where the files come from (packaged copy,
``$FEDSTATS_DATA`` override, explicit folder), typed errors for missing or malformed files."""

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


def test_missing_folder_names_the_folder_and_the_file(tmp_path):
    """An explicit data folder is never silently replaced by the packaged copy."""
    folder = tmp_path / "heart_disease"
    with pytest.raises(DataFileError) as error:
        datasets.heart_disease(tmp_path)
    message = str(error.value)
    assert message.startswith(f"{folder}: file not found: processed.cleveland.data, ")
    assert "processed.va.data;" in message


def shared_folder() -> Path:
    try:
        return datasets.default_data_dir()
    except DataFileError as absent:
        pytest.skip(f"no shared data folder: {absent}")


@pytest.mark.parametrize("name", sorted(datasets.DATASET_FILES))
def test_packaged_files_are_byte_identical_to_the_shared_copies(name):
    packaged = datasets.packaged_data_dir() / name
    shared = shared_folder() / name
    if not shared.is_dir():
        pytest.skip(f"{shared} absent")
    files = sorted(p.name for p in packaged.iterdir() if p.name != "README.md")
    assert set(datasets.DATASET_FILES[name]) <= set(files)
    assert files == sorted(p.name for p in shared.iterdir())
    for file in files:
        assert (packaged / file).read_bytes() == (shared / file).read_bytes(), file
    notice = (packaged / "README.md").read_text(encoding="utf-8")
    assert "## Licence" in notice or "## Terms of use" in notice
    assert "## Citation" in notice


def test_an_override_without_the_dataset_falls_back_to_the_packaged_copy(tmp_path, monkeypatch):
    """``$FEDSTATS_DATA`` is the shared folder (FHIR, OMOP); without heart_disease/ or
    tcga_brca/ in it, the packaged datasets load, and say where they were read from."""
    monkeypatch.setenv("FEDSTATS_DATA", str(tmp_path))
    heart = datasets.heart_disease()
    assert heart.folder == datasets.packaged_data_dir() / "heart_disease"
    assert heart.counts()["kept"].sum() == 740
    brca = datasets.tcga_brca()
    assert brca.folder == datasets.packaged_data_dir() / "tcga_brca"
    assert sum(len(f) for f in brca.frames.values()) == 1088


def test_an_override_with_the_dataset_is_read(tmp_path, monkeypatch):
    write_site_files(tmp_path, "63,1,1,145,233,1,2,150,0,2.3,3,0,6,0\n" * 2)
    monkeypatch.setenv("FEDSTATS_DATA", str(tmp_path))
    heart = datasets.heart_disease()
    assert heart.folder == tmp_path / "heart_disease"
    assert heart.counts()["read"].to_dict() == {
        "cleveland": 2,
        "hungary": 3,
        "switzerland": 3,
        "va": 3,
    }


def test_an_incomplete_override_names_the_folder_and_the_missing_file(tmp_path, monkeypatch):
    folder = tmp_path / "tcga_brca"
    folder.mkdir()
    (folder / "brca.csv").write_text("pid,T,E\n")
    monkeypatch.setenv("FEDSTATS_DATA", str(tmp_path))
    with pytest.raises(DataFileError) as error:
        datasets.tcga_brca()
    message = str(error.value)
    assert message.startswith(f"{folder}: file not found: train_test_split.csv;")
    assert "unset FEDSTATS_DATA" in message


def test_shared_folder_override_must_exist(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDSTATS_DATA", str(tmp_path / "nowhere"))
    with pytest.raises(DataFileError, match=r"FEDSTATS_DATA=.*nowhere is not a folder"):
        datasets.default_data_dir()


def test_no_shared_folder_lists_each_place_once(tmp_path, monkeypatch):
    """A checkout at tmp/checkout run from tmp/work: both guesses are tmp/shared/data."""
    monkeypatch.delenv("FEDSTATS_DATA", raising=False)
    monkeypatch.setattr(datasets, "__file__", str(tmp_path / "checkout/fedstats/datasets.py"))
    (tmp_path / "work").mkdir()
    monkeypatch.chdir(tmp_path / "work")
    with pytest.raises(DataFileError) as error:
        datasets.default_data_dir()
    message = str(error.value)
    assert message.count(str(tmp_path / "shared" / "data")) == 1
    assert "set FEDSTATS_DATA to the folder holding fhir/ and omop/" in message


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
