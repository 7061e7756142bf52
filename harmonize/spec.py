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
from datetime import date
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

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


class StudySpec(_Strict):
    """A whole study specification, as every site receives it."""

    study: Study
    cohort: Cohort
    outcome: Outcome
    covariates: tuple[Covariate, ...] = Field(min_length=1)
    concept_sets: dict[Name, ConceptSet] = Field(default_factory=dict)
    missing: MissingPolicy = MissingPolicy()

    @model_validator(mode="after")
    def _references(self) -> StudySpec:
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
        """SHA-256 of the canonical JSON form: equal for equal specs, whatever the TOML layout."""
        canonical = json.dumps(self.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
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
