"""The structure of an OMOP CDM source: the tables it has, and the specification they must meet.

A source (a folder of CSV or Parquet files, or a DuckDB database file) is
opened by :func:`open_source`, which exposes each table as a temporary DuckDB
view on a given connection (CSV columns read as text, with malformed lines
kept by DuckDB's ``store_rejects``), matching table names case-insensitively.

The OHDSI CommonDataModel project publishes, per CDM version, a field-level
specification (``OMOP_CDMv5.4_Field_Level.csv``: ``cdmTableName``,
``cdmFieldName``, ``isRequired``, ...). :func:`load_cdm_spec` reads it into a
:class:`CdmSpec`; :func:`check_columns` refuses a source table that lacks a
required column the reader uses, naming the table and the column. Names are
compared case-insensitively, and the quotes of the 5.4 field ``"offset"``
(``note_nlp``) are dropped.

Where the specification lives is decided by :func:`find_spec_folder`; the CDM
version of a source by :func:`detect_version` (``cdm_source.cdm_version``,
else the columns that exist in only one version).
"""

from __future__ import annotations

import csv
import functools
import gzip
import os
import re
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import duckdb

from harmonize.errors import HarmonizationError

VERSIONS = ("5.3", "5.4")
"""CDM versions the OMOP reader understands."""

SPEC_FOLDER_NAME = "cdm_spec"
LOOKUP_TABLES = frozenset({"concept", "concept_relationship"})
"""Vocabulary tables a DuckDB source may keep in another schema than its person table."""


@dataclass(frozen=True)
class CdmSpec:
    """One CDM version's tables, each mapping lower-case column name to ``isRequired``."""

    version: str
    tables: Mapping[str, Mapping[str, bool]]
    origin: Path | None = None

    def has_table(self, table: str) -> bool:
        return table.lower() in self.tables

    def columns(self, table: str) -> Mapping[str, bool]:
        return self.tables.get(table.lower(), {})

    def is_required(self, table: str, column: str, default: bool = False) -> bool:
        """``isRequired`` of one field; ``default`` when the specification does not list it."""
        return self.columns(table).get(column.lower(), default)


def normalize_version(text: object) -> str | None:
    """``'5.4'``, ``'v5.3.1'``, ``'CDM v5.4.0'`` → ``'5.4'`` / ``'5.3'``; anything else → None."""
    if text is None:
        return None
    match = re.search(r"(?<!\d)5\.(\d+)", str(text))
    if match is None:
        return None
    version = f"5.{int(match.group(1))}"
    return version if version in VERSIONS else None


def _spec_file(folder: Path, version: str) -> Path:
    return folder / f"OMOP_CDMv{version}_Field_Level.csv"


def find_spec_folder(source: str | Path, explicit: str | Path | None = None) -> Path | None:
    """The folder holding ``OMOP_CDMv5.x_Field_Level.csv``, or None when none is found.

    Search order: ``explicit`` (must exist); ``<source>/../cdm_spec`` (the
    specification beside the data folder or database file);
    ``$FEDSTATS_DATA/omop/cdm_spec``; ``shared/data/omop/cdm_spec`` beside the
    project checkout or the working directory.
    """
    if explicit is not None:
        folder = Path(explicit)
        if not any(_spec_file(folder, v).is_file() for v in VERSIONS):
            raise HarmonizationError(
                f"{folder}: no OMOP_CDMv5.x_Field_Level.csv there; pass the folder holding the "
                "OHDSI CommonDataModel field-level specification as cdm_spec="
            )
        return folder
    candidates = [Path(source).resolve().parent / SPEC_FOLDER_NAME]
    env = os.environ.get("FEDSTATS_DATA")
    if env:
        candidates.append(Path(env) / "omop" / SPEC_FOLDER_NAME)
    here = Path(__file__).resolve()
    candidates += [
        here.parents[2] / "shared" / "data" / "omop" / SPEC_FOLDER_NAME,
        Path.cwd().parent / "shared" / "data" / "omop" / SPEC_FOLDER_NAME,
    ]
    for folder in candidates:
        if any(_spec_file(folder, v).is_file() for v in VERSIONS):
            return folder
    return None


