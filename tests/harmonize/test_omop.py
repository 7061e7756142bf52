"""The OMOP CDM reader: real CDM 5.4 and 5.3 databases, three storage formats, the CDM check,
generated dirty folders (hypothesis) and a one-million-row size check.

Facts about Synthea27Nj (CDM 5.4) and the MIMIC-IV demo (CDM 5.3) were checked by hand
on the CSV files (``awk``/DuckDB counts), independently of the reader.
"""

from __future__ import annotations

import csv
import os
import shutil
import tempfile
import time
import tomllib
from collections import Counter
from datetime import date, timedelta
from pathlib import Path

import duckdb
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harmonize import cdm
from harmonize.cdm import VERSIONS, detect_version, find_spec_folder, load_cdm_spec
from harmonize.errors import HarmonizationError
from harmonize.omop import USED_TABLES, read_omop
from harmonize.records import RecordStore
from harmonize.spec import SYSTEMS

DATA = Path(
    os.environ.get("FEDSTATS_DATA", Path(__file__).resolve().parents[3] / "shared" / "data")
)
SYNTHEA = DATA / "omop" / "synthea27nj_5.4"
MIMIC = DATA / "omop" / "mimic_iv_demo_5.3"
SPEC = DATA / "omop" / "cdm_spec"
MIMIC_TODAY = date(2299, 12, 31)  # MIMIC shifts dates into 2110-2210
TODAY = date(2024, 6, 30)
DEMO = Path(__file__).resolve().parents[2] / "fedstats" / "examples" / "demo" / "study.toml"
STORE_TABLES = ("persons", "periods", "events", "read_counts", "excluded_at_read", "rejected")

pytestmark = pytest.mark.skipif(not SYNTHEA.is_dir(), reason="shared OMOP data not available")


def read(source: Path, **options: object) -> RecordStore:
    store = RecordStore()
    read_omop(source, store, **options)  # type: ignore[arg-type]
    return store


def accounting(store: RecordStore) -> tuple[int, int]:
    """(read, represented + excluded at read + rejected), from the store tables only."""
    totals = store.totals()
    represented = store.connection.execute(
        "SELECT count(DISTINCT record_ref) FROM (SELECT record_ref FROM persons "
        "UNION ALL SELECT record_ref FROM periods UNION ALL SELECT record_ref FROM events)"
    ).fetchall()[0][0]
    return totals["read"], represented + totals["excluded_at_read"] + totals["rejected"]


def contents(store: RecordStore) -> dict[str, pd.DataFrame]:
    return {t: store.frame(f"SELECT * FROM {t} ORDER BY ALL") for t in STORE_TABLES}


def one(store: RecordStore, sql: str) -> object:
    return store.connection.execute(sql).fetchall()[0][0]


def copy_tables(
    source: Path, target: Path, sql: dict[str, str] | None = None, **names: str
) -> Path:
    """Copy CSV tables (``names``: file stem → new file name); ``sql`` rewrites a table."""
    target.mkdir(parents=True, exist_ok=True)
    for stem, new in names.items():
        path = next(source.glob(f"{stem}.csv"))
        if sql and stem in sql:
            select = sql[stem].format(src=f"read_csv('{path}')")
            duckdb.execute(f"COPY ({select}) TO '{target / new}' (HEADER)")
        else:
            shutil.copy(path, target / new)
    return target


# ------------------------------------------------------------------ real databases
@pytest.fixture(scope="module")
def synthea() -> RecordStore:
    return read(SYNTHEA)


@pytest.fixture(scope="module")
def mimic() -> RecordStore:
    return read(MIMIC, today=MIMIC_TODAY)


