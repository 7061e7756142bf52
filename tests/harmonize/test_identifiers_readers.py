"""The identifier table a run builds, against oracles written here from the raw files.

FHIR: the Patient JSON of the shared Synthea Bundles and Bulk Data NDJSON,
and synthetic Patients whose nickname comes before the official name and
whose work address comes before the home one. OMOP: ``person`` and
``location`` read with the ``csv`` module (shared Synthea27Nj and MIMIC-IV
demo, synthetic CSV and DuckDB). The same synthetic patients written as
FHIR and as OMOP give the same table, names apart (OMOP has none unless the
study says ``person_source_value`` holds them).

Oracle normalisation (independent of :mod:`harmonize.identifiers`): ASCII
transliteration by NFKD, lower case, hyphens and apostrophes removed, only
``a-z`` and single spaces; postal codes upper case, ``A-Z0-9`` only.
"""

from __future__ import annotations

import csv
import json
import re
import tomllib
import unicodedata
from datetime import date
from pathlib import Path

import pandas as pd
import pytest

from fedstats.datasets import default_data_dir
from harmonize.errors import HarmonizationError
from harmonize.identifiers import IDENTIFIER_COLUMNS, NO_NAMES
from harmonize.run import harmonize
from harmonize.spec import parse_spec
from harmonize.synthetic_ehr import (
    person_keys,
    synthetic_ehr,
    write_fhir_ndjson,
    write_omop_csv,
    write_omop_duckdb,
)
from linkage.schema import EXAMPLE_TABLE

DEMO = Path(__file__).resolve().parents[2] / "fedstats" / "examples" / "demo" / "study.toml"
DATA = default_data_dir()
LINKAGE = EXAMPLE_TABLE
MIMIC_TODAY = date(2300, 12, 31)  # MIMIC-IV shifts dates into 2100-2200


def spec_with(linkage: dict | None = LINKAGE, identifiers: dict | None = None):
    raw = tomllib.loads(DEMO.read_text())
    if linkage is not None:
        raw["linkage"] = linkage
    if identifiers is not None:
        raw["identifiers"] = identifiers
    return parse_spec(raw)


# ---------------------------------------------------------------- oracle
def oracle_name(value: object) -> str:
    if not isinstance(value, str):
        return ""
    spaced = "".join(" " if c.isspace() else c for c in unicodedata.normalize("NFKD", value))
    text = spaced.encode("ascii", "ignore").decode().lower().replace("-", "").replace("'", "")
    text = text.replace("\u2019", "")
    return " ".join(re.sub(r"[^a-z ]", "", text).split())


def oracle_postal(value: object) -> str:
    if not isinstance(value, str):
        return ""
    ascii_text = unicodedata.normalize("NFKD", value).encode("ascii", "ignore").decode()
    return re.sub(r"[^A-Z0-9]", "", ascii_text.upper())


def oracle_date(value: object) -> str:
    if not isinstance(value, str) or not re.fullmatch(r"\d{4}-\d{2}-\d{2}", value):
        return ""
    try:
        return date.fromisoformat(value).isoformat()
    except ValueError:
        return ""


def oracle_patient(patient: dict) -> list[str]:
    """The identifier row of a Patient's JSON, by FHIR's rules, written out by hand."""
    names = patient.get("name") or []
    official = [n for n in names if n.get("use") == "official"]
    name = official[0] if official else (names[0] if names else {})
    given = (name.get("given") or [None])[0]
    with_code = [a for a in patient.get("address") or [] if a.get("postalCode")]
    home = [a for a in with_code if a.get("use") == "home"]
    address = home[0] if home else (with_code[0] if with_code else {})
    gender = patient.get("gender")
    return [
        oracle_name(given),
        oracle_name(name.get("family")),
        oracle_date(patient.get("birthDate")),
        gender if gender in ("male", "female", "other", "unknown") else "",
        oracle_postal(address.get("postalCode")),
    ]