@functools.lru_cache(maxsize=8)
def _read_spec(path: str, mtime: float) -> dict[str, dict[str, bool]]:
    tables: dict[str, dict[str, bool]] = {}
    with open(path, encoding="utf-8", newline="") as handle:
        for row in csv.DictReader(handle):
            table = (row.get("cdmTableName") or "").strip().strip('"').lower()
            field = (row.get("cdmFieldName") or "").strip().strip('"').lower()
            if not table or not field:
                continue
            required = (row.get("isRequired") or "").strip().lower() == "yes"
            tables.setdefault(table, {})[field] = required
    return tables


def load_cdm_spec(folder: Path | None, version: str) -> CdmSpec | None:
    """The field-level specification of ``version`` from ``folder`` (None if not there)."""
    if version not in VERSIONS:
        raise HarmonizationError(
            f"CDM version {version!r} is not supported; use one of {', '.join(VERSIONS)}"
        )
    if folder is None:
        return None
    path = _spec_file(folder, version)
    if not path.is_file():
        return None
    try:
        tables = _read_spec(str(path), path.stat().st_mtime)
    except (OSError, UnicodeDecodeError, csv.Error) as error:
        raise HarmonizationError(f"{path}: unreadable CDM specification ({error})") from None
    if not tables:
        raise HarmonizationError(f"{path}: no cdmTableName/cdmFieldName rows in the specification")
    return CdmSpec(version=version, tables=tables, origin=path)


def detect_version(
    columns: Mapping[str, Iterable[str]],
    folder: Path | None,
    cdm_source_version: object = None,
) -> tuple[str, str]:
    """The CDM version of a source and how it was decided.

    ``cdm_source.cdm_version`` wins when it names 5.3 or 5.4. Otherwise the
    columns of the source's tables are compared with both specifications:
    the version with more columns that exist only in it wins (5.4 renamed,
    e.g., ``visit_occurrence.admitting_source_concept_id`` to
    ``admitted_from_concept_id`` and added ``measurement_event_id``). With no
    evidence either way, 5.4.
    """
    declared = normalize_version(cdm_source_version)
    if declared is not None:
        return declared, f"cdm_source.cdm_version = {cdm_source_version!s}"
    old, new = load_cdm_spec(folder, "5.3"), load_cdm_spec(folder, "5.4")
    if old is not None and new is not None:
        score = {"5.3": 0, "5.4": 0}
        for table, names in columns.items():
            present = {n.lower() for n in names}
            only_old = set(old.columns(table)) - set(new.columns(table))
            only_new = set(new.columns(table)) - set(old.columns(table))
            score["5.3"] += len(present & only_old)
            score["5.4"] += len(present & only_new)
        if score["5.3"] > score["5.4"]:
            return "5.3", f"{score['5.3']} columns found only in CDM 5.3"
        if score["5.4"] > 0:
            return "5.4", f"{score['5.4']} columns found only in CDM 5.4"
    return "5.4", "no cdm_source.cdm_version and no version-specific columns: assumed 5.4"


def check_columns(
    spec: CdmSpec | None,
    table: str,
    present: Iterable[str],
    used: Mapping[str, bool],
    where: str,
) -> None:
    """Refuse a table lacking a required column the reader uses.

    Parameters
    ----------
    spec
        The CDM specification; None means "not found", and then ``used``'s own
        flags (the reader's built-in copy of ``isRequired``) decide.
    table
        CDM table name.
    present
        Column names of the source table (any case).
    used
        Columns the reader uses, each with its built-in ``isRequired``.
    where
        The source path, for the message.

    Raises
    ------
    HarmonizationError
        Naming the table, every missing required column and the CDM version.
    """
    names = {n.lower() for n in present}
    missing = [
        column
        for column, builtin in used.items()
        if column not in names
        and (spec.is_required(table, column, builtin) if spec is not None else builtin)
    ]
    if missing:
        version = f"CDM {spec.version}" if spec is not None else "the OMOP CDM"
        raise HarmonizationError(
            f"{where}: table {table} lacks the column(s) {', '.join(missing)}, required by "
            f"{version} and used by the reader; add the column(s) or fix the export"
        )


