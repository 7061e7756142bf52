"""Read an OMOP CDM 5.3 or 5.4 database into the record store, set-based, with DuckDB SQL.

The source is a folder of CSV files (``PERSON.csv`` or ``person.csv``, also
``.csv.gz``), a folder of Parquet files (``person.parquet``, or a folder
``person/`` of Parquet parts), or a DuckDB database file (attached
read-only). Table names are matched case-insensitively. Each table becomes a
temporary view on the store's DuckDB connection, and every step below is one
SQL statement over whole tables: 5,000,000 measurement rows never pass
through Python.

Mapping (``record_type`` = the CDM table name; ``record_ref`` =
``"<table>:<primary key>"``, e.g. ``measurement:10293``, and
``death:<person_id>`` for death, which has no key):

====================  ===================  ====================================================
CDM table             store                fields
====================  ===================  ====================================================
person                persons              ``person_id`` as text; ``birth_date`` from
                                           ``birth_datetime``, else ``year/month/day_of_birth``
                                           (a missing month or day becomes 1, noted); ``sex``
                                           from ``gender_concept_id`` (8507 male, 8532 female,
                                           8521 other, 8551 unknown), else
                                           ``gender_source_value`` (m/f/o/male/female/other),
                                           else ``unknown`` if either was given, else NULL;
                                           ``death_date`` from death
observation_period    periods              start and end dates
visit_occurrence      events "visit"       ``visit_start_date``
condition_occurrence  events "condition"   ``condition_start_date``
measurement           events "measurement" ``measurement_date``, ``value_as_number``, unit
observation           events "observation" ``observation_date``, ``value_as_number``, unit
drug_exposure         events "medication"  ``drug_exposure_start_date``
procedure_occurrence  events "procedure"   ``procedure_date``
death                 events "death"       ``death_date`` (concept, code, value NULL)
====================  ===================  ====================================================

Concepts: ``concept_id`` is the row's standard concept id; 0 ("no matching
concept") or empty becomes NULL, unless the row's source concept id has valid
``"Maps to"`` relationships in ``concept_relationship``: then the record gives
one events row per target (almost always one). ``system``/``code`` come from
the ``concept`` table: vocabularies LOINC, SNOMED, ICD10CM and RxNorm give the
FHIR system URIs of :data:`harmonize.spec.SYSTEMS` and ``concept_code``; any
other vocabulary, or no concept table, leaves both NULL. ``unit`` is the
``concept_code`` of ``unit_concept_id`` when that concept is in the UCUM
vocabulary, else ``unit_source_value``.

Accounting (see :mod:`harmonize.records`): ``source`` is always the lower-case
CDM table name, so CSV, Parquet and DuckDB copies of one database give
identical stores (paths appear in notes and errors). Every row of every table
is counted in ``read_counts``. Tables the analysis does not use (care_site,
cost, note, ...) are counted with ``COUNT(*)`` and excluded at read ("table
not used by the spec"; ``concept`` and ``concept_relationship``: "vocabulary
table: used only to look up concepts"; a file that is no table of the CDM
version: "not an OMOP CDM <version> table").

A row of a used table is rejected, with one ``rejected`` entry naming the first
failing field, when, in this order: its key is missing or not an integer; the
key occurred in an earlier row; its ``person_id`` is missing, not an integer,
not in person (orphan) or the person was rejected; a column it uses is missing
(required), not of its type (e.g. text in a number) or a date after ``today``
or not finite; a person's birth date is impossible or in the future; an
observation period ends before it starts (an end after ``today`` marks an
open period, which ends at ``today``: noted, not rejected); a CSV line is malformed
(``location`` ``table:line <n>``). ``location`` is ``table:<key>``, or
``table:row <n>`` (the n-th data row) when the key is missing, invalid or a
repeat.

Notes (CDM version and how it was found, extra columns, imputed birth days,
concepts mapped through "Maps to", absent tables, the bundled vocabulary
used, periods cut at ``today``) go to the store's ``notes`` table (source
``omop``), shown in the report, and to the ``harmonize.omop`` logger.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import date
from importlib import resources
from pathlib import Path

import duckdb
import pandas as pd

from harmonize import cdm
from harmonize.cdm import ident, literal
from harmonize.errors import HarmonizationError
from harmonize.omop_tables import (
    DEATH,
    EVENT_TABLES,
    LOOKUPS,
    OBSERVATION_PERIOD,
    PERSON,
    USED_TABLES,
    Column,
    Table,
)
from harmonize.records import RecordStore
from harmonize.spec import SYSTEMS

logger = logging.getLogger(__name__)

NOT_USED = "table not used by the spec"
VOCABULARY = "vocabulary table: used only to look up concepts"
VOCABULARY_SYSTEMS = {
    "LOINC": SYSTEMS["loinc"],
    "SNOMED": SYSTEMS["snomed"],
    "ICD10CM": SYSTEMS["icd10cm"],
    "RXNORM": SYSTEMS["rxnorm"],
}
"""OMOP ``vocabulary_id`` (upper case) → FHIR system URI; other vocabularies give no code."""

OPEN_END = "observation_period_end_date"
"""The one date allowed after ``today``: an open period ends at ``today``."""
_SQL_TYPE = {"id": "BIGINT", "int": "BIGINT", "date": "DATE", "double": "DOUBLE", "text": "VARCHAR"}
_INTEGERS = {"TINYINT", "SMALLINT", "INTEGER", "BIGINT", "HUGEINT", "UTINYINT", "USMALLINT"}
_INTEGERS |= {"UINTEGER", "UBIGINT", "UHUGEINT"}
_NUMBERS = _INTEGERS | {"FLOAT", "DOUBLE", "REAL", "DECIMAL"}


# ---------------------------------------------------------------------------- SQL helpers
def _clean(column: str, dtype: str) -> str:
    """A column as found, with text trimmed and empty text as NULL."""
    return f"NULLIF(TRIM({column}), '')" if dtype == "VARCHAR" else column


def _convert(clean: str, dtype: str, kind: str) -> str:
    """A cleaned column (:func:`_clean`) of DuckDB type ``dtype`` as ``kind``; NULL if invalid."""
    base = dtype.split("(")[0]
    text = clean if dtype == "VARCHAR" else f"CAST({clean} AS VARCHAR)"
    if kind == "text":
        return text
    if kind in ("id", "int"):
        if base in _INTEGERS:
            return f"TRY_CAST({clean} AS BIGINT)"
        if base in _NUMBERS:
            return f"CASE WHEN {clean} = trunc({clean}) THEN TRY_CAST({clean} AS BIGINT) END"
        number = f"TRY_CAST({text} AS BIGINT)"  # alone, it would accept 1.5, 0x10 and 1_000
        return (
            f"CASE WHEN CAST({number} AS VARCHAR) = {text} THEN {number} "
            f"WHEN regexp_full_match({text}, '[+-]?[0-9]+(\\.0*)?') THEN {number} END"
        )
    if kind == "double":
        return f"CAST({clean} AS DOUBLE)" if base in _NUMBERS else f"TRY_CAST({text} AS DOUBLE)"
    if base == "DATE":
        return clean
    if base.startswith("TIMESTAMP") and "TIME ZONE" not in dtype:
        return f"CAST({clean} AS DATE)"
    return f"TRY_CAST({text} AS DATE)"


def _system_of(alias: str) -> str:
    """SQL: the FHIR system URI of concept ``alias``'s vocabulary, or NULL."""
    whens = " ".join(f"WHEN {literal(v)} THEN {literal(u)}" for v, u in VOCABULARY_SYSTEMS.items())
    return f"CASE upper({alias}.vocabulary_id) {whens} END"