def test_synthea_reads_with_hand_checked_facts(synthea):
    read_, accounted = accounting(synthea)
    assert read_ == accounted
    assert synthea.totals()["rejected"] == 0
    assert one(synthea, "SELECT count(*) FROM persons") == 28
    assert one(synthea, "SELECT count(*) FROM persons WHERE sex = 'male'") == 15
    assert one(synthea, "SELECT count(*) FROM periods") == 28
    assert (
        one(synthea, "SELECT count(DISTINCT record_ref) FROM events WHERE domain = 'measurement'")
        == 10_040
    )
    assert one(synthea, "SELECT n FROM read_counts WHERE source = 'measurement'") == 10_040
    person = synthea.frame("SELECT * FROM persons WHERE person_id = '1'").iloc[0]
    assert (person.birth_date.date(), person.sex) == (date(1998, 4, 9), "male")
    deaths = synthea.frame("SELECT person_id, death_date FROM persons WHERE death_date IS NOT NULL")
    assert sorted(deaths.person_id) == ["11", "23", "7"]
    assert one(synthea, "SELECT count(*) FROM events WHERE domain = 'death'") == 3
    systolic = synthea.frame("SELECT * FROM events WHERE concept_id = 3004249")
    assert len(systolic) == 726
    assert set(systolic.unit) == {"mm[Hg]"}
    assert set(zip(systolic.system, systolic.code, strict=True)) == {(SYSTEMS["loinc"], "8480-6")}
    weight = synthea.frame(
        "SELECT DISTINCT system, code, unit FROM events WHERE concept_id = 3025315"
    )
    assert weight.values.tolist() == [[SYSTEMS["loinc"], "29463-7", "kg"]]
    systems = dict(synthea.frame("SELECT domain, any_value(system) FROM events GROUP BY 1").values)
    assert systems["condition"] == SYSTEMS["snomed"]
    assert systems["medication"] == SYSTEMS["rxnorm"]
    assert systems["visit"] is None  # the Visit vocabulary has no FHIR system here
    assert one(synthea, "SELECT record_ref FROM events WHERE record_ref = 'measurement:1'")
    excluded = dict(synthea.frame("SELECT source, reason FROM excluded_at_read").values)
    assert excluded["visit_detail"] == "table not used by the spec"
    assert excluded["concept_relationship"].startswith("vocabulary table")


def test_mimic_5_3_reads_with_hand_checked_facts(mimic):
    read_, accounted = accounting(mimic)
    assert read_ == accounted
    assert mimic.totals()["rejected"] == 0
    assert one(mimic, "SELECT count(*) FROM persons") == 100
    assert one(mimic, "SELECT count(*) FROM persons WHERE death_date IS NOT NULL") == 15
    assert one(mimic, "SELECT count(*) FROM events WHERE domain = 'death'") == 15
    assert one(mimic, "SELECT count(*) FROM persons WHERE sex = 'female'") == 43
    # year_of_birth only: month and day become 1
    assert (
        one(mimic, "SELECT count(*) FROM persons WHERE strftime(birth_date, '%m-%d') = '01-01'")
        == 100
    )
    assert one(mimic, "SELECT count(*) FROM events WHERE domain = 'condition'") == 16_441
    # 546 drug rows have concept 0 and source concept 0: nothing to map, concept NULL
    assert (
        one(mimic, "SELECT count(*) FROM events WHERE domain = 'medication' AND concept_id IS NULL")
        == 546
    )
    assert one(mimic, "SELECT count(*) FROM events WHERE domain = 'measurement'") == 0


def test_mimic_without_today_is_refused_for_future_dates():
    with pytest.raises(HarmonizationError, match=r"table person.*in the future.*today="):
        read(MIMIC)


@pytest.mark.parametrize("database", [SYNTHEA, MIMIC], ids=["synthea", "mimic"])
def test_csv_parquet_and_duckdb_give_identical_stores(database, tmp_path):
    today = MIMIC_TODAY
    parquet, duck = tmp_path / "parquet", tmp_path / "cdm.duckdb"
    parquet.mkdir()
    connection = duckdb.connect(str(duck))
    for path in sorted(database.glob("*.csv")):
        stem = path.stem.lower()  # lower-case Parquet names from upper-case CSV names
        connection.execute(f"COPY (SELECT * FROM read_csv('{path}')) TO '{parquet / stem}.parquet'")
        connection.execute(f"CREATE TABLE \"{path.stem}\" AS SELECT * FROM read_csv('{path}')")
    connection.close()
    expected = contents(read(database, today=today))
    for source in (parquet, duck):
        got = contents(read(source, today=today, cdm_spec=SPEC))
        for table in STORE_TABLES:
            pd.testing.assert_frame_equal(got[table], expected[table], obj=f"{source.name}:{table}")


def test_concept_zero_is_mapped_through_maps_to(synthea, tmp_path):
    """Synthea's measurement source concepts are standard; each 'Maps to' itself."""
    folder = copy_tables(
        SYNTHEA,
        tmp_path / "cdm",
        {"MEASUREMENT": "SELECT * REPLACE (0 AS measurement_concept_id) FROM {src}"},
        PERSON="PERSON.csv",
        MEASUREMENT="MEASUREMENT.csv",
        CONCEPT="CONCEPT.csv",
        CONCEPT_RELATIONSHIP="concept_relationship.csv",
    )
    store = read(folder)
    query = "SELECT * EXCLUDE (record_type) FROM events WHERE domain = 'measurement' ORDER BY ALL"
    pd.testing.assert_frame_equal(store.frame(query), synthea.frame(query))


