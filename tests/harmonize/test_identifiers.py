"""The identifier normalisers: named examples, and properties over any text (hypothesis).

The oracle for names is written here independently of the module: ASCII
transliteration by NFKD and dropping what is not ASCII, lower case, then
only ``a-z`` and single spaces. It agrees with ``normalize_name`` on every
text without ``ß``-like case foldings (``casefold`` maps ``ß`` to ``ss``,
the oracle drops it), which the strategy leaves out.
"""

from __future__ import annotations

import re
import unicodedata
from datetime import date, datetime

import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harmonize.identifiers import (
    IDENTIFIER_COLUMNS,
    identifier_table,
    missing_counts,
    normalize_birth_date,
    normalize_name,
    normalize_postal_code,
    normalize_sex,
    omop_birth_date,
    omop_sex,
)

NAME = re.compile(r"(?:[a-z]+(?: [a-z]+)*)?")
POSTAL = re.compile(r"[A-Z0-9]*")


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("José", "jose"),
        ("JOSÉ", "jose"),
        ("Jose\u0301", "jose"),  # decomposed accent
        ("Müller-Lüdenscheidt", "mullerludenscheidt"),
        ("O'Brien", "obrien"),
        ("O\u2019Brien", "obrien"),  # typographic apostrophe
        ("d’Arcy", "darcy"),
        ("Anne\u2010Marie", "annemarie"),  # Unicode hyphen
        ("  Mary   Ann ", "mary ann"),
        ("Mary\tAnn\u00a0Lee", "mary ann lee"),  # tab, no-break space
        ("Straße", "strasse"),
        ("Ñúñez", "nunez"),
        ("Dvořák", "dvorak"),
        ("Ľubomír", "lubomir"),
        ("Abdul218", "abdul"),  # Synthea appends digits to names
        ("St. John", "st john"),
        ("ＪＯＨＮ", "john"),  # full-width letters: NFKD compatibility
        ("Søren", "soren"),  # no decomposition: written as in ASCII
        ("Łukasz Ægir", "lukasz aegir"),
        ("Þóra", "thora"),
        ("Σωκράτης", ""),  # another script: dropped
        ("", ""),
        ("   ", ""),
        ("-'", ""),
        (None, ""),
        (42, ""),
    ],
)
def test_name_examples(raw, expected):
    assert normalize_name(raw) == expected


_ASCII_SPELLING = {"ø": "o", "æ": "ae", "œ": "oe", "đ": "d", "ð": "d", "ł": "l", "þ": "th",
                   "ħ": "h", "ı": "i", "ŧ": "t", "ŀ": "l", "ĸ": "q", "ŋ": "n"}  # fmt: skip


def _oracle_name(text: str) -> str:
    lowered = unicodedata.normalize("NFKD", text).lower()
    spelled = "".join(_ASCII_SPELLING.get(c, c) for c in lowered)
    spaced = "".join(" " if c.isspace() else c for c in unicodedata.normalize("NFKD", spelled))
    ascii_text = spaced.encode("ascii", "ignore").decode().lower()
    ascii_text = ascii_text.replace("-", "").replace("'", "")
    ascii_text = re.sub(r"[^a-z ]", "", ascii_text)
    return " ".join(ascii_text.split())


# letters from Latin blocks and general text; no characters whose case folding expands
_FOLDING = {c for c in map(chr, range(0x250)) if len(c.casefold()) > 1 or c.casefold() != c.lower()}
LATIN_TEXT = st.text(
    alphabet=st.characters(
        max_codepoint=0x24F, exclude_categories=("Cs",), exclude_characters=_FOLDING
    ),
    max_size=40,
)


@settings(max_examples=300, deadline=None)
@given(LATIN_TEXT)
def test_names_agree_with_an_ascii_transliteration_oracle(text):
    assert normalize_name(text) == _oracle_name(text)


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=60))
def test_name_is_idempotent_and_in_its_alphabet(text):
    once = normalize_name(text)
    assert NAME.fullmatch(once), once
    assert normalize_name(once) == once


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=st.sampled_from("aAéÉüÜçÇ-' "), max_size=30))
def test_name_ignores_case_accents_hyphens_and_apostrophes(text):
    plain = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode()
    plain = plain.lower().replace("-", "").replace("'", "")
    assert normalize_name(text) == " ".join(plain.split())
    assert normalize_name(text.upper()) == normalize_name(text.lower()) == normalize_name(text)


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("1970-05-01", "1970-05-01"),
        (" 1970-05-01 ", "1970-05-01"),
        (date(1970, 5, 1), "1970-05-01"),
        (datetime(1970, 5, 1, 23, 30), "1970-05-01"),
        ("1970", ""),  # FHIR partial dates
        ("1970-05", ""),
        ("1970-02-30", ""),  # impossible
        ("1970-5-1", ""),
        ("1970-05-01T10:00:00Z", ""),  # birthDate is a date, not a dateTime
        ("", ""),
        (None, ""),
        (19700501, ""),
    ],
)
def test_birth_date_examples(raw, expected):
    assert normalize_birth_date(raw) == expected