def patients_in(folder: Path) -> dict[str, dict]:
    """Every Patient of a folder of Bundles or NDJSON files, by person id (id, else fullUrl)."""
    found: dict[str, dict] = {}
    for path in sorted(folder.iterdir()):
        if path.suffix == ".ndjson":
            resources = [json.loads(line) for line in path.read_text().splitlines() if line]
            pairs = [(r.get("id"), r) for r in resources]
        elif path.suffix == ".json":
            bundle = json.loads(path.read_text())
            pairs = [
                (e["resource"].get("id") or e.get("fullUrl"), e["resource"])
                for e in bundle.get("entry", [])
            ]
        else:
            continue
        found.update({pid: r for pid, r in pairs if r.get("resourceType") == "Patient"})
    return found


def assert_table_shape(table: pd.DataFrame, frame: pd.DataFrame) -> None:
    assert table.index.equals(frame.index)
    assert list(table.columns) == list(IDENTIFIER_COLUMNS)
    assert all(isinstance(v, str) for v in table.to_numpy().ravel())


# ---------------------------------------------------------------- FHIR
@pytest.mark.parametrize(
    "folder",
    [DATA / "fhir" / "synthea_bundles", DATA / "fhir" / "synthea_bulk_10_patients"],
    ids=["bundles", "bulk-ndjson"],
)
def test_fhir_identifiers_equal_an_oracle_from_the_patient_json(folder):
    result = harmonize(spec_with(), site="s", fhir=folder)
    table = result.identifiers
    assert table is not None and len(result.frame) > 0
    assert_table_shape(table, result.frame)
    patients = patients_in(folder)
    expected = pd.DataFrame(
        [oracle_patient(patients[pid]) for pid in table.index],
        index=table.index,
        columns=list(IDENTIFIER_COLUMNS),
    )
    pd.testing.assert_frame_equal(table, expected)
    assert (table["family_name"] != "").all() and (table["postal_code"] != "").all()
    missing = result.report.identifiers_missing
    assert missing == {c: int((expected[c] == "").sum()) for c in IDENTIFIER_COLUMNS}


def test_fhir_takes_the_official_name_and_the_home_address(tmp_path):
    """Each synthetic Patient lists a nickname before its official name (with a second given
    name) and a work address before its home address."""
    ehr = synthetic_ehr(120, seed=3, identifiers=True)
    result = harmonize(spec_with(), site="s", fhir=write_fhir_ndjson(ehr, tmp_path))
    table = result.identifiers
    assert_table_shape(table, result.frame)
    raw = ehr.patients.set_index("person_id").loc[table.index]
    assert table["given_name"].tolist() == [oracle_name(v) for v in raw["given_name"]]
    assert table["family_name"].tolist() == [oracle_name(v) for v in raw["family_name"]]
    assert table["postal_code"].tolist() == [oracle_postal(v) for v in raw["postal_code"]]
    assert table["birth_date"].tolist() == [str(d)[:10] for d in raw["birth_date"]]
    assert table["sex"].tolist() == raw["sex"].tolist()
    assert {"mullerludenscheidt", "obrien", "darcy"} <= set(table["family_name"])
    assert "nick" not in set(table["given_name"]) and "99999" not in set(table["postal_code"])


def _encounter(eid: str, subject: str, day: str) -> dict:
    return {
        "resource": {
            "resourceType": "Encounter",
            "id": eid,
            "status": "finished",
            "class": {"code": "AMB"},
            "subject": {"reference": subject},
            "period": {"start": day},
        }
    }


