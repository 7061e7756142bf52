"""The identifier table a site links on: normalised names, birth date, sex and postal code.

A vertical study links the patients of two sites by their identifiers,
encoded (:mod:`linkage`) so that neither site sees the other's. Both sides
must write the same person the same way, whatever the source: this module
holds one normaliser per field and :func:`identifier_table`, which builds
the table from raw values. The table is kept apart from the analysis frame:
it never enters the frame, the report's values, the fingerprint or any
message (only the report's per-field missing counts do).

==============  =============================================================
column          normalised form (missing: ``""``)
==============  =============================================================
``given_name``  :func:`normalize_name` of the first given name
``family_name`` :func:`normalize_name` of the family name
``birth_date``  :func:`normalize_birth_date`: ``YYYY-MM-DD``, a partial date ``""``
``sex``         :func:`normalize_sex`: FHIR AdministrativeGender code
``postal_code`` :func:`normalize_postal_code`: upper case, letters and digits
==============  =============================================================

Unicode is handled with :mod:`unicodedata` (compatibility decomposition,
Unicode Standard Annex #15), so that ``"José"``, ``"JOSÉ"`` and the
decomposed ``"Jose\\u0301"`` are all ``"jose"``.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable, Mapping
from datetime import date, datetime

import pandas as pd

__all__ = [
    "IDENTIFIER_COLUMNS",
    "NO_NAMES",
    "SEX_CODES",
    "identifier_table",
    "missing_counts",
    "normalize_birth_date",
    "normalize_name",
    "normalize_postal_code",
    "normalize_sex",
    "omop_birth_date",
    "omop_sex",
]

IDENTIFIER_COLUMNS = ("given_name", "family_name", "birth_date", "sex", "postal_code")
"""The columns of an identifier table, in order."""

SEX_CODES = ("male", "female", "other", "unknown")
"""FHIR R4 AdministrativeGender codes (http://hl7.org/fhir/R4/valueset-administrative-gender.html)."""

NO_NAMES = (
    "identifiers: OMOP CDM has no name fields; given_name and family_name are empty "
    '(set [identifiers] omop_names = "person_source_value" if that column holds family^given^...)'
)
"""The note a run adds when an OMOP site's identifier table has no names."""

OMOP_GENDERS = {8507: "male", 8532: "female"}
"""OMOP standard gender concepts (OMOP CDM v5.4, ``person.gender_concept_id``)."""

_JOINERS = re.compile(r"[-'\u2010-\u2015\u2018\u2019\u02bc\u2212\ufe63\uff0d\uff07]")
_NOT_NAME = re.compile(r"[^a-z ]")
_NOT_POSTAL = re.compile(r"[^A-Z0-9]")
_FULL_DATE = re.compile(r"(\d{4})-(\d{2})-(\d{2})")


LATIN_LETTERS = str.maketrans(
    {"ø": "o", "æ": "ae", "œ": "oe", "đ": "d", "ð": "d", "ł": "l", "þ": "th", "ħ": "h",
     "ı": "i", "ŧ": "t", "ŀ": "l", "ĸ": "q", "ŋ": "n"}
)  # fmt: skip
"""Lower-case Latin letters with no Unicode decomposition, as they are written in ASCII
(``"Søren"`` is also written ``"Soren"``; ``"Łukasz"`` ``"Lukasz"``), applied after case folding."""


def _without_marks(text: str) -> str:
    """NFKD decomposition with the combining marks (accents, umlauts, cedillas) dropped."""
    decomposed = unicodedata.normalize("NFKD", text)
    return "".join(c for c in decomposed if not unicodedata.combining(c))


def normalize_name(value: object) -> str:
    """A given or family name as linkage compares it.

    Rule, in order: Unicode NFKD, combining marks dropped, case-folded
    (``str.casefold``: ``"ß"`` becomes ``"ss"``); the Latin letters with no
    decomposition written as in ASCII (:data:`LATIN_LETTERS`: ``"ø"`` -> ``"o"``,
    ``"ł"`` -> ``"l"``, ``"æ"`` -> ``"ae"``); hyphens and apostrophes
    (ASCII and their Unicode forms) removed, joining the parts
    (``"O'Brien"`` -> ``"obrien"``, ``"Müller-Lüdenscheidt"`` ->
    ``"mullerludenscheidt"``); every other character outside ``a-z`` and
    white space dropped (digits, dots, letters of other scripts); runs of
    white space collapsed to one space, none at either end. Not a string (None, a number): ``""``.
    """
    if not isinstance(value, str):
        return ""
    text = _without_marks(_without_marks(value).casefold().translate(LATIN_LETTERS))
    text = _JOINERS.sub("", text)
    text = " ".join(text.split())
    return " ".join(_NOT_NAME.sub("", text).split())


def normalize_birth_date(value: object) -> str:
    """A birth date as ``YYYY-MM-DD``; a partial or impossible date is ``""``.

    Accepts a :class:`datetime.date` (a :class:`datetime.datetime` gives its
    calendar date as written) or text holding exactly a full date
    (FHIR ``date``: ``"1970-05-01"``). ``"1970"`` and ``"1970-05"`` (FHIR
    partial dates), ``"1970-02-30"`` and anything else give ``""``: linkage
    compares whole dates only.
    """
    if isinstance(value, datetime):
        return value.date().isoformat()
    if isinstance(value, date):
        return value.isoformat()
    if not isinstance(value, str):
        return ""
    match = _FULL_DATE.fullmatch(value.strip())
    if match is None:
        return ""
    try:
        return date(*(int(part) for part in match.groups())).isoformat()
    except ValueError:
        return ""


def omop_birth_date(year: object, month: object, day: object) -> str:
    """``year/month/day_of_birth`` of an OMOP person as ``YYYY-MM-DD``; ``""`` unless all three
    are integers of a real date (the analysis frame imputes a missing month or day; linkage
    does not)."""
    parts = [_integer(part) for part in (year, month, day)]
    if any(part is None for part in parts):
        return ""
    try:
        return date(*parts).isoformat()  # type: ignore[arg-type]
    except ValueError:
        return ""


def _integer(value: object) -> int | None:
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return None


def normalize_sex(value: object) -> str:
    """A FHIR AdministrativeGender code (:data:`SEX_CODES`), case ignored; else ``""``."""
    if not isinstance(value, str):
        return ""
    code = value.strip().casefold()
    return code if code in SEX_CODES else ""


def omop_sex(gender_concept_id: object) -> str:
    """OMOP ``gender_concept_id`` as a FHIR code: 8507 ``male``, 8532 ``female``, any other
    concept ``unknown`` (OMOP CDM v5.4 Gender domain); missing: ``""``."""
    concept = _integer(gender_concept_id)
    if concept is None:
        return ""
    return OMOP_GENDERS.get(concept, "unknown")


def normalize_postal_code(value: object) -> str:
    """A postal code in upper case, letters ``A-Z`` and digits only (``"sw1a 1aa"`` ->
    ``"SW1A1AA"``, ``"02138-1234"`` -> ``"021381234"``); Unicode NFKD first, so full-width
    digits count. Not a string: ``""``."""
    if not isinstance(value, str):
        return ""
    return _NOT_POSTAL.sub("", _without_marks(value).upper())


def identifier_table(
    rows: Iterable[tuple[str, Mapping[str, object]]],
    patients: pd.Index,
) -> pd.DataFrame:
    """The identifier table of ``patients`` from ``(person id, normalised fields)`` pairs.

    One row per patient of ``patients`` (the analysis frame's index, in its
    order, with its name); a patient without a pair, or a field absent from
    its mapping, gets ``""``. The values must already be normalised (the
    readers apply the normalisers above); they are checked to be text.

    Raises
    ------
    ValueError
        A person id is given twice, or a value is not text.
    """
    found: dict[str, tuple[str, ...]] = {}
    for person, fields in rows:
        if person in found:
            raise ValueError(f"identifiers of person {person!r} given twice")
        values = tuple(fields.get(column, "") for column in IDENTIFIER_COLUMNS)
        if not all(isinstance(value, str) for value in values):
            raise ValueError(f"identifiers of person {person!r} are not all text")
        found[person] = values
    empty = ("",) * len(IDENTIFIER_COLUMNS)
    records = [found.get(str(person), empty) for person in patients]
    columns = {
        column: pd.Series([record[i] for record in records], index=patients.copy(), dtype=object)
        for i, column in enumerate(IDENTIFIER_COLUMNS)
    }
    return pd.DataFrame(columns, index=patients.copy())


def missing_counts(table: pd.DataFrame) -> dict[str, int]:
    """Per column, the patients whose value is missing (``""``): counts only, for the report."""
    return {column: int((table[column] == "").sum()) for column in IDENTIFIER_COLUMNS}