MINI = {
    "person.csv": """\
person_id,gender_concept_id,year_of_birth,month_of_birth,day_of_birth,birth_datetime,gender_source_value
1,0,1950,,,,F
2,0,1960,6,,,
3,4215271,1970,2,3,1970-02-04 10:00:00,
4,8551,1980,1,1,,
5,8532,1990,2,30,,
""",
    "measurement.csv": """\
measurement_id,person_id,measurement_concept_id,measurement_date,value_as_number,unit_concept_id,\
unit_source_value,measurement_source_concept_id
10,1,3004249,2020-01-01,120,8876,mmHg,0
11,1,3004249,2020-01-02,121,0,mmHg,0
12,2,9202,2020-01-03,,0,,0
13,5,3004249,2020-01-03,1,8876,,0
""",
    "concept.csv": "concept_id,vocabulary_id,concept_code\n3004249,LOINC,8480-6\n8876,UCUM,mm[Hg]\n"
    "9202,Visit,OP\n",
}


def mini_folder(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in MINI.items():
        (folder / name).write_text(text)
    return folder


def test_person_and_unit_rules_on_a_small_folder(tmp_path):
    store = read(mini_folder(tmp_path / "cdm"), today=TODAY, max_rejected_share=0.5, cdm_spec=SPEC)
    rows = store.connection.execute
    assert rows("SELECT person_id, birth_date, sex FROM persons ORDER BY 1").fetchall() == [
        ("1", date(1950, 1, 1), "female"),  # gender_source_value F; January 1st imputed
        ("2", date(1960, 6, 1), None),  # no gender information at all
        ("3", date(1970, 2, 4), "unknown"),  # birth_datetime wins over month and day
        ("4", date(1980, 1, 1), "unknown"),  # 8551 = unknown
    ]
    assert rows("SELECT location, field, reason FROM rejected ORDER BY 1").fetchall() == [
        ("measurement:13", "person_id", "the person was rejected"),
        ("person:5", "day_of_birth", "impossible birth date from year/month/day_of_birth"),
    ]
    events = "SELECT record_ref, system, code, concept_id, value, unit FROM events ORDER BY 1"
    assert rows(events).fetchall() == [
        ("measurement:10", SYSTEMS["loinc"], "8480-6", 3004249, 120.0, "mm[Hg]"),  # UCUM concept
        ("measurement:11", SYSTEMS["loinc"], "8480-6", 3004249, 121.0, "mmHg"),  # source value
        ("measurement:12", None, None, 9202, None, None),  # Visit vocabulary: no FHIR system
    ]


def test_duckdb_schemas_and_parquet_part_folders(tmp_path):
    folder = mini_folder(tmp_path / "csv")
    expected = contents(read(folder, today=TODAY, max_rejected_share=0.5, cdm_spec=SPEC))
    database = tmp_path / "cdm.duckdb"
    connection = duckdb.connect(str(database))
    connection.execute("CREATE SCHEMA omop; CREATE SCHEMA vocab")
    for table, schema in (("person", "omop"), ("measurement", "omop"), ("concept", "vocab")):
        connection.execute(
            f"CREATE TABLE {schema}.{table} AS SELECT * FROM read_csv('{folder / table}.csv', "
            f"all_varchar = {table == 'person'})"  # typed: 'F' alone would become a BOOLEAN
        )
    connection.close()
    parts = tmp_path / "parquet"
    (parts / "measurement").mkdir(parents=True)
    for table in ("person", "concept"):
        duckdb.execute(
            f"COPY (FROM read_csv('{folder / table}.csv', all_varchar = {table == 'person'})) "
            f"TO '{parts / table}.parquet'"
        )
    for index, where in enumerate(("measurement_id < 12", "measurement_id >= 12")):
        duckdb.execute(
            f"COPY (FROM read_csv('{folder}/measurement.csv') WHERE {where}) "
            f"TO '{parts}/measurement/part-{index}.parquet'"
        )
    for source in (database, parts):
        got = contents(read(source, today=TODAY, max_rejected_share=0.5, cdm_spec=SPEC))
        for table in STORE_TABLES:
            pd.testing.assert_frame_equal(got[table], expected[table], obj=f"{source.name}:{table}")


# ------------------------------------------------------------------ CDM specification
@pytest.mark.parametrize("version", VERSIONS)
def test_built_in_required_flags_agree_with_the_specification(version):
    spec = load_cdm_spec(SPEC, version)
    assert spec is not None
    for table in USED_TABLES:
        for column, required in table.used().items():
            assert spec.is_required(table.name, column) == required, (table.name, column)


def test_version_is_detected_from_cdm_source_or_columns():
    assert detect_version({}, SPEC, "5.3.1")[0] == "5.3"
    assert detect_version({}, SPEC, "v5.4.0")[0] == "5.4"
    old = {"visit_occurrence": ["visit_occurrence_id", "admitting_source_concept_id"]}
    new = {"measurement": ["measurement_id", "MEASUREMENT_EVENT_ID"]}
    assert detect_version(old, SPEC)[0] == "5.3"
    assert detect_version(new, SPEC)[0] == "5.4"
    assert find_spec_folder(SYNTHEA) == SPEC.resolve()
    note = load_cdm_spec(SPEC, "5.4")
    assert note is not None and "offset" in note.columns("note_nlp")  # quotes dropped


def test_missing_required_column_is_named(tmp_path):
    folder = copy_tables(
        SYNTHEA,
        tmp_path,
        {"MEASUREMENT": "SELECT * EXCLUDE (measurement_date) FROM {src}"},
        PERSON="PERSON.csv",
        MEASUREMENT="MEASUREMENT.csv",
    )
    with pytest.raises(HarmonizationError, match=r"table measurement lacks.*measurement_date"):
        read(folder)
    store = RecordStore()
    with pytest.raises(HarmonizationError):
        read_omop(folder, store)
    assert store.totals() == {
        "unprocessed": 0,
        "read": 0,
        "excluded_at_read": 0,
        "rejected": 0,
    }  # nothing written


def test_names_in_any_case_and_missing_optional_columns_are_accepted(tmp_path):
    upper_columns = "SELECT " + ", ".join(
        f'"{c}" AS "{c.upper()}"' for c in ("person_id", "gender_concept_id", "year_of_birth")
    )
    folder = copy_tables(
        SYNTHEA,
        tmp_path,
        {
            "PERSON": upper_columns + " FROM {src}",
            # value_as_number is optional; measurement_type_concept_id is required but unused
            "MEASUREMENT": "SELECT * EXCLUDE (value_as_number, measurement_type_concept_id) "
            "FROM {src}",
        },
        PERSON="Person.csv",
        MEASUREMENT="measurement.csv",
        DEATH="DEATH.CSV",
    )
    store = read(folder, cdm_version="5.4")
    assert one(store, "SELECT count(*) FROM persons WHERE birth_date IS NOT NULL") == 28
    assert one(store, "SELECT count(*) FROM events WHERE domain = 'measurement'") == 10_040
    assert one(store, "SELECT count(value) FROM events") == 0
    assert one(store, "SELECT count(*) FROM persons WHERE death_date IS NOT NULL") == 3


def test_without_a_specification_the_built_in_required_columns_are_checked(tmp_path, monkeypatch):
    monkeypatch.setattr(cdm, "find_spec_folder", lambda *args: None)
    folder = mini_folder(tmp_path / "cdm")
    assert (
        one(read(folder, today=TODAY, max_rejected_share=0.5), "SELECT count(*) FROM events") == 3
    )
    (folder / "person.csv").write_text("person_id,gender_concept_id\n1,8507\n")
    with pytest.raises(HarmonizationError, match=r"table person lacks the column.* year_of_birth"):
        read(folder, today=TODAY)


@pytest.mark.parametrize("kind", ["missing", "not duckdb", "no person"])
def test_unreadable_sources_are_named(kind, tmp_path):
    if kind == "missing":
        source = tmp_path / "nowhere"
    elif kind == "not duckdb":
        source = tmp_path / "cdm.duckdb"
        source.write_text("person_id\n1\n")
    else:
        source = copy_tables(SYNTHEA, tmp_path / "cdm", MEASUREMENT="MEASUREMENT.csv")
    with pytest.raises(HarmonizationError, match=str(source.name)):
        read(source)


def test_rejected_share_above_the_limit_names_table_counts_and_reasons(tmp_path):
    folder = copy_tables(
        SYNTHEA,
        tmp_path,
        {"MEASUREMENT": "SELECT * REPLACE (CASE WHEN measurement_id % 4 = 0 THEN NULL "
         "ELSE measurement_date END AS measurement_date) FROM {src}"},
        PERSON="PERSON.csv",
        MEASUREMENT="MEASUREMENT.csv",
    )  # fmt: skip
    with pytest.raises(HarmonizationError, match=r"2510 of 10040 rows of table measurement.*"
                       r"missing measurement_date \(2510\)"):  # fmt: skip
        read(folder)
    store = read(folder, max_rejected_share=0.3)
    reasons = store.frame("SELECT location, field, reason FROM rejected")
    assert len(reasons) == 2510
    assert set(reasons.reason) == {"missing measurement_date"}
    assert "measurement:4" in set(reasons.location)


def test_malformed_csv_lines_are_rejected_with_their_line(tmp_path):
    folder = copy_tables(SYNTHEA, tmp_path, PERSON="PERSON.csv")
    with open(folder / "PERSON.csv", "a", encoding="utf-8") as handle:
        handle.write("99,8507\n")
    store = read(folder, max_rejected_share=0.5)
    rejected = store.frame("SELECT location, reason FROM rejected")
    assert rejected.values.tolist() == [["person:line 30", "malformed CSV line (missing columns)"]]
    assert accounting(store) == (29, 29)


# ------------------------------------------------------------------ generated dirty folders
JUNK = st.text(st.characters(codec="utf-8", exclude_categories=("Cs", "Cc")) | st.sampled_from(
    ',"\n ;'), max_size=8)  # fmt: skip
DATES = st.dates(date(1990, 1, 1), date(2023, 12, 31)).map(date.isoformat)
BAD_DATES = st.sampled_from(["2020-02-30", "2020-13-01", "yesterday", "31/12/2020", "2020"])
FUTURE = (TODAY + timedelta(days=400)).isoformat()
CONCEPT = [
    ("3004249", "Systolic blood pressure", "LOINC", "8480-6"),
    ("8876", "millimeter mercury column", "UCUM", "mm[Hg]"),
    ("201826", "Type 2 diabetes mellitus", "SNOMED", "44054006"),
    ("45123", "a source code", "ICD10CM", "E11.9"),
]
COLUMNS = {
    "person": ["person_id", "gender_concept_id", "year_of_birth", "month_of_birth",
               "day_of_birth", "birth_datetime", "race_concept_id", "ethnicity_concept_id",
               "gender_source_value"],
    "observation_period": ["observation_period_id", "person_id",
                           "observation_period_start_date", "observation_period_end_date",
                           "period_type_concept_id"],
    "measurement": ["measurement_id", "person_id", "measurement_concept_id", "measurement_date",
                    "measurement_type_concept_id", "value_as_number", "unit_concept_id",
                    "unit_source_value", "measurement_source_concept_id"],
    "condition_occurrence": ["condition_occurrence_id", "person_id", "condition_concept_id",
                             "condition_start_date", "condition_type_concept_id",
                             "condition_source_concept_id"],
    "death": ["person_id", "death_date"],
}  # fmt: skip
KEYS = {t: ("person_id" if t == "death" else c[0]) for t, c in COLUMNS.items()}
VALID_FAULTS = {"none", "unknown_concept", "mapped_concept", "unknown_unit", "no_value", "no_day"}


@st.composite
def person_rows(draw, n: int) -> list[tuple[dict, str]]:
    faults = ["none"] * 4 + ["missing_key", "text_key", "missing_year", "text_year",
                             "bad_month", "future_birth", "no_day", "text_gender"]  # fmt: skip
    rows = []
    for pid in range(1, n + 1):
        fault = draw(st.sampled_from(faults))
        row = {
            "person_id": str(pid),
            "gender_concept_id": draw(st.sampled_from(["8507", "8532", "0", "", "4215271"])),
            "year_of_birth": str(draw(st.integers(1920, 2010))),
            "month_of_birth": str(draw(st.integers(1, 12))),
            "day_of_birth": str(draw(st.integers(1, 28))),
            "birth_datetime": "",
            "race_concept_id": "0",
            "ethnicity_concept_id": "0",
            "gender_source_value": draw(JUNK),
        }
        row |= {
            "missing_key": {"person_id": ""},
            "text_key": {"person_id": f"P{pid}"},
            "missing_year": {"year_of_birth": ""},
            "text_year": {"year_of_birth": "19x0"},
            "bad_month": {"month_of_birth": "13"},
            "future_birth": {"year_of_birth": str(TODAY.year + 2)},
            "no_day": {"day_of_birth": ""},
            "text_gender": {"gender_concept_id": "male"},
        }.get(fault, {})
        rows.append((row, fault))
    return rows


@st.composite
def event_rows(draw, table: str, n: int, people: int) -> list[tuple[dict, str]]:
    key, columns = KEYS[table], COLUMNS[table]
    faults = ["none"] * 4 + ["missing_person", "text_person", "orphan", "missing_date",
                             "bad_date", "future_date"]  # fmt: skip
    if table != "death":
        faults += ["missing_key", "text_key"]
    if table in ("measurement", "condition_occurrence"):
        faults += ["text_concept", "unknown_concept", "mapped_concept"]
    if table == "measurement":
        faults += ["text_value", "inf_value", "no_value", "unknown_unit", "text_unit"]
    if table == "observation_period":
        faults += ["end_before_start"]
    date_column = next(c for c in columns if c.endswith("_date"))
    rows = []
    for index in range(1, n + 1):
        fault = draw(st.sampled_from(faults))
        row = dict.fromkeys(columns, "0")
        start = draw(DATES)
        row |= {
            key: str(index),
            "person_id": str(draw(st.integers(1, people))),
            date_column: start,
            "observation_period_end_date": (
                date.fromisoformat(start) + timedelta(days=30)
            ).isoformat(),
            "measurement_concept_id": "3004249",
            "condition_concept_id": "201826",
            "value_as_number": str(draw(st.floats(-1e6, 1e6, allow_nan=False))),
            "unit_concept_id": "8876",
            "unit_source_value": draw(JUNK),
        }
        row = {c: row[c] for c in columns}
        concept = next((c for c in columns if c.endswith("_concept_id") and "type" not in c
                        and "source" not in c and "unit" not in c), None)  # fmt: skip
        source = next((c for c in columns if c.endswith("source_concept_id")), None)
        changes = {
            "missing_key": {key: ""},
            "text_key": {key: f"{index}a"},
            "missing_person": {"person_id": ""},
            "text_person": {"person_id": "one"},
            "orphan": {"person_id": "999"},
            "missing_date": {date_column: ""},
            "bad_date": {date_column: draw(BAD_DATES)},
            "future_date": {date_column: FUTURE},
            "text_concept": {concept: "LOINC:8480-6"},
            "unknown_concept": {concept: "987654321"},
            "mapped_concept": {concept: "0", source: "45123"},
            "text_value": {"value_as_number": "high"},
            "inf_value": {"value_as_number": "inf"},
            "no_value": {"value_as_number": ""},
            "unknown_unit": {"unit_concept_id": "123"},
            "text_unit": {"unit_concept_id": "mmHg"},
            "end_before_start": {"observation_period_end_date": "1980-01-01"},
        }
        row |= {c: v for c, v in changes.get(fault, {}).items() if c in row}
        rows.append((row, fault))
    return rows


@st.composite
def omop_folders(draw) -> dict[str, list[tuple[dict, str]]]:
    people = draw(st.integers(1, 6))
    tables = {"person": draw(person_rows(people))}
    sizes = {"observation_period": (0, 6), "measurement": (0, 12),
             "condition_occurrence": (0, 6), "death": (0, 3)}  # fmt: skip
    for table, (low, high) in sizes.items():
        tables[table] = draw(event_rows(table, draw(st.integers(low, high)), people))
    for table, rows in tables.items():  # second occurrences of integer keys
        keyed = [row for row, _ in rows if row[KEYS[table]].isdigit()]
        if keyed:
            for copy in draw(st.lists(st.sampled_from(keyed), max_size=2)):
                rows.append((dict(copy), "duplicate"))
    return tables


def write_folder(folder: Path, tables: dict[str, list[tuple[dict, str]]]) -> None:
    for table, rows in tables.items():
        with open(folder / f"{table}.csv", "w", encoding="utf-8", newline="") as handle:
            writer = csv.DictWriter(handle, COLUMNS[table], lineterminator="\n")
            writer.writeheader()
            writer.writerows(row for row, _ in rows)
    with open(folder / "concept.csv", "w", encoding="utf-8", newline="") as handle:
        writer = csv.writer(handle, lineterminator="\n")
        writer.writerow(["concept_id", "concept_name", "domain_id", "vocabulary_id",
                         "concept_class_id", "standard_concept", "concept_code",
                         "valid_start_date", "valid_end_date", "invalid_reason"])  # fmt: skip
        for cid, name, vocabulary, code in CONCEPT:
            writer.writerow([cid, name, "x", vocabulary, "x", "S", code, "1970-01-01",
                             "2099-12-31", ""])  # fmt: skip
    (folder / "concept_relationship.csv").write_text(
        "concept_id_1,concept_id_2,relationship_id,valid_start_date,valid_end_date,"
        "invalid_reason\n45123,201826,Maps to,1970-01-01,2099-12-31,\n"
        "45123,3004249,Maps to,1970-01-01,2099-12-31,\n"
    )


def expected_outcome(tables: dict[str, list[tuple[dict, str]]]) -> tuple[Counter, Counter]:
    """(rejected locations, represented record_refs) the reader must produce."""
    rejected: Counter = Counter()
    represented: Counter = Counter()
    valid_people: set[str] = set()
    for table in ("person", "observation_period", "measurement", "condition_occurrence", "death"):
        seen: set[str] = set()
        for number, (row, fault) in enumerate(tables[table], start=1):
            key = row[KEYS[table]]
            first = key.isdigit() and key not in seen
            seen.add(key)
            ok = fault in VALID_FAULTS and first
            if table != "person":
                ok = ok and row["person_id"] in valid_people
            if ok:
                represented[f"{table}:{key}"] += 1
            else:
                rejected[f"{table}:{key}" if first else f"{table}:row {number}"] += 1
        if table == "person":
            valid_people = {k.split(":")[1] for k in represented}
    return rejected, represented


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tables=omop_folders())
def test_generated_dirty_folders_account_for_every_row(tables):
    with tempfile.TemporaryDirectory() as name:
        folder = Path(name)
        write_folder(folder, tables)
        store = read(folder, max_rejected_share=1.0, today=TODAY, cdm_spec=SPEC)
    expected_rejected, expected_represented = expected_outcome(tables)
    rejected = store.frame("SELECT location, reason FROM rejected")
    assert Counter(rejected.location) == expected_rejected
    assert rejected.reason.notna().all() and (rejected.reason != "").all()
    refs = store.frame(
        "SELECT DISTINCT record_ref FROM (SELECT record_ref FROM persons UNION ALL "
        "SELECT record_ref FROM periods UNION ALL SELECT record_ref FROM events)"
    )
    assert Counter(refs.record_ref) == expected_represented
    read_, accounted = accounting(store)
    assert read_ == accounted == sum(len(rows) for rows in tables.values()) + len(CONCEPT) + 2
    # "Maps to" gives the standard concepts; the ICD-10-CM source code is kept in one more
    # row per accepted record, without a concept id, so a study may name either.
    mapped = [
        f"{table}:{row[KEYS[table]]}"
        for table in ("measurement", "condition_occurrence")
        for row, fault in tables[table]
        if fault == "mapped_concept"
    ]
    mapped = sorted(ref for ref in mapped if ref in expected_represented)
    source_rows = store.frame(
        "SELECT record_ref, system, concept_id FROM events WHERE code = 'E11.9' ORDER BY 1"
    )
    assert source_rows.record_ref.tolist() == mapped
    assert source_rows.concept_id.isna().all()
    assert (source_rows.system == "http://hl7.org/fhir/sid/icd-10-cm").all()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tables=omop_folders(), junk=st.lists(st.tuples(st.integers(0, 10**6), JUNK), max_size=12))