def unknown_columns(spec: CdmSpec | None, table: str, present: Iterable[str]) -> list[str]:
    """Columns of a source table that the specification does not list (allowed, but noted)."""
    if spec is None or not spec.has_table(table):
        return []
    known = spec.columns(table)
    return [n for n in present if n.lower() not in known]


# ---------------------------------------------------------------------------- sources
def ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


@dataclass
class SourceTable:
    """One table of the source, exposed as a temporary view on the store's connection."""

    name: str  # lower-case table name
    label: str  # file or database table, for notes
    view: str
    columns: dict[str, tuple[str, str]] | None  # lower name → (source name, DuckDB type)
    rejects: str | None = None  # CSV: DuckDB's table of malformed lines

    @property
    def empty(self) -> bool:
        """An empty file: no columns, no rows."""
        return not self.columns

    def column(self, name: str) -> tuple[str, str] | None:
        return (self.columns or {}).get(name.lower())

    def names(self) -> list[str]:
        return [name for name, _ in (self.columns or {}).values()]


@dataclass
class CdmSource:
    path: Path
    connection: duckdb.DuckDBPyConnection
    tables: dict[str, SourceTable] = field(default_factory=dict)
    alias: str | None = None
    tag: str = field(default_factory=lambda: uuid.uuid4().hex[:8])
    notes: list[str] = field(default_factory=list)

    def view(self, index: int, relation: str) -> str:
        name = f"_omop_{self.tag}_{index}"
        self.connection.execute(f"CREATE TEMP VIEW {ident(name)} AS SELECT * FROM {relation}")
        return name

    def close(self) -> None:
        for table in self.tables.values():
            if not table.empty:
                self.connection.execute(f"DROP VIEW IF EXISTS {ident(table.view)}")
            for name in (table.rejects, f"{table.rejects}_scan") if table.rejects else ():
                self.connection.execute(f"DROP TABLE IF EXISTS {ident(name)}")
        if self.alias is not None:
            self.connection.execute(f"DETACH DATABASE IF EXISTS {ident(self.alias)}")


def open_source(path: Path, connection: duckdb.DuckDBPyConnection) -> CdmSource:
    """Expose every table of a folder or DuckDB file as a view; refuse what cannot be read."""
    source = CdmSource(path, connection)
    try:
        if path.is_dir():
            _open_folder(source)
        elif path.is_file():
            _open_database(source)
        else:
            raise HarmonizationError(f"{path}: no such folder or DuckDB database file")
        for table in source.tables.values():
            if table.columns is None:
                rows = connection.execute(f"DESCRIBE SELECT * FROM {ident(table.view)}").fetchall()
                table.columns = {row[0].lower(): (row[0], row[1]) for row in rows}
        if "person" not in source.tables:
            raise HarmonizationError(
                f"{path}: no person table (person.csv, PERSON.csv, person.parquet or a person "
                "table); is this an OMOP CDM export?"
            )
    except duckdb.Error as error:
        source.close()
        raise HarmonizationError(f"{path}: not readable as an OMOP CDM source ({error})") from None
    except BaseException:
        source.close()
        raise
    return source


def _csv_header(path: Path) -> tuple[list[str], str] | None:
    """Column names and delimiter of a CSV file (None when the file is empty)."""
    opener = gzip.open if path.name.lower().endswith(".gz") else open
    try:
        with opener(path, "rt", encoding="utf-8-sig", newline="") as handle:
            line = handle.readline()
        if not line.strip():
            return None
        found = [next(csv.reader([line], delimiter=d)) for d in (",", "\t", ";", "|")]
    except (OSError, UnicodeDecodeError, csv.Error) as error:
        raise HarmonizationError(f"{path}: unreadable CSV header ({error})") from None
    names, delimiter = max(zip(found, ",\t;|", strict=True), key=lambda pair: len(pair[0]))
    seen: dict[str, int] = {}
    unique = []
    for name in (n.strip() for n in names):
        seen[name.lower()] = seen.get(name.lower(), 0) + 1
        unique.append(name if seen[name.lower()] == 1 else f"{name}_{seen[name.lower()]}")
    return unique, delimiter


