"""The OMOP CDM tables the reader uses, and the role of each column it reads.

``required`` is the reader's built-in copy of the CDM specification's
``isRequired`` (used when the specification CSVs are not found);
``must_have_value`` marks columns without which a row is rejected.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Column:
    """A column the reader uses; ``required`` is the built-in copy of the spec's isRequired."""

    name: str
    kind: str  # id, int, date, double, text
    required: bool = False
    must_have_value: bool = False


@dataclass(frozen=True)
class Table:
    """A CDM table the reader uses and the role of its columns."""

    name: str
    key: str  # the primary key; person_id for death (one row per person)
    columns: tuple[Column, ...]
    domain: str | None = None  # events domain; None for person and observation_period
    concept: str | None = None
    source_concept: str | None = None
    event_date: str | None = None
    value: str | None = None
    unit_concept: str | None = None
    unit_source: str | None = None

    def used(self) -> dict[str, bool]:
        """Columns used, each with its built-in isRequired."""
        return {c.name: c.required for c in self.columns}


def event_table(
    name: str, domain: str, prefix: str, event_date: str, measured: bool = False
) -> Table:
    """An event table whose columns follow the CDM pattern ``<prefix>_concept_id``, ..."""
    key = f"{name}_id"
    columns = [
        Column(key, "id", True, True),
        Column("person_id", "id", True, True),
        Column(f"{prefix}_concept_id", "int", True),
        Column(f"{prefix}_source_concept_id", "int"),
        Column(event_date, "date", True, True),
    ]
    if measured:
        columns += [
            Column("value_as_number", "double"),
            Column("unit_concept_id", "int"),
            Column("unit_source_value", "text"),
        ]
    extra = ("value_as_number", "unit_concept_id", "unit_source_value") if measured else ()
    return Table(
        name, key, tuple(columns), domain, f"{prefix}_concept_id", f"{prefix}_source_concept_id",
        event_date, *extra,
    )  # fmt: skip


PERSON = Table(
    "person",
    "person_id",
    (
        Column("person_id", "id", True, True),
        Column("gender_concept_id", "int", True),
        Column("year_of_birth", "int", True, True),
        Column("month_of_birth", "int"),
        Column("day_of_birth", "int"),
        Column("birth_datetime", "date"),
        Column("gender_source_value", "text"),
    ),
)
OBSERVATION_PERIOD = Table(
    "observation_period",
    "observation_period_id",
    tuple(
        Column(name, kind, True, True)
        for name, kind in (
            ("observation_period_id", "id"),
            ("person_id", "id"),
            ("observation_period_start_date", "date"),
            ("observation_period_end_date", "date"),
        )
    ),
)
DEATH = Table(
    "death",
    "person_id",
    (Column("person_id", "id", True, True), Column("death_date", "date", True, True)),
    domain="death",
    event_date="death_date",
)
EVENT_TABLES = (
    event_table("visit_occurrence", "visit", "visit", "visit_start_date"),
    event_table("condition_occurrence", "condition", "condition", "condition_start_date"),
    event_table("measurement", "measurement", "measurement", "measurement_date", measured=True),
    event_table("observation", "observation", "observation", "observation_date", measured=True),
    event_table("drug_exposure", "medication", "drug", "drug_exposure_start_date"),
    event_table("procedure_occurrence", "procedure", "procedure", "procedure_date"),
    DEATH,
)
USED_TABLES = (PERSON, OBSERVATION_PERIOD, *EVENT_TABLES)
"""Every table the reader uses, with its columns (the CDM check reads ``used()``)."""

LOOKUPS = {
    "concept": {"concept_id": True, "vocabulary_id": True, "concept_code": True},
    "concept_relationship": {
        "concept_id_1": True,
        "concept_id_2": True,
        "relationship_id": True,
        "invalid_reason": False,
    },
}