@functools.cache
def bundled_vocabulary() -> pd.DataFrame:
    """The concepts the demo study uses (``harmonize/data/vocabulary.csv``), for sites
    without a CONCEPT table: ``concept_id``, ``vocabulary_id``, ``concept_code``.

    Ids are those of the OHDSI standardized vocabularies (as in the Synthea27Nj
    CONCEPT table); the file is data, extended without touching code.
    """
    with resources.files("harmonize").joinpath("data/vocabulary.csv").open("rb") as handle:
        table = pd.read_csv(handle, dtype={"concept_id": "int64", "concept_code": str})
    return table[["concept_id", "vocabulary_id", "concept_code"]]


def _scalar(connection: duckdb.DuckDBPyConnection, sql: str) -> int:
    return int(connection.execute(sql).fetchall()[0][0])


# ---------------------------------------------------------------------------- the reader
@dataclass
class _Reader:
    source: cdm.CdmSource
    store: RecordStore
    spec: cdm.CdmSpec | None
    version: str
    today: date
    max_rejected_share: float
    notes: list[str] = field(default_factory=list)
    staged: dict[str, str] = field(default_factory=dict)  # table → its temporary stage

    @property
    def connection(self) -> duckdb.DuckDBPyConnection:
        return self.store.connection

    def temp(self, name: str) -> str:
        return ident(f"_omop_{self.source.tag}_{name}")

    def run(self) -> None:
        tables, where = self.source.tables, str(self.source.path)
        for name, used in ({t.name: t.used() for t in USED_TABLES} | LOOKUPS).items():
            if name in tables and not tables[name].empty:
                cdm.check_columns(self.spec, name, tables[name].names(), used, where)
        for table in tables.values():
            extra = cdm.unknown_columns(self.spec, table.name, table.names())
            if extra:
                self.notes.append(f"{table.label}: columns not in CDM {self.version}: {extra}")
        person = self._stage(PERSON)
        if person is None:
            raise HarmonizationError(f"{where}: the person table is an empty file")
        self.connection.execute(
            f"CREATE TEMP TABLE {self.temp('persons')} AS SELECT person_id, "
            f"bool_or(_reason IS NULL) AS valid FROM {person} "
            "WHERE person_id IS NOT NULL GROUP BY person_id"
        )
        for definition in (OBSERVATION_PERIOD, *EVENT_TABLES):
            if definition.name not in tables:
                self.notes.append(f"no {definition.name} table: nothing read from it")
            elif self._stage(definition) is None:
                self.notes.append(f"{tables[definition.name].label}: empty file")
        self._build_lookups()
        self._insert_persons_and_periods()
        for definition in EVENT_TABLES:
            if definition.name in self.staged:
                self._insert_events(definition)
        self._count_unused()
        for name in [*self.staged.values(), *map(self.temp, ("persons", "maps_to", "concepts"))]:
            self.connection.execute(f"DROP TABLE IF EXISTS {name}")

    # ------------------------------------------------------------------ classification
    def _stage(self, table: Table) -> str | None:
        """Classify every row of a used table in one statement; write rejections and counts."""
        source = self.source.tables[table.name]
        if source.empty:
            self.store.count_read(table.name, table.name, 0)
            return None
        # found: the values as found (x__text, empty text as NULL); raw: also converted (x)
        found, raw = ["row_number() OVER () AS _row"], ["_row"]
        for column in table.columns:
            text, hit = ident(column.name + "__text"), source.column(column.name)
            if hit is None:
                found.append(f"NULL::VARCHAR AS {text}")
                raw.append(f"{text}, NULL::{_SQL_TYPE[column.kind]} AS {ident(column.name)}")
            else:
                found.append(f"{_clean(ident(hit[0]), hit[1])} AS {text}")
                converted = _convert(text, hit[1], column.kind)
                raw.append(f"{text}, {converted} AS {ident(column.name)}")
        checks = self._checks(table)
        fields = " ".join(f"WHEN {c} THEN {literal(f)}" for c, f, _ in checks)
        reasons = " ".join(f"WHEN {c} THEN {literal(r)}" for c, _, r in checks)
        persons = (
            "raw.*, TRUE AS _person_known, TRUE AS _person_valid FROM raw"
            if table is PERSON
            else f"raw.*, p.person_id IS NOT NULL AS _person_known, p.valid AS _person_valid "
            f"FROM raw LEFT JOIN {self.temp('persons')} AS p ON raw.person_id = p.person_id"
        )
        key, at, stage = ident(table.key), literal(table.name + ":"), self.temp(table.name)
        keep = [
            "_row",
            f"CAST({ident(table.key + '__text')} AS VARCHAR) AS _record_id",
            f"{key} AS _key",
            *(ident(c.name) for c in table.columns),
            *self._derived(table),
        ]
        self.connection.execute(
            f"CREATE TEMP TABLE {stage} AS "
            f"WITH found AS (SELECT {', '.join(found)} FROM {ident(source.view)}), "
            f"raw AS (SELECT {', '.join(raw)} FROM found), checked AS (SELECT {persons}) "
            f"SELECT {', '.join(keep)}, CASE {fields} END AS _field, "
            f"CASE {reasons} END AS _reason, "
            f"{at} || coalesce(CAST({key} AS VARCHAR), 'row ' || _row) AS _location FROM checked"
        )
        self.staged[table.name] = stage
        # Repeated keys come right after the key checks (which cannot apply to a row with a
        # valid key), so they overwrite the reason. Rare: found by aggregation, not a window
        # over all rows (which would sort the whole table).
        repeat = "a second death record" if table is DEATH else f"duplicated {table.key}"
        self.connection.execute(
            f"UPDATE {stage} SET _field = {literal(table.key)}, _reason = {literal(repeat)}, "
            f"_location = {at} || 'row ' || _row WHERE _row IN (SELECT _row FROM ("
            f"SELECT _row, row_number() OVER (PARTITION BY _key ORDER BY _row) AS n FROM {stage} "
            f"WHERE _key IN (SELECT _key FROM {stage} WHERE _key IS NOT NULL GROUP BY _key "
            "HAVING count(*) > 1)) WHERE n > 1)"
        )
        self.connection.execute(
            "INSERT INTO rejected (source, location, record_type, record_id, field, reason) "
            f"SELECT {literal(table.name)}, _location, {literal(table.name)}, _record_id, "
            f"_field, _reason FROM {stage} WHERE _reason IS NOT NULL ORDER BY _row"
        )
        malformed = self._malformed(source, reject=True)
        read, rejected = self.connection.execute(
            f"SELECT count(*), count(_reason) FROM {stage}"
        ).fetchall()[0]
        self.store.count_read(table.name, table.name, read + malformed)
        self._check_share(table.name, read + malformed, rejected, malformed, stage)
        return stage

    def _checks(self, table: Table) -> list[tuple[str, str, str]]:
        """``(SQL condition, field, reason)`` in the order they are tried; the first one wins."""
        today = self.today.isoformat()
        checks: list[tuple[str, str, str]] = []

        def valid(column: Column) -> None:
            name = column.name
            text, value = ident(name + "__text"), ident(name)
            if column.must_have_value:
                checks.append((f"{text} IS NULL", name, f"missing {name}"))
            bad = f"{text} IS NOT NULL AND {value} IS NULL"
            if column.kind in ("id", "int"):
                checks.append((bad, name, f"{name} is not an integer"))
            elif column.kind == "double":
                checks.append((f"{bad} OR NOT isfinite({value})", name, f"{name} is not a number"))
            elif column.kind == "date":
                checks.append((f"{bad} OR NOT isfinite({value})", name, f"unparseable {name}"))
                if name != OPEN_END:
                    future = f"{name} in the future (after {today})"
                    checks.append((f"{value} > DATE '{today}'", name, future))

        by_name = {c.name: c for c in table.columns}
        valid(by_name[table.key])
        if table is not PERSON:
            valid(by_name["person_id"])
            checks.append(("NOT _person_known", "person_id", "person_id not in person"))
            checks.append(("NOT _person_valid", "person_id", "the person was rejected"))
        for column in table.columns:
            if column.name not in (table.key, "person_id"):
                valid(column)
        if table is PERSON:
            month = "birth_datetime IS NULL AND month_of_birth NOT BETWEEN 1 AND 12"
            checks.append((month, "month_of_birth", "month_of_birth not between 1 and 12"))
            impossible = "impossible birth date from year/month/day_of_birth"
            checks.append((f"{self._birth()} IS NULL", "day_of_birth", impossible))
            future = f"birth date in the future (after {today})"
            checks.append((f"{self._birth()} > DATE '{today}'", "year_of_birth", future))
        if table is OBSERVATION_PERIOD:
            end, start = "observation_period_end_date", "observation_period_start_date"
            checks.append((f"{end} < {start}", end, f"{end} before {start}"))
        return checks

    @staticmethod
    def _birth() -> str:
        return (
            "coalesce(birth_datetime, try(make_date(year_of_birth, "
            "coalesce(month_of_birth, 1), coalesce(day_of_birth, 1))))"
        )

    def _derived(self, table: Table) -> list[str]:
        if table is PERSON:
            sex = (
                "CASE WHEN gender_concept_id = 8507 THEN 'male' "
                "WHEN gender_concept_id = 8532 THEN 'female' "
                "WHEN gender_concept_id = 8521 THEN 'other' "
                "WHEN gender_concept_id = 8551 THEN 'unknown' "
                "WHEN lower(gender_source_value) IN ('m', 'male') THEN 'male' "
                "WHEN lower(gender_source_value) IN ('f', 'female') THEN 'female' "
                "WHEN lower(gender_source_value) IN ('o', 'other') THEN 'other' "
                "WHEN gender_source_value IS NOT NULL OR coalesce(gender_concept_id, 0) <> 0 "
                "THEN 'unknown' END"
            )
            imputed = "birth_datetime IS NULL AND (month_of_birth IS NULL OR day_of_birth IS NULL)"
            return [f"{self._birth()} AS _birth_date", f"{sex} AS _sex", f"{imputed} AS _imputed"]
        if table.concept and table.source_concept:
            concept, source = ident(table.concept), ident(table.source_concept)
            return [
                f"NULLIF({concept}, 0) AS _concept",
                f"CASE WHEN coalesce({concept}, 0) = 0 AND {source} <> 0 THEN {source} END "
                "AS _map_from",
            ]
        return []

    def _malformed(self, source: cdm.SourceTable, reject: bool) -> int:
        """Malformed lines of a CSV table (DuckDB's store_rejects), rejected if ``reject``."""
        if source.rejects is None or not _scalar(
            self.connection,
            f"SELECT count(*) FROM duckdb_tables() WHERE table_name = {literal(source.rejects)}",
        ):
            return 0
        rejects, name = ident(source.rejects), literal(source.name)
        if reject:
            self.connection.execute(
                "INSERT INTO rejected (source, location, record_type, record_id, field, reason) "
                f"SELECT {name}, {literal(source.name + ':line ')} || line, {name}, NULL, NULL, "
                f"'malformed CSV line (' || lower(min(error_type)) || ')' FROM {rejects} "
                "GROUP BY line ORDER BY line"
            )
        return _scalar(self.connection, f"SELECT count(DISTINCT line) FROM {rejects}")

    def _check_share(
        self, table: str, read: int, rejected: int, malformed: int, stage: str
    ) -> None:
        share = (rejected + malformed) / read if read else 0.0
        if share <= self.max_rejected_share:
            return
        reasons = self.connection.execute(
            f"SELECT _reason, count(*) AS n FROM {stage} WHERE _reason IS NOT NULL "
            "GROUP BY _reason ORDER BY n DESC, _reason LIMIT 3"
        ).fetchall()
        reasons = sorted([*reasons, ("malformed CSV line", malformed)], key=lambda r: -r[1])
        listed = "; ".join(f"{reason} ({n})" for reason, n in reasons[:3] if n)
        hint = (
            " Sources whose dates are shifted into the future (e.g. MIMIC) need today=."
            if "in the future" in listed
            else ""
        )
        raise HarmonizationError(
            f"{self.source.path}: {rejected + malformed} of {read} rows of table {table} "
            f"rejected ({share:.1%} > max_rejected_share {self.max_rejected_share:.1%}); first "
            f"reasons: {listed}. Fix the export or raise max_rejected_share.{hint}"
        )

    # ------------------------------------------------------------------ concepts
    def _build_lookups(self) -> None:
        """ "Maps to" targets and concepts, restricted to the ids the accepted rows need."""
        maps, concepts = self.temp("maps_to"), self.temp("concepts")
        staged = [(self._definition(n), s) for n, s in self.staged.items()]
        sources = [
            f"SELECT _map_from FROM {s} WHERE _reason IS NULL" for t, s in staged if t.concept
        ]
        relationship = self.source.tables.get("concept_relationship")
        if relationship is not None and not relationship.empty and sources:
            value = self._lookup_column(relationship)
            first, second = value("concept_id_1", "int"), value("concept_id_2", "int")
            self.connection.execute(
                f"CREATE TEMP TABLE {maps} AS SELECT DISTINCT {first} AS source_id, "
                f"{second} AS target_id FROM {ident(relationship.view)} "
                f"WHERE {value('relationship_id', 'text')} = 'Maps to' "
                f"AND {value('invalid_reason', 'text')} IS NULL AND {second} <> 0 "
                f"AND {first} IN ({' UNION '.join(sources)})"
            )
        else:
            self.connection.execute(
                f"CREATE TEMP TABLE {maps} (source_id BIGINT, target_id BIGINT)"
            )
        concept = self.source.tables.get("concept")
        if concept is None or concept.empty:
            bundled = bundled_vocabulary()
            self.connection.register("_bundled_vocabulary", bundled)
            try:
                self.connection.execute(
                    f"CREATE TEMP TABLE {concepts} AS SELECT CAST(concept_id AS BIGINT) AS "
                    "concept_id, vocabulary_id, concept_code FROM _bundled_vocabulary"
                )
            finally:
                self.connection.unregister("_bundled_vocabulary")
            self.notes.append(
                f"no concept table: codes and UCUM units looked up in the bundled map of "
                f"{len(bundled)} concepts (harmonize/data/vocabulary.csv); other concepts "
                "match by concept id only"
            )
            return
        wanted = [f"SELECT target_id FROM {maps}"]
        for table, stage in staged:
            for column in ("_concept", table.source_concept, table.unit_concept):
                if table.concept and column:
                    wanted.append(f"SELECT {ident(column)} FROM {stage} WHERE _reason IS NULL")
        value = self._lookup_column(concept)
        concept_id = value("concept_id", "int")
        self.connection.execute(
            f"CREATE TEMP TABLE {concepts} AS SELECT {concept_id} AS concept_id, "
            f"min({value('vocabulary_id', 'text')}) AS vocabulary_id, "
            f"min({value('concept_code', 'text')}) AS concept_code FROM {ident(concept.view)} "
            f"WHERE {concept_id} IN ({' UNION '.join(wanted)}) GROUP BY ALL"
        )

    @staticmethod
    def _lookup_column(table: cdm.SourceTable) -> Callable[[str, str], str]:
        """``value(column, kind)``: a vocabulary table's column, cleaned and converted."""

        def value(name: str, kind: str) -> str:
            hit = table.column(name)
            return "NULL" if hit is None else _convert(_clean(ident(hit[0]), hit[1]), hit[1], kind)

        return value

    @staticmethod
    def _definition(name: str) -> Table:
        return next(t for t in USED_TABLES if t.name == name)

    # ------------------------------------------------------------------ writing
    def _insert_persons_and_periods(self) -> None:
        person, death = self.staged["person"], self.staged.get("death")
        deaths = (
            f"(SELECT person_id, death_date FROM {death} WHERE _reason IS NULL)"
            if death
            else "(SELECT NULL::BIGINT AS person_id, NULL::DATE AS death_date)"
        )
        self.connection.execute(
            "INSERT INTO persons (person_id, birth_date, sex, death_date, record_type, record_ref) "
            "SELECT CAST(s.person_id AS VARCHAR), s._birth_date, s._sex, d.death_date, 'person', "
            f"'person:' || s.person_id FROM {person} AS s LEFT JOIN {deaths} AS d "
            "ON d.person_id = s.person_id WHERE s._reason IS NULL"
        )
        imputed = _scalar(
            self.connection, f"SELECT count(*) FROM {person} WHERE _reason IS NULL AND _imputed"
        )
        if imputed:
            self.notes.append(f"person: {imputed} birth dates lack a month or day; 1 was used")
        period = self.staged.get("observation_period")
        if period is not None:
            today = f"DATE '{self.today.isoformat()}'"
            self.connection.execute(
                "INSERT INTO periods (person_id, start_date, end_date, record_type, record_ref) "
                "SELECT CAST(person_id AS VARCHAR), observation_period_start_date, "
                f"least({OPEN_END}, {today}), 'observation_period', "
                f"'observation_period:' || _key FROM {period} WHERE _reason IS NULL"
            )
            cut = _scalar(
                self.connection,
                f"SELECT count(*) FROM {period} WHERE _reason IS NULL AND {OPEN_END} > {today}",
            )
            if cut:
                self.notes.append(
                    f"observation_period: {cut} periods end after {self.today} (still open, "
                    f"e.g. 2099-12-31); follow-up ends at {self.today}"
                )

    def _insert_events(self, table: Table) -> None:
        """Events rows of a table's accepted rows: the standard concept, then source codings.

        A row whose source concept is a code of a known terminology (ICD-10-CM
        diagnoses, say) other than its standard concept gives a second row
        with that code and no concept id, so a study may name either.
        """
        stage, name = self.staged[table.name], literal(table.name)
        maps, concepts = self.temp("maps_to"), self.temp("concepts")
        concept = system = code = value = unit = "NULL"
        joins = ""
        if table.concept:
            concept = "coalesce(m.target_id, s._concept)"
            joins = (
                f"LEFT JOIN {maps} AS m ON m.source_id = s._map_from "
                f"LEFT JOIN {concepts} AS c ON c.concept_id = {concept}"
            )
            system = _system_of("c")
            code = f"CASE WHEN {system} IS NOT NULL THEN c.concept_code END"
        if table.value:
            value = f"s.{ident(table.value)}"
        if table.unit_concept and table.unit_source:
            joins += f" LEFT JOIN {concepts} AS u ON u.concept_id = s.{ident(table.unit_concept)}"
            unit = (
                f"CASE WHEN upper(u.vocabulary_id) = 'UCUM' THEN u.concept_code "
                f"ELSE s.{ident(table.unit_source)} END"
            )
        insert = (
            "INSERT INTO events (person_id, domain, system, code, concept_id, event_date, value, "
            "unit, record_type, record_ref) "
            f"SELECT CAST(s.person_id AS VARCHAR), {literal(table.domain or '')}, "
            "{system}, {code}, {concept}, "
            f"s.{ident(table.event_date or '')}, {value}, {unit}, {name}, "
            f"{name} || ':' || s._key FROM {stage} AS s "
        )
        self.connection.execute(
            insert.format(system=system, code=code, concept=concept)
            + f"{joins} WHERE s._reason IS NULL"
        )
        if table.source_concept:
            source = f"s.{ident(table.source_concept)}"
            joins = joins.replace(f"LEFT JOIN {maps} AS m ON m.source_id = s._map_from ", "")
            joins = joins.replace(
                f"LEFT JOIN {concepts} AS c ON c.concept_id = {concept}",
                f"JOIN {concepts} AS c ON c.concept_id = {source}",
            )
            coded = self.connection.execute(
                insert.format(system=_system_of("c"), code="c.concept_code", concept="NULL")
                + f"{joins} WHERE s._reason IS NULL AND {_system_of('c')} IS NOT NULL "
                f"AND {source} <> coalesce(s._concept, 0) AND NOT EXISTS (SELECT 1 FROM {maps} "
                f"AS m WHERE m.source_id = {source} AND m.target_id = {source})"
            ).fetchall()[0][0]
            if coded:
                self.notes.append(
                    f"{table.name}: {coded} rows also coded by their source concept "
                    "(e.g. ICD-10-CM), which a study may name"
                )
        if table.concept:
            mapped, several = self.connection.execute(
                "SELECT count(*), count(*) FILTER (n > 1) FROM (SELECT count(*) AS n "
                f"FROM {stage} AS s JOIN {maps} AS m ON m.source_id = s._map_from "
                "WHERE s._reason IS NULL GROUP BY s._row)"
            ).fetchall()[0]
            if mapped:
                self.notes.append(
                    f"{table.name}: {mapped} rows with concept 0 mapped through 'Maps to' from "
                    f"their source concept ({several} to several concepts: one row each)"
                )

    def _count_unused(self) -> None:
        used = {t.name for t in USED_TABLES}
        for table in self.source.tables.values():
            if table.name in used:
                continue
            n = 0
            if not table.empty:
                n = _scalar(self.connection, f"SELECT count(*) FROM {ident(table.view)}")
                n += self._malformed(table, reject=False)
            if table.name in LOOKUPS:
                reason = VOCABULARY
            elif self.spec is not None and not self.spec.has_table(table.name):
                reason = f"not an OMOP CDM {self.version} table"
            else:
                reason = NOT_USED
            self.store.count_read(table.name, table.name, n)
            if n:
                self.store.exclude_at_read(table.name, table.name, reason, n)