def _open_folder(source: CdmSource) -> None:
    found: dict[str, list[Path]] = {}
    for entry in sorted(source.path.iterdir()):
        lower = entry.name.lower()
        suffix = next((s for s in (".csv.gz", ".csv", ".parquet") if lower.endswith(s)), None)
        if entry.is_file() and suffix:
            found.setdefault(lower[: -len(suffix)], []).append(entry)
        elif entry.is_dir() and any(entry.rglob("*.parquet")):
            found.setdefault(lower, []).append(entry)
    for index, (table, entries) in enumerate(sorted(found.items())):
        if len(entries) > 1:
            raise HarmonizationError(
                f"{source.path}: table {table} is given more than once "
                f"({', '.join(e.name for e in entries)}); keep one file per table"
            )
        entry = entries[0]
        if entry.is_dir() or entry.name.lower().endswith(".parquet"):
            pattern = entry / "**" / "*.parquet" if entry.is_dir() else entry
            view = source.view(index, f"read_parquet({literal(str(pattern))})")
            source.tables[table] = SourceTable(table, entry.name, view, None)
            continue
        header = _csv_header(entry)
        if header is None:  # an empty file: a table without columns or rows
            source.tables[table] = SourceTable(table, entry.name, "", {})
            continue
        names, delimiter = header
        columns = ", ".join(f"{literal(n)}: 'VARCHAR'" for n in names)
        rejects = f"_omop_{source.tag}_rejects_{index}"
        view = source.view(
            index,
            f"read_csv({literal(str(entry))}, header = true, auto_detect = false, "
            f"delim = {literal(delimiter)}, quote = '\"', escape = '\"', "
            f"columns = {{{columns}}}, store_rejects = true, rejects_table = {literal(rejects)}, "
            f"rejects_scan = {literal(rejects + '_scan')})",
        )
        columns_found = {n.lower(): (n, "VARCHAR") for n in names}
        source.tables[table] = SourceTable(table, entry.name, view, columns_found, rejects)


def _open_database(source: CdmSource) -> None:
    """Attach read-only; use the schema holding person (vocabulary tables from any schema)."""
    with open(source.path, "rb") as handle:
        magic = handle.read(12)
    if magic[8:12] != b"DUCK":
        raise HarmonizationError(
            f"{source.path}: neither a folder of CSV / Parquet files nor a DuckDB database file"
        )
    alias = source.alias = f"_omop_{source.tag}"
    source.connection.execute(f"ATTACH {literal(str(source.path))} AS {ident(alias)} (READ_ONLY)")
    rows = source.connection.execute(
        "SELECT schema_name, table_name FROM duckdb_tables() WHERE database_name = $1 UNION ALL "
        "SELECT schema_name, view_name FROM duckdb_views() WHERE database_name = $1 "
        "AND NOT internal",
        [alias],
    ).fetchall()
    schemas = sorted({s for s, t in rows if t.lower() == "person"}, key=lambda s: (s != "main", s))
    if not schemas:
        return  # refused by the caller: no person table
    ordered = sorted(rows, key=lambda row: (row[0] != schemas[0], row))
    for index, (schema, table) in enumerate(ordered):
        name = table.lower()
        if name in source.tables or (schema != schemas[0] and name not in LOOKUP_TABLES):
            continue
        if schema != schemas[0]:
            source.notes.append(f"{name} taken from schema {schema}")
        view = source.view(index, f"{ident(alias)}.{ident(schema)}.{ident(table)}")
        source.tables[name] = SourceTable(name, f"{schema}.{table}", view, None)


def declared_version(source: CdmSource) -> object:
    """``cdm_source.cdm_version`` of the first row, or None."""
    table = source.tables.get("cdm_source")
    hit = table.column("cdm_version") if table is not None else None
    if table is None or hit is None:
        return None
    try:
        rows = source.connection.execute(
            f"SELECT CAST({ident(hit[0])} AS VARCHAR) FROM {ident(table.view)} "
            f"WHERE {ident(hit[0])} IS NOT NULL LIMIT 1"
        ).fetchall()
    except duckdb.Error:
        return None
    return rows[0][0] if rows else None