def test_fhir_missing_fields_are_empty_and_contained_patients_are_read(tmp_path):
    """A Patient with no name, gender or address; one with a name but no official one and
    postal codes on no home address; a Patient contained in its Encounter (who died within
    the outcome window, so that one record is enough to enter the frame)."""
    contained = {
        "resourceType": "Encounter",
        "id": "holder",
        "status": "finished",
        "class": {"code": "AMB"},
        "contained": [
            {
                "resourceType": "Patient",
                "id": "baby",
                "birthDate": "1980-02-29",
                "deceasedDateTime": "2014-01-01",
                "gender": "female",
                "name": [{"given": ["Zoë", "x"], "family": "Ñúñez"}],
            }
        ],
        "subject": {"reference": "#baby"},
        "period": {"start": "2012-01-01"},
    }
    bundle = {
        "resourceType": "Bundle",
        "type": "collection",
        "entry": [
            {"resource": {"resourceType": "Patient", "id": "a", "birthDate": "1970-05-01"}},
            {
                "resource": {
                    "resourceType": "Patient",
                    "id": "b",
                    "birthDate": "1960-01-02",
                    "gender": "other",
                    "name": [{"use": "usual", "given": ["Seán"]}, {"family": "Second"}],
                    "address": [{"use": "work"}, {"use": "temp", "postalCode": "h3z 2y7"}],
                }
            },
            _encounter("e1", "Patient/a", "2012-01-01"),
            _encounter("e2", "Patient/a", "2022-01-01"),
            _encounter("e3", "Patient/b", "2012-01-01"),
            _encounter("e4", "Patient/b", "2022-01-01"),
            {"resource": contained},
        ],
    }
    path = tmp_path / "b.json"
    path.write_text(json.dumps(bundle))
    result = harmonize(spec_with(), site="s", fhir=path, latest_date=date(2024, 12, 31))
    table = result.identifiers
    assert_table_shape(table, result.frame)
    assert table.loc["a"].tolist() == ["", "", "1970-05-01", "", ""]
    assert table.loc["b"].tolist() == ["sean", "", "1960-01-02", "other", "H3Z2Y7"]
    assert table.loc["Encounter/holder#baby"].tolist() == [
        "zoe",
        "nunez",
        "1980-02-29",
        "female",
        "",
    ]


def test_a_fhir_file_changed_since_reading_is_named(tmp_path, monkeypatch):
    ehr = synthetic_ehr(60, seed=4, identifiers=True)
    folder = write_fhir_ndjson(ehr, tmp_path)
    import harmonize.identifiers_fhir as module

    real = module._records

    def truncated(path, locations):
        path.write_text("")
        return real(path, locations)

    monkeypatch.setattr(module, "_records", truncated)
    with pytest.raises(HarmonizationError, match=r"Patient\.000\.ndjson: no record at line"):
        harmonize(spec_with(), site="s", fhir=folder)