@settings(max_examples=200, deadline=None)
@given(st.dates())
def test_birth_date_round_trips_every_full_date(day):
    assert normalize_birth_date(day.isoformat()) == day.isoformat()
    assert normalize_birth_date(day) == day.isoformat()


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=20))
def test_birth_date_is_a_date_or_empty_and_idempotent(text):
    once = normalize_birth_date(text)
    assert once == "" or date.fromisoformat(once).isoformat() == once
    assert normalize_birth_date(once) == once


@settings(max_examples=200, deadline=None)
@given(
    st.integers(1, 9999) | st.none(),
    st.integers(-2, 14) | st.none(),
    st.integers(-2, 33) | st.none(),
)
def test_omop_birth_date_needs_year_month_and_day(year, month, day):
    got = omop_birth_date(year, month, day)
    try:
        expected = date(year, month, day).isoformat()  # type: ignore[arg-type]
    except (TypeError, ValueError):
        expected = ""
    assert got == expected


def test_omop_birth_date_takes_whole_floats_and_refuses_others():
    assert omop_birth_date(1970.0, 5.0, 1.0) == "1970-05-01"
    assert omop_birth_date(1970, 5.5, 1) == ""
    assert omop_birth_date(1970, True, 1) == ""
    assert omop_birth_date("1970", 5, 1) == ""


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("male", "male"),
        (" Female ", "female"),
        ("OTHER", "other"),
        ("unknown", "unknown"),
        ("m", ""),
        ("F", ""),
        ("", ""),
        (None, ""),
        (1, ""),
    ],
)
def test_sex_examples(raw, expected):
    assert normalize_sex(raw) == expected


@pytest.mark.parametrize(
    ("concept", "expected"),
    [
        (8507, "male"),
        (8532, "female"),
        (8521, "unknown"),
        (8551, "unknown"),
        (0, "unknown"),
        (8507.0, "male"),
        (None, ""),
        ("8507", ""),
    ],
)
def test_omop_sex_examples(concept, expected):
    assert omop_sex(concept) == expected


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("sw1a 1aa", "SW1A1AA"),
        ("02138-1234", "021381234"),
        ("D-10115", "D10115"),
        ("  h3z 2y7 ", "H3Z2Y7"),
        ("０２１３８", "02138"),  # full-width digits
        ("Å1", "A1"),
        ("", ""),
        (None, ""),
        (2138, ""),  # a number lost its leading zero: refused, not guessed
    ],
)
def test_postal_code_examples(raw, expected):
    assert normalize_postal_code(raw) == expected


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=30))
def test_postal_code_is_idempotent_and_in_its_alphabet(text):
    once = normalize_postal_code(text)
    assert POSTAL.fullmatch(once), once
    assert normalize_postal_code(once) == once
    assert normalize_postal_code(text.lower()) == normalize_postal_code(text.upper())


def test_identifier_table_has_one_row_per_patient_in_frame_order():
    patients = pd.Index(["b", "a", "c"], name="person_id")
    rows = [
        ("a", {"given_name": "jose", "sex": "male"}),
        ("b", {"family_name": "obrien", "birth_date": "1970-05-01"}),
        ("z", {"given_name": "not in the frame"}),
    ]
    table = identifier_table(rows, patients)
    assert list(table.columns) == list(IDENTIFIER_COLUMNS)
    assert table.index.equals(patients) and table.index.name == "person_id"
    assert table.loc["a"].tolist() == ["jose", "", "", "male", ""]
    assert table.loc["b"].tolist() == ["", "obrien", "1970-05-01", "", ""]
    assert table.loc["c"].tolist() == ["", "", "", "", ""]
    assert missing_counts(table) == {
        "given_name": 2,
        "family_name": 2,
        "birth_date": 2,
        "sex": 2,
        "postal_code": 3,
    }


def test_identifier_table_refuses_a_person_twice_and_values_not_text():
    patients = pd.Index(["a"])
    with pytest.raises(ValueError, match="twice"):
        identifier_table([("a", {}), ("a", {})], patients)
    with pytest.raises(ValueError, match="not all text"):
        identifier_table([("a", {"birth_date": date(1970, 1, 1)})], patients)


def test_identifier_table_of_no_patients_has_the_columns():
    table = identifier_table([], pd.Index([], name="person_id"))
    assert list(table.columns) == list(IDENTIFIER_COLUMNS) and table.empty
