"""The study specification every site receives: cohort, outcome, covariates, concepts.

A :class:`StudySpec` is read from a TOML file (:func:`load_spec`) and
validated with pydantic: unknown keys, wrong types, impossible dates or
ranges and references to undefined concept sets are refused with
:class:`~harmonize.errors.SpecError`, whose message names the file and the
field path of every problem. The spec's digest (:attr:`StudySpec.digest`)
enters every site's fingerprint, so sites harmonised under different specs
cannot be combined.

Concept sets list codes per terminology (LOINC, SNOMED CT, ICD-10-CM,
RxNorm, by their FHIR system URIs) and OMOP concept ids, so that a FHIR site
and an OMOP site select the same records.
"""

from __future__ import annotations

import hashlib
import json
import keyword
import tomllib
from collections.abc import Iterator, Mapping
from datetime import date, time
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_serializer,
    field_validator,
    model_validator,
)

from harmonize.errors import SpecError

SYSTEMS = {
    "loinc": "http://loinc.org",
    "snomed": "http://snomed.info/sct",
    "icd10cm": "http://hl7.org/fhir/sid/icd-10-cm",
    "rxnorm": "http://www.nlm.nih.gov/research/umls/rxnorm",
}
"""Terminologies a concept set may list, with the FHIR ``system`` URI of each."""

Code = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9.\-_]+$")]
Name = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, str_strip_whitespace=True)


class ConceptSet(_Strict):
    """Codes that select records: per terminology, and OMOP concept ids."""

    loinc: tuple[Code, ...] = ()
    snomed: tuple[Code, ...] = ()
    icd10cm: tuple[Code, ...] = ()
    rxnorm: tuple[Code, ...] = ()
    omop: tuple[Annotated[int, Field(gt=0)], ...] = ()

    @model_validator(mode="after")
    def _not_empty(self) -> ConceptSet:
        if not (self.loinc or self.snomed or self.icd10cm or self.rxnorm or self.omop):
            raise ValueError("a concept set needs at least one code or OMOP concept id")
        return self

    def codings(self) -> frozenset[tuple[str, str]]:
        """``(system URI, code)`` pairs for FHIR readers."""
        return frozenset((SYSTEMS[name], code) for name in SYSTEMS for code in getattr(self, name))


class Study(_Strict):
    name: Name
    version: str = Field(default="1", min_length=1, max_length=32)
    description: str = Field(default="", max_length=2000)


class Cohort(_Strict):
    """Entry: the first qualifying event (the index) within the entry window, by age."""

    index: Literal["first_visit", "first_condition"] = "first_visit"
    index_concepts: Name | None = None
    entry_start: date
    entry_end: date
    min_age: int = Field(default=0, ge=0, le=130)
    max_age: int = Field(default=130, ge=0, le=130)

    @model_validator(mode="after")
    def _consistent(self) -> Cohort:
        if self.entry_end < self.entry_start:
            raise ValueError("entry_end is before entry_start")
        if self.max_age < self.min_age:
            raise ValueError("max_age is below min_age")
        if (self.index == "first_condition") != (self.index_concepts is not None):
            raise ValueError("index_concepts is needed exactly when index = 'first_condition'")
        return self


class Outcome(_Strict):
    """Binary (event within ``window_days`` after index) or time to event (censored)."""

    name: Name
    kind: Literal["binary", "time_to_event"]
    event: Literal["death"] | Name = "death"
    window_days: int | None = Field(default=None, gt=0, le=36500)

    @model_validator(mode="after")
    def _window(self) -> Outcome:
        if self.kind == "binary" and self.window_days is None:
            raise ValueError("a binary outcome needs window_days")
        return self


class Covariate(_Strict):
    """One analysis-frame column, defined from the records before (or at) the index."""

    name: Name
    kind: Literal["age_at_index", "sex", "last_value", "condition_before", "medication_before"]
    concepts: Name | None = None
    unit: str | None = Field(default=None, min_length=1, max_length=32)
    range: tuple[float, float] | None = None
    lookback_days: int | None = Field(default=None, gt=0, le=36500)
    levels: tuple[str, ...] | None = None

    @model_validator(mode="after")
    def _fields_for_kind(self) -> Covariate:
        needs_concepts = self.kind in ("last_value", "condition_before", "medication_before")
        if needs_concepts != (self.concepts is not None):
            raise ValueError(
                f"concepts is {'needed' if needs_concepts else 'not used'} for kind {self.kind!r}"
            )
        if self.kind == "last_value":
            if self.unit is None or self.range is None:
                raise ValueError("a last_value covariate needs its UCUM unit and plausible range")
            if not self.range[0] < self.range[1]:
                raise ValueError("range must be (low, high) with low < high")
        elif self.unit is not None or self.range is not None:
            raise ValueError(f"unit and range apply only to last_value, not {self.kind!r}")
        if self.kind == "sex":
            levels = self.levels or ("female", "male")
            if len(set(levels)) != len(levels) or not set(levels) <= {
                "female",
                "male",
                "other",
                "unknown",
            }:
                raise ValueError(
                    "sex levels are distinct values among female, male, other, unknown"
                )
        elif self.levels is not None:
            raise ValueError("levels apply only to the sex covariate")
        return self


class MissingPolicy(_Strict):
    """``keep``: missing covariates stay NaN; ``drop``: exclude such patients (counted)."""

    policy: Literal["keep", "drop"] = "keep"