def test_junk_in_any_cell_never_crashes_the_reader(tables, junk):
    cells = [
        (t, i, c) for t, rows in tables.items() for i, _ in enumerate(rows) for c in COLUMNS[t]
    ]
    for position, text in junk:
        table, index, column = cells[position % len(cells)]
        tables[table][index][0][column] = text
    with tempfile.TemporaryDirectory() as name:
        write_folder(Path(name), tables)
        store = read(Path(name), max_rejected_share=1.0, today=TODAY, cdm_spec=SPEC)
    read_, accounted = accounting(store)
    assert read_ == accounted


@pytest.mark.parametrize(
    ("table", "column"),
    [(t.name, c) for t in USED_TABLES for c, required in t.used().items()
     if required and t.name in COLUMNS],
)  # fmt: skip
def test_generated_folder_without_a_required_column_is_refused(table, column, tmp_path):
    tables = {t: [] for t in COLUMNS}
    write_folder(tmp_path, tables)
    columns = [c for c in COLUMNS[table] if c != column]
    (tmp_path / f"{table}.csv").write_text(",".join(columns) + "\n")
    with pytest.raises(HarmonizationError, match=rf"table {table} lacks.*{column}"):
        read(tmp_path, today=TODAY)


# ------------------------------------------------------------------ size
def test_one_million_measurements_read_in_a_few_seconds(tmp_path, capsys):
    path = tmp_path / "big.duckdb"
    connection = duckdb.connect(str(path))
    connection.execute(
        "CREATE TABLE person AS SELECT i AS person_id, 8507 + (i % 2) * 25 AS gender_concept_id, "
        "1930 + i % 60 AS year_of_birth, 0 AS race_concept_id, 0 AS ethnicity_concept_id "
        "FROM range(1, 10001) t(i)"
    )
    connection.execute(
        "CREATE TABLE measurement AS SELECT i AS measurement_id, 1 + i % 10000 AS person_id, "
        "3004249 AS measurement_concept_id, DATE '2000-01-01' + CAST(i % 7000 AS INTEGER) "
        "AS measurement_date, 32817 AS measurement_type_concept_id, 90 + (i % 80)::DOUBLE "
        "AS value_as_number, 8876 AS unit_concept_id, 'mmHg' AS unit_source_value "
        "FROM range(1, 1000001) t(i)"
    )
    connection.close()
    start = time.perf_counter()
    store = read(path, today=TODAY, cdm_spec=SPEC)
    seconds = time.perf_counter() - start
    with capsys.disabled():
        print(f"\n1,000,000 measurement rows (DuckDB file) read in {seconds:.2f} s")
    assert one(store, "SELECT count(*) FROM events") == 1_000_000
    assert accounting(store) == (1_010_000, 1_010_000)
    assert seconds < 30