def read_omop(
    source: str | Path,
    store: RecordStore,
    *,
    cdm_version: str | None = None,
    max_rejected_share: float = 0.10,
    today: date | None = None,
    cdm_spec: str | Path | None = None,
) -> None:
    """Read an OMOP CDM database into ``store``: persons, periods, events and accounting.

    Parameters
    ----------
    source
        A folder of CSV or Parquet files (one per table, names in any case), or a
        DuckDB database file (attached read-only).
    store
        The record store to fill (:class:`harmonize.records.RecordStore`). All
        writes happen in one transaction: after an error the store is unchanged.
    cdm_version
        ``"5.3"`` or ``"5.4"``. None: ``cdm_source.cdm_version``, else detected
        from the columns (:func:`harmonize.cdm.detect_version`).
    max_rejected_share
        Largest share of rejected rows a used table may have; above it the read
        fails, since the source is more likely mis-exported than dirty.
    today
        Dates after it are rejected as future dates (default: today). Sources
        whose dates are shifted into the future, like MIMIC, need a later date.
    cdm_spec
        Folder of the OHDSI field-level specification CSVs. None: searched by
        :func:`harmonize.cdm.find_spec_folder`; if none is found, the reader's
        built-in copy of ``isRequired`` for the columns it uses is checked.

    Raises
    ------
    HarmonizationError
        An unreadable source (missing folder, not a DuckDB file, no person
        table, unreadable file), a used table lacking a required column (naming
        table and column), or a table with more than ``max_rejected_share``
        rejected rows (naming table, counts and the most frequent reasons).

    Notes
    -----
    The mapping and the accounting rules are in the module docstring.
    """
    path = Path(source)
    if not 0.0 <= max_rejected_share <= 1.0:
        raise HarmonizationError(f"max_rejected_share must be in [0, 1], not {max_rejected_share}")
    given = cdm.normalize_version(cdm_version) if cdm_version is not None else None
    if cdm_version is not None and given is None:
        raise HarmonizationError(f"cdm_version {cdm_version!r} is not supported; use 5.3 or 5.4")
    folder = cdm.find_spec_folder(path, cdm_spec)
    connection = store.connection
    opened = cdm.open_source(path, connection)
    try:
        declared = cdm.declared_version(opened)
        if given is not None:
            version, how = given, "given"
            if cdm.normalize_version(declared) not in (None, given):
                how += f"; cdm_source.cdm_version says {declared}"
        else:
            columns = {name: table.names() for name, table in opened.tables.items()}
            version, how = cdm.detect_version(columns, folder, declared)
        spec = cdm.load_cdm_spec(folder, version)
        reader = _Reader(opened, store, spec, version, today or date.today(), max_rejected_share)
        origin = spec.origin if spec is not None else "not found: built-in required columns"
        reader.notes += [f"{path}: OMOP CDM {version} ({how}); specification {origin}"]
        reader.notes += opened.notes
        connection.execute("BEGIN TRANSACTION")
        try:
            reader.run()
            for note in reader.notes:
                store.note("omop", note)
        except duckdb.Error as error:
            connection.execute("ROLLBACK")
            raise HarmonizationError(f"{path}: could not read the OMOP source ({error})") from None
        except BaseException:
            connection.execute("ROLLBACK")  # also drops the temporary tables
            raise
        connection.execute("COMMIT")
        for note in reader.notes:
            logger.info(note)
    finally:
        opened.close()
