"""The identifier table of an OMOP site: from ``person`` and ``location``, queried with DuckDB.

Called after the frame is built, and only for a study with a ``[linkage]``
table (the reader, :mod:`harmonize.omop`, reads no identifier). The source
is opened again as the reader opens it (:func:`harmonize.cdm.open_source`:
CSV, Parquet or a DuckDB file) and one SQL statement takes, for the
frame's patients only, from the first ``person`` row of each ``person_id``
(the reader rejects the later ones):

* ``birth_date``: ``year_of_birth``, ``month_of_birth``, ``day_of_birth``
  (:func:`~harmonize.identifiers.omop_birth_date`; a missing part gives
  ``""``, where the analysis frame imputes it);
* ``sex``: ``gender_concept_id`` (:func:`~harmonize.identifiers.omop_sex`);
* ``postal_code``: ``location.zip`` of the person's ``location_id``;
* names: the OMOP CDM has no name field, so ``given_name`` and
  ``family_name`` are ``""`` -- unless the study says
  ``[identifiers] omop_names = "person_source_value"``: that column then
  holds the name as an HL7 v2 XPN value, ``family^given^...`` (components
  after the second ignored).
"""

from __future__ import annotations

from pathlib import Path

import duckdb
import pandas as pd
import pyarrow as pa

from harmonize import cdm
from harmonize.cdm import ident
from harmonize.errors import HarmonizationError
from harmonize.identifiers import (
    identifier_table,
    normalize_name,
    normalize_postal_code,
    omop_birth_date,
    omop_sex,
)
from harmonize.omop import _clean, _convert
from harmonize.records import RecordStore

__all__ = ["omop_identifiers", "xpn_names"]

_PERSON = {
    "person_id": "id",
    "gender_concept_id": "int",
    "year_of_birth": "int",
    "month_of_birth": "int",
    "day_of_birth": "int",
    "location_id": "id",
    "person_source_value": "text",
}
_LOCATION = {"location_id": "id", "zip": "text"}


def xpn_names(value: object) -> tuple[str, str]:
    """``(given, family)`` of an HL7 v2 XPN name ``family^given^...``, normalised.

    The first component is the family name, the second the given name (a
    FHIR ``given[0]``); the third, further given names, and the rest are
    ignored; a value without ``^`` is a family name only.
    """
    if not isinstance(value, str):
        return "", ""
    family, _, rest = value.partition("^")
    return normalize_name(rest.partition("^")[0]), normalize_name(family)


def omop_identifiers(
    source: str | Path,
    store: RecordStore,
    patients: pd.Index,
    *,
    names_from_source_value: bool = False,
) -> pd.DataFrame:
    """The identifier table of ``patients`` (the frame's index, OMOP ``person_id`` as text).

    Raises
    ------
    HarmonizationError
        The source cannot be opened again or queried (naming the source).
    """
    path = Path(source)
    connection = store.connection
    opened = cdm.open_source(path, connection)
    try:
        person = _columns(opened.tables["person"], _PERSON)
        location_table = opened.tables.get("location")
        if location_table is not None and not location_table.empty:
            location = _columns(location_table, _LOCATION)
            zip_of = (
                f"LEFT JOIN (SELECT location_id, min(zip) AS zip FROM ({location}) "
                "WHERE location_id IS NOT NULL GROUP BY location_id) AS l USING (location_id)"
            )
        else:
            zip_of = "LEFT JOIN (SELECT NULL::BIGINT AS location_id, NULL AS zip) AS l "
            zip_of += "USING (location_id)"
        ids = pa.table({"person_id": pa.array([str(p) for p in patients], pa.string())})
        connection.register("_frame_patients", ids)
        try:
            rows = connection.execute(
                "SELECT CAST(p.person_id AS VARCHAR), gender_concept_id, year_of_birth, "
                "month_of_birth, day_of_birth, person_source_value, l.zip FROM ("
                f"SELECT * FROM ({person}) WHERE person_id IS NOT NULL "
                "QUALIFY row_number() OVER (PARTITION BY person_id ORDER BY _row) = 1"
                f") AS p {zip_of} "
                "WHERE CAST(p.person_id AS VARCHAR) IN (SELECT person_id FROM _frame_patients)"
            ).fetchall()
        finally:
            connection.unregister("_frame_patients")
    except duckdb.Error as error:
        raise HarmonizationError(f"{path}: could not read identifiers ({error})") from None
    finally:
        opened.close()
    table = []
    for person_id, gender, year, month, day, source_value, zip_code in rows:
        given, family = xpn_names(source_value) if names_from_source_value else ("", "")
        table.append(
            (
                person_id,
                {
                    "given_name": given,
                    "family_name": family,
                    "birth_date": omop_birth_date(year, month, day),
                    "sex": omop_sex(gender),
                    "postal_code": normalize_postal_code(zip_code),
                },
            )
        )
    return identifier_table(table, patients)


def _columns(table: cdm.SourceTable, wanted: dict[str, str]) -> str:
    """SQL selecting ``wanted`` columns of ``table`` converted as the reader converts them
    (NULL for a column the table lacks), with the row number ``_row``."""
    parts = ["row_number() OVER () AS _row"]
    for name, kind in wanted.items():
        hit = table.column(name)
        if hit is None:
            sql_type = "VARCHAR" if kind == "text" else "BIGINT"
            parts.append(f"NULL::{sql_type} AS {ident(name)}")
        else:
            converted = _convert(_clean(ident(hit[0]), hit[1]), hit[1], kind)
            parts.append(f"{converted} AS {ident(name)}")
    return f"SELECT {', '.join(parts)} FROM {ident(table.view)}"