# ------------------------------------------------------------------ source codes, open periods
def test_icd10cm_source_codes_and_open_periods_reach_the_frame(tmp_path):
    """A study naming only ICD-10-CM finds OMOP diagnoses by their source concept; a period
    still open (ending 2099-12-31) ends at the extract date, noted, not rejected."""
    from harmonize.run import harmonize
    from harmonize.spec import parse_spec

    folder = tmp_path / "cdm"
    folder.mkdir()
    (folder / "person.csv").write_text(
        "person_id,gender_concept_id,year_of_birth,month_of_birth,day_of_birth\n"
        "1,8507,1950,1,1\n2,8532,1960,1,1\n"
    )
    (folder / "observation_period.csv").write_text(
        "observation_period_id,person_id,observation_period_start_date,"
        "observation_period_end_date,period_type_concept_id\n"
        "1,1,2000-01-01,2099-12-31,32817\n2,2,2000-01-01,2023-12-31,32817\n"
    )
    (folder / "visit_occurrence.csv").write_text(
        "visit_occurrence_id,person_id,visit_concept_id,visit_start_date,visit_type_concept_id\n"
        "1,1,9202,2015-01-01,32817\n2,2,9202,2015-01-01,32817\n"
    )
    (folder / "condition_occurrence.csv").write_text(
        "condition_occurrence_id,person_id,condition_concept_id,condition_start_date,"
        "condition_type_concept_id,condition_source_concept_id\n"
        "1,1,201826,2010-01-01,32817,45123\n2,2,201826,2010-01-01,32817,201826\n"
    )
    (folder / "concept.csv").write_text(
        "concept_id,vocabulary_id,concept_code\n201826,SNOMED,44054006\n45123,ICD10CM,E11.9\n"
    )
    raw = tomllib.loads(DEMO.read_text())
    raw["concept_sets"]["diabetes"] = {"icd10cm": ["E11.9"]}
    raw["outcome"] = {"name": "died", "kind": "time_to_event", "event": "death"}
    spec = parse_spec(raw)
    result = harmonize(spec, site="s", omop=folder, latest_date=date(2024, 6, 1))
    frame = result.frame
    assert frame.loc["1", "diabetes"] == 1  # ICD-10-CM source concept E11.9
    assert frame.loc["2", "diabetes"] == 0  # its source concept is the SNOMED one
    assert frame.loc["1", "died_time"] == (date(2024, 6, 1) - date(2015, 1, 1)).days
    assert frame.loc["2", "died_time"] == (date(2023, 12, 31) - date(2015, 1, 1)).days
    assert result.report.rejected == 0 and result.report.balanced
    notes = "\n".join(result.report.notes)
    assert "1 periods end after 2024-06-01" in notes
    assert "condition_occurrence: 1 rows also coded by their source concept" in notes
    assert "notes:" in result.report.to_text()


def test_without_a_concept_table_the_bundled_vocabulary_gives_codes_and_units(tmp_path):
    folder = mini_folder(tmp_path / "cdm")
    (folder / "concept.csv").unlink()
    store = read(folder, today=TODAY, max_rejected_share=0.5, cdm_spec=SPEC)
    events = "SELECT record_ref, system, code, unit FROM events ORDER BY 1"
    assert store.connection.execute(events).fetchall() == [
        ("measurement:10", SYSTEMS["loinc"], "8480-6", "mm[Hg]"),  # unit from concept 8876
        ("measurement:11", SYSTEMS["loinc"], "8480-6", "mmHg"),
        ("measurement:12", None, None, None),  # 9202 is not in the bundled map
    ]
    assert any("bundled map" in note for note in store.notes())