# ---------------------------------------------------------------- OMOP
def read_csv_table(folder: Path, name: str) -> list[dict]:
    path = next(p for p in folder.iterdir() if p.name.lower() == f"{name}.csv")
    with path.open(newline="", encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


def oracle_omop(folder: Path) -> dict[str, list[str]]:
    """Identifier rows by person id from person.csv and location.csv, by the CDM's fields."""
    zips = {row["location_id"]: row["zip"] for row in read_csv_table(folder, "location")}
    rows: dict[str, list[str]] = {}
    for person in read_csv_table(folder, "person"):
        if person["person_id"] in rows:
            continue
        y, m, d = (person[k] for k in ("year_of_birth", "month_of_birth", "day_of_birth"))
        try:
            born = date(int(y), int(m), int(d)).isoformat()
        except ValueError:
            born = ""
        concept = person["gender_concept_id"]
        sex = {"8507": "male", "8532": "female"}.get(concept, "unknown" if concept else "")
        zip_code = zips.get(person.get("location_id") or "", "")
        rows[person["person_id"]] = ["", "", born, sex, oracle_postal(zip_code)]
    return rows


@pytest.mark.parametrize(
    ("folder", "today"),
    [
        (DATA / "omop" / "synthea27nj_5.4", None),
        (DATA / "omop" / "mimic_iv_demo_5.3", MIMIC_TODAY),
    ],
    ids=["synthea27nj", "mimic-demo"],
)
def test_omop_identifiers_equal_an_oracle_from_the_csv_tables(folder, today):
    result = harmonize(spec_with(), site="s", omop=folder, latest_date=today)
    table = result.identifiers
    assert_table_shape(table, result.frame)
    assert len(table) > 0
    oracle = oracle_omop(folder)
    expected = pd.DataFrame(
        [oracle[pid] for pid in table.index], index=table.index, columns=list(IDENTIFIER_COLUMNS)
    )
    pd.testing.assert_frame_equal(table, expected)
    assert NO_NAMES in result.report.notes
    assert result.report.identifiers_missing["given_name"] == len(table)


@pytest.mark.parametrize("form", ["csv", "duckdb"])
def test_omop_synthetic_identifiers_with_locations(tmp_path, form):
    ehr = synthetic_ehr(120, seed=5, identifiers=True)
    csv_folder = write_omop_csv(ehr, tmp_path / "csv")
    source = csv_folder if form == "csv" else write_omop_duckdb(ehr, tmp_path / "cdm.duckdb")
    result = harmonize(spec_with(), site="s", omop=source)
    table = result.identifiers
    assert_table_shape(table, result.frame)
    oracle = oracle_omop(csv_folder)
    expected = pd.DataFrame(
        [oracle[pid] for pid in table.index], index=table.index, columns=list(IDENTIFIER_COLUMNS)
    )
    pd.testing.assert_frame_equal(table, expected)
    assert (table["postal_code"] != "").all() and (table["birth_date"] != "").all()


def test_fhir_and_omop_of_the_same_patients_give_the_same_identifiers(tmp_path):
    ehr = synthetic_ehr(200, seed=6, identifiers=True)
    from_fhir = harmonize(spec_with(), site="s", fhir=write_fhir_ndjson(ehr, tmp_path / "f"))
    from_omop = harmonize(spec_with(), site="s", omop=write_omop_csv(ehr, tmp_path / "o"))
    fhir_table = from_fhir.identifiers.rename(index=person_keys(ehr)).sort_index()
    omop_table = from_omop.identifiers.sort_index()
    assert len(fhir_table) > 50
    columns = ["birth_date", "sex", "postal_code"]
    pd.testing.assert_frame_equal(fhir_table[columns], omop_table[columns], check_names=False)
    assert (fhir_table["family_name"] != "").all()
    assert (omop_table[["given_name", "family_name"]] == "").all().all()


def test_omop_names_from_person_source_value_when_the_study_says_so(tmp_path):
    """``person_source_value`` as HL7 v2 XPN ``family^given``: then the tables agree in full."""
    ehr = synthetic_ehr(150, seed=7, identifiers=True)
    folder = write_omop_csv(ehr, tmp_path / "o")
    person = pd.read_csv(folder / "person.csv", dtype=str, keep_default_na=False)
    raw = ehr.patients.set_index("person_id")
    person["person_source_value"] = [
        f"{raw.at[pid, 'family_name']}^{raw.at[pid, 'given_name']}^Second^^Dr."
        for pid in ehr.patients["person_id"]
    ]
    person.to_csv(folder / "person.csv", index=False)
    spec = spec_with(identifiers={"omop_names": "person_source_value"})
    from_omop = harmonize(spec, site="s", omop=folder)
    from_fhir = harmonize(spec, site="s", fhir=write_fhir_ndjson(ehr, tmp_path / "f"))
    fhir_table = from_fhir.identifiers.rename(index=person_keys(ehr)).sort_index()
    pd.testing.assert_frame_equal(fhir_table, from_omop.identifiers.sort_index(), check_names=False)
    assert NO_NAMES not in from_omop.report.notes
    without = harmonize(spec_with(), site="s", omop=folder)  # not said: no names
    assert (without.identifiers[["given_name", "family_name"]] == "").all().all()


# ---------------------------------------------------------------- without linkage
@pytest.mark.parametrize("kind", ["fhir", "omop"])
def test_without_linkage_no_identifier_is_read_or_kept(tmp_path, monkeypatch, kind):
    """The plain path never calls the identifier readers, and gives the same frame and report
    values as a run with linkage (apart from the spec digest and the missing counts)."""
    import harmonize.identifiers_fhir as fhir_module
    import harmonize.identifiers_omop as omop_module

    ehr = synthetic_ehr(100, seed=8, identifiers=True)
    source = (
        write_fhir_ndjson(ehr, tmp_path / "f") if kind == "fhir" else write_omop_csv(ehr, tmp_path)
    )
    linked = harmonize(spec_with(), site="s", **{kind: source})

    def refuse(*args, **kwargs):
        raise AssertionError("identifiers read without a [linkage] table")

    monkeypatch.setattr(fhir_module, "fhir_identifiers", refuse)
    monkeypatch.setattr(omop_module, "omop_identifiers", refuse)
    plain = harmonize(spec_with(linkage=None), site="s", **{kind: source})
    assert plain.identifiers is None
    assert plain.report.identifiers_missing == {}
    pd.testing.assert_frame_equal(plain.frame, linked.frame)
    assert plain.report.data_sha256 == linked.report.data_sha256
    ignore = {"spec_digest", "fingerprint", "identifiers_missing", "created_at", "notes"}
    same = {k: v for k, v in plain.report.to_dict().items() if k not in ignore}
    assert same == {k: v for k, v in linked.report.to_dict().items() if k not in ignore}
    assert plain.report.spec_digest != linked.report.spec_digest


# ---------------------------------------------------------------- leaks
def _secrets(ehr, table: pd.DataFrame) -> set[str]:
    """Every identifier value of the frame's patients, raw and normalised (names, postal codes,
    birth dates)."""
    raw = ehr.patients.set_index("person_id")
    raw = raw.rename(index=person_keys(ehr)) if table.index[0] not in raw.index else raw
    raw = raw.loc[table.index]
    values = set()
    for column in ("given_name", "family_name", "postal_code"):
        values |= set(raw[column]) | set(table[column])
    values |= set(table["birth_date"])
    return {v for v in values if v}


@pytest.mark.parametrize("kind", ["fhir", "omop"])
def test_identifiers_never_reach_the_frame_report_fingerprint_or_outputs(tmp_path, kind):
    """Serialise everything a run hands on (the frame as Parquet and CSV, its attrs, the report
    as JSON and text, the fingerprint, the quarantine, the files written) and look for every
    name, postal code and birth date in it."""
    import fedstats
    from harmonize.run import write_outputs

    ehr = synthetic_ehr(150, seed=9, identifiers=True)
    source = (
        write_fhir_ndjson(ehr, tmp_path / "f") if kind == "fhir" else write_omop_csv(ehr, tmp_path)
    )
    result = harmonize(spec_with(), site="s", **{kind: source})
    secrets = _secrets(ehr, result.identifiers)
    assert {"mullerludenscheidt", "Müller-Lüdenscheidt", "SW1A1AA", "sw1a 1aa"} & secrets
    out = write_outputs(result, tmp_path / "out")
    written = b"".join(path.read_bytes() for path in out.values())
    texts = [
        result.frame.to_csv(),
        json.dumps(result.frame.attrs, default=str),
        json.dumps(result.report.to_dict(), default=str),
        result.report.to_text(),
        json.dumps(result.report.site_fingerprint().as_record()),
        result.quarantine.to_csv(),
        repr(result),
        written.decode("utf-8", "replace"),
    ]
    for text in texts:
        folded = text.casefold()
        leaked = sorted(s for s in secrets if s.casefold() in folded)
        assert not leaked, leaked
    # sex is a covariate of the study; no other identifier is a column of the frame
    assert set(result.frame.columns) & set(IDENTIFIER_COLUMNS) == {"sex"}
    assert sorted(p.name for p in out.values()) == [
        "frame.parquet",
        "quarantine.csv",
        "report.json",
        "report.txt",
    ]
    # the silo is built from the frame alone; its fingerprint carries no identifier either
    federation = fedstats.Federation.in_process({"s": result.frame})
    assert federation.sites == ["s"] or set(federation.sites) == {"s"}


def test_sites_with_different_linkage_schemas_cannot_be_combined(tmp_path):
    import fedstats
    from fedstats.errors import FingerprintMismatchError

    ehr = synthetic_ehr(80, seed=10, identifiers=True)
    folder = write_fhir_ndjson(ehr, tmp_path)
    other = {**LINKAGE, "threshold": 0.9}
    a = harmonize(spec_with(), site="a", fhir=folder)
    b = harmonize(spec_with(other), site="b", fhir=folder)
    assert a.report.fingerprint != b.report.fingerprint
    with pytest.raises(FingerprintMismatchError):
        fedstats.Federation.in_process({"a": a.frame, "b": b.frame})
    same = harmonize(spec_with(), site="c", fhir=folder)
    fedstats.Federation.in_process({"a": a.frame, "c": same.frame})  # same schema: combined
