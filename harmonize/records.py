"""The common record store every reader fills: one schema for FHIR and OMOP sources.

Readers translate their input into three kinds of rows and say what became
of every input record; :mod:`harmonize.frame` builds the analysis frame from
these rows only, so a FHIR site and an OMOP site holding the same patients
produce the same frame.

Tables (DuckDB, in memory or in a file for large inputs):

``persons``
    ``person_id`` (text), ``birth_date`` (date or NULL: unknown), ``sex``
    (``female``, ``male``, ``other``, ``unknown`` or NULL), ``death_date``
    (date or NULL), ``deceased`` (true when the source says the person died,
    with or without a date; NULL: the source does not say), ``record_type``,
    ``record_ref``.
``periods``
    Observation periods: ``person_id``, ``start_date``, ``end_date``,
    ``record_type``, ``record_ref``. A source without them (FHIR) adds none;
    follow-up then ends at the person's last record.
``events``
    ``person_id``, ``domain`` (one of :data:`DOMAINS`), ``system`` (FHIR
    system URI, or NULL), ``code`` (text or NULL), ``concept_id`` (OMOP
    concept id or NULL), ``event_date`` (date), ``value`` (double or NULL),
    ``unit`` (UCUM text or NULL), ``record_type``, ``record_ref``. One input
    record may give several rows (a blood-pressure panel gives two).
    ``unvalidated``: true for the rows of a FHIR record read without
    validation (an Observation or Encounter the frame may not use, see
    :mod:`harmonize.fhir`), until it is validated; NULL otherwise.
``read_counts``
    ``source``, ``record_type``, ``n``: every input record read, by type.
``excluded_at_read``
    ``source``, ``record_type``, ``reason``, ``n``: records not used at all
    (e.g. ``resource type not used by the spec``, or
    :data:`OUTSIDE_CONCEPTS` for a record whose codes are in no concept set
    and that could not be mapped).
``rejected``
    The quarantine: ``source``, ``location`` (line or entry), ``record_type``,
    ``record_id``, ``field``, ``reason``, ``detail``; one row per rejected
    record. ``reason`` names the kind of problem (the report counts records
    by it); ``detail`` holds what differs from record to record (the value,
    the reference, the file and line of a Medication).
``unprocessed``
    ``source``, ``reason``, ``n``: records of an input that a stopped run
    did not read (e.g. the files after the one that exceeded
    ``max_rejected_share``). They are not in ``read_counts``; the report
    adds them to the records read so that its totals still balance.
``notes``
    ``source``, ``note``: what a reader found and did that changes no count
    but that a data engineer should know (the CDM version and how it was
    found, imputed birth days, concepts mapped through "Maps to", periods
    cut at the extract date, worker processes used); shown in the report.

Every record read is then exactly one of: rejected, excluded at read, or
represented by rows (``record_ref``) that the frame builder classifies as
included or excluded. ``record_ref`` is unique per input record, e.g.
``Observation.000.ndjson:line 17`` or ``measurement:10293``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import duckdb
import pandas as pd
import pyarrow as pa

OUTSIDE_CONCEPTS = "outside the concept sets of the study"
"""Why a record whose codes match no concept set of the study is not used."""

DOMAINS = ("visit", "condition", "measurement", "medication", "procedure", "observation", "death")
SEXES = ("female", "male", "other", "unknown")

_SCHEMA = {
    "persons": [
        ("person_id", "VARCHAR"),
        ("birth_date", "DATE"),
        ("sex", "VARCHAR"),
        ("death_date", "DATE"),
        ("deceased", "BOOLEAN"),
        ("record_type", "VARCHAR"),
        ("record_ref", "VARCHAR"),
    ],
    "periods": [
        ("person_id", "VARCHAR"),
        ("start_date", "DATE"),
        ("end_date", "DATE"),
        ("record_type", "VARCHAR"),
        ("record_ref", "VARCHAR"),
    ],
    "events": [
        ("person_id", "VARCHAR"),
        ("domain", "VARCHAR"),
        ("system", "VARCHAR"),
        ("code", "VARCHAR"),
        ("concept_id", "BIGINT"),
        ("event_date", "DATE"),
        ("value", "DOUBLE"),
        ("unit", "VARCHAR"),
        ("record_type", "VARCHAR"),
        ("record_ref", "VARCHAR"),
        ("unvalidated", "BOOLEAN"),
    ],
    "read_counts": [("source", "VARCHAR"), ("record_type", "VARCHAR"), ("n", "BIGINT")],
    "excluded_at_read": [
        ("source", "VARCHAR"),
        ("record_type", "VARCHAR"),
        ("reason", "VARCHAR"),
        ("n", "BIGINT"),
    ],
    "rejected": [
        ("source", "VARCHAR"),
        ("location", "VARCHAR"),
        ("record_type", "VARCHAR"),
        ("record_id", "VARCHAR"),
        ("field", "VARCHAR"),
        ("reason", "VARCHAR"),
        ("detail", "VARCHAR"),
    ],
    "unprocessed": [("source", "VARCHAR"), ("reason", "VARCHAR"), ("n", "BIGINT")],
    "notes": [("source", "VARCHAR"), ("note", "VARCHAR")],
}


class RecordStore:
    """The rows a reader produced, in DuckDB (``path=None``: in memory)."""

    def __init__(self, path: str | Path | None = None, *, memory_limit: str | None = None) -> None:
        self.connection = duckdb.connect(str(path) if path is not None else ":memory:")
        if memory_limit is not None:
            self.connection.execute("SET memory_limit = ?", [memory_limit])
            self.connection.execute("SET preserve_insertion_order = false")
        for table, columns in _SCHEMA.items():
            body = ", ".join(f"{name} {kind}" for name, kind in columns)
            self.connection.execute(f"CREATE TABLE IF NOT EXISTS {table} ({body})")
            for name, kind in columns:  # a store file written before the column existed
                self.connection.execute(
                    f"ALTER TABLE {table} ADD COLUMN IF NOT EXISTS {name} {kind}"
                )

    def close(self) -> None:
        self.connection.close()

    def __enter__(self) -> RecordStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ writing
    def append(
        self, table: str, rows: pd.DataFrame | pa.Table | Iterable[Mapping[str, Any]]
    ) -> None:
        """Append rows (a DataFrame, an Arrow table or dicts) to a table, columns by name.

        A column the rows lack is NULL.
        """
        if table not in _SCHEMA:
            raise ValueError(f"unknown table {table!r}")
        frame: pd.DataFrame | pa.Table
        if isinstance(rows, pa.Table):
            frame = rows
        else:
            frame = rows if isinstance(rows, pd.DataFrame) else pd.DataFrame(list(rows))
            frame = frame.reindex(columns=[name for name, _ in _SCHEMA[table]])
        if not len(frame):
            return
        names = [name for name, _ in _SCHEMA[table]]
        given = set(frame.column_names if isinstance(frame, pa.Table) else frame.columns)
        self.connection.register("_incoming", frame)
        try:
            casts = ", ".join(
                f"CAST({'_incoming.' + n if n in given else 'NULL'} AS {k})"
                for n, k in _SCHEMA[table]
            )
            self.connection.execute(
                f"INSERT INTO {table} ({', '.join(names)}) SELECT {casts} FROM _incoming"
            )
        finally:
            self.connection.unregister("_incoming")

    def count_read(self, source: str, record_type: str, n: int = 1) -> None:
        self.append("read_counts", [{"source": source, "record_type": record_type, "n": n}])

    def exclude_at_read(self, source: str, record_type: str, reason: str, n: int = 1) -> None:
        self.append(
            "excluded_at_read",
            [{"source": source, "record_type": record_type, "reason": reason, "n": n}],
        )

    def count_unprocessed(self, source: str, reason: str, n: int) -> None:
        """Record ``n`` records of ``source`` that the run did not read (see ``unprocessed``)."""
        self.append("unprocessed", [{"source": source, "reason": reason, "n": n}])

    def note(self, source: str, note: str) -> None:
        """Record a note for the report (see the ``notes`` table)."""
        self.append("notes", [{"source": source, "note": note}])

    def notes(self) -> list[str]:
        """The notes, in the order they were written."""
        return [note for (note,) in self.connection.execute("SELECT note FROM notes").fetchall()]

    def reject(
        self,
        *,
        source: str,
        location: str,
        record_type: str,
        record_id: str | None,
        field: str | None,
        reason: str,
        detail: str | None = None,
    ) -> None:
        self.append(
            "rejected",
            [
                {
                    "source": source,
                    "location": location,
                    "record_type": record_type,
                    "record_id": record_id,
                    "field": field,
                    "reason": reason,
                    "detail": detail,
                }
            ],
        )

    # ------------------------------------------------------------------ reading
    def frame(self, sql: str, parameters: list | None = None) -> pd.DataFrame:
        return self.connection.execute(sql, parameters or []).df()

    def table(self, name: str) -> pd.DataFrame:
        if name not in _SCHEMA:
            raise ValueError(f"unknown table {name!r}")
        return self.frame(f"SELECT * FROM {name}")

    def represented(self) -> int:
        """Input records represented by rows of ``persons`` or ``events`` (distinct refs)."""
        return int(
            self.connection.execute(
                "SELECT count(*) FROM (SELECT record_ref FROM persons "
                "UNION SELECT record_ref FROM events)"
            ).fetchall()[0][0]
        )

    def unvalidated(self) -> int:
        """Input records represented by rows not validated yet (``events.unvalidated``)."""
        return int(
            self.connection.execute(
                "SELECT count(DISTINCT record_ref) FROM events WHERE unvalidated"
            ).fetchall()[0][0]
        )

    def totals(self) -> dict[str, int]:
        """Records read, excluded at read, rejected and not read, for the balance check."""
        one = self.connection.execute
        return {
            "unprocessed": int(one("SELECT coalesce(sum(n), 0) FROM unprocessed").fetchall()[0][0]),
            "read": int(one("SELECT coalesce(sum(n), 0) FROM read_counts").fetchall()[0][0]),
            "excluded_at_read": int(
                one("SELECT coalesce(sum(n), 0) FROM excluded_at_read").fetchall()[0][0]
            ),
            "rejected": int(one("SELECT count(*) FROM rejected").fetchall()[0][0]),
        }