class IdentifierSources(_Strict):
    """Where a site finds identifiers the FHIR or OMOP model has no field for (``[identifiers]``).

    ``omop_names``: ``"none"`` (OMOP CDM has no names: the identifier table's
    names are empty) or ``"person_source_value"`` (that column holds the
    name as ``family^given``, see :mod:`harmonize.identifiers_omop`).
    """

    omop_names: Literal["none", "person_source_value"] = "none"


class FrozenTable(Mapping[str, Any]):
    """A TOML table that cannot be changed once read (picklable, unlike ``MappingProxyType``)."""

    __slots__ = ("_items",)

    def __init__(self, items: Mapping[str, Any]) -> None:
        self._items = dict(items)

    def __getitem__(self, key: str) -> Any:
        return self._items[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __hash__(self) -> int:
        return hash(frozenset(self._items.items()))

    def __repr__(self) -> str:
        return f"FrozenTable({self._items!r})"


def _frozen(value: Any, where: str) -> Any:
    """A TOML value made immutable: tables become :class:`FrozenTable`, arrays tuples."""
    if isinstance(value, Mapping):
        return FrozenTable({str(k): _frozen(v, f"{where}.{k}") for k, v in value.items()})
    if isinstance(value, list | tuple):
        return tuple(_frozen(v, f"{where}[{i}]") for i, v in enumerate(value))
    if isinstance(value, str | int | float | bool | date | time):  # datetime is a date
        return value
    raise ValueError(f"{where}: not a TOML value ({type(value).__name__})")


def _thawed(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _thawed(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return [_thawed(v) for v in value]
    return value


class StudySpec(_Strict):
    """A whole study specification, as every site receives it.

    ``linkage`` is the ``[linkage]`` table of a vertical study, kept as
    written (a read-only mapping; the :mod:`linkage` package parses its
    meaning): only its type is checked here, a table. It enters
    :attr:`digest`, so sites harmonised under different linkage schemas have
    different fingerprints. With it, a run also builds the identifier table
    (:mod:`harmonize.identifiers`); ``identifiers`` (``[identifiers]``,
    allowed only beside ``[linkage]``) says where a source keeps the
    identifiers its data model has no field for.
    """

    study: Study
    cohort: Cohort
    outcome: Outcome
    covariates: tuple[Covariate, ...] = Field(min_length=1)
    concept_sets: dict[Name, ConceptSet] = Field(default_factory=dict)
    missing: MissingPolicy = MissingPolicy()
    linkage: Mapping[str, Any] | None = None
    identifiers: IdentifierSources | None = None

    @field_validator("linkage", mode="after")
    @classmethod
    def _freeze_linkage(cls, value: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
        return None if value is None else _frozen(value, "linkage")

    @field_serializer("linkage")
    def _dump_linkage(self, value: Mapping[str, Any] | None) -> dict[str, Any] | None:
        return None if value is None else _thawed(value)

    @model_validator(mode="after")
    def _references(self) -> StudySpec:
        if self.identifiers is not None and self.linkage is None:
            raise ValueError("[identifiers] is used only with a [linkage] table")
        names = [c.name for c in self.covariates] + [self.outcome.name]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"column names used twice: {duplicates}")
        reserved = [n for n in names if keyword.iskeyword(n) or n in ("person_id", "site")]
        if reserved:
            raise ValueError(f"reserved column names: {reserved}")
        wanted = {c.concepts for c in self.covariates if c.concepts}
        if self.cohort.index_concepts:
            wanted.add(self.cohort.index_concepts)
        if self.outcome.event != "death":
            wanted.add(self.outcome.event)
        undefined = sorted(wanted - set(self.concept_sets))
        if undefined:
            raise ValueError(f"concept sets used but not defined under [concept_sets]: {undefined}")
        return self

    @property
    def digest(self) -> str:
        """SHA-256 of the canonical JSON form: equal for equal specs, whatever the TOML layout.

        ``linkage`` and ``identifiers`` enter it when given; a spec without
        them has the digest it had before they existed.
        """
        dumped = self.model_dump(mode="json")
        for optional in ("linkage", "identifiers"):
            if dumped[optional] is None:
                del dumped[optional]
        canonical = json.dumps(dumped, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode("utf-8")).hexdigest()

    def columns(self) -> list[str]:
        """The analysis frame's columns, in order (time-to-event adds ``<name>_time``)."""
        outcome = (
            [f"{self.outcome.name}_time", self.outcome.name]
            if self.outcome.kind == "time_to_event"
            else [self.outcome.name]
        )
        return [c.name for c in self.covariates] + outcome


def load_spec(path: str | Path) -> StudySpec:
    """Read and validate a study specification from a TOML file."""
    path = Path(path)
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise SpecError(f"{path}: study specification not found") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as error:
        raise SpecError(f"{path}: not valid TOML ({error})") from None
    return parse_spec(raw, source=str(path))


def parse_spec(raw: dict, source: str = "<spec>") -> StudySpec:
    """Validate a specification given as a mapping (e.g. parsed TOML)."""
    try:
        return StudySpec.model_validate(raw)
    except ValidationError as error:
        problems = []
        for item in error.errors():
            where = ".".join(str(part) for part in item["loc"]) or "(top level)"
            problems.append(f"{where}: {item['msg']}")
        raise SpecError(
            f"{source}: invalid study specification:\n  " + "\n  ".join(problems), problems=problems
        ) from None
