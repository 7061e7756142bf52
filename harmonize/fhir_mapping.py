"""FHIR R4 resources to record-store rows: validation and the per-resource mapping.

One function per step, each either returning what the next step needs or a
:class:`Rejection` (the record goes to the quarantine) or an
:class:`Exclusion` (a valid record that says the event did not happen):

1. :func:`validate` checks the resource against the FHIR R4 structure
   definitions with ``fhir.resources`` (its R4B models, which accept R4
   JSON; the package's default R5 models reject some R4 resources). The
   first pydantic error gives the rejection's field path and reason.
2. :func:`status_exclusion` excludes records whose status says the event did
   not happen (entered in error, cancelled, not done, refuted).
3. :func:`to_rows` applies the checks the analysis needs (a Patient subject,
   a full calendar date not after *today*, a unit on every quantity, ...)
   and maps the validated resource to rows of ``persons`` or ``events``
   (columns as in :mod:`harmonize.records`):

   =================  ============  ==============================================
   resource           table/domain  date, codes and value
   =================  ============  ==============================================
   Patient            persons       ``birthDate``; sex from ``gender``; death date
                                    from ``deceasedDateTime``
   Encounter          visit         ``period.start``; first coding of ``type``
   Condition          condition     ``onsetDateTime`` (or ``onsetPeriod.start``,
                                    then ``recordedDate``); one row per coding
   Observation        measurement   ``effectiveDateTime`` (or
                                    ``effectivePeriod.start``,
                                    ``effectiveInstant``, ``issued``); one row per
                                    coding of ``code`` with ``valueQuantity``, and
                                    one per coding of each ``component`` with the
                                    component's ``valueQuantity``
   MedicationRequest  medication    ``authoredOn``; codings of
                                    ``medicationCodeableConcept``
   Procedure          procedure     ``performedDateTime`` (or
                                    ``performedPeriod.start``)
   =================  ============  ==============================================

Dates are the calendar date as written: the date part of a dateTime, in the
time zone it was written in (``2020-01-02T23:30:00-05:00`` is 2020-01-02).
A represented record always gives at least one row: a record without any
coded concept gives one row with ``system`` and ``code`` NULL, which the
frame builder will not match to any concept set.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from datetime import date, datetime
from typing import Any

from fhir.resources.R4B import get_fhir_model_class
from fhir_core.fhirabstractmodel import FHIRAbstractModel
from pydantic import ValidationError

from harmonize.records import SEXES

DOMAINS_BY_TYPE = {
    "Encounter": "visit",
    "Condition": "condition",
    "Observation": "measurement",
    "MedicationRequest": "medication",
    "Procedure": "procedure",
}
"""The ``events`` domain of each event resource type."""

USED_TYPES = frozenset({"Patient", *DOMAINS_BY_TYPE})
"""Resource types the reader maps; every other type is excluded at read."""

NOT_HAPPENED = {
    "Encounter": frozenset({"entered-in-error", "cancelled"}),
    "Condition": frozenset({"entered-in-error", "refuted"}),
    "Observation": frozenset({"entered-in-error", "cancelled"}),
    "MedicationRequest": frozenset({"entered-in-error", "cancelled"}),
    "Procedure": frozenset({"entered-in-error", "not-done"}),
}
"""Statuses (``verificationStatus`` for a Condition) that say the event did not happen."""

MODELS: dict[str, type[FHIRAbstractModel]] = {
    name: get_fhir_model_class(name) for name in sorted(USED_TYPES)
}

EVENT_COLUMNS = [
    "person_id",
    "domain",
    "system",
    "code",
    "concept_id",
    "event_date",
    "value",
    "unit",
    "record_type",
    "record_ref",
]
PERSON_COLUMNS = ["person_id", "birth_date", "sex", "death_date", "record_type", "record_ref"]

_MAX_TEXT = 200
_PATIENT_REF = re.compile(r"(?:^|/)Patient/([A-Za-z0-9\-.]{1,64})(?:/_history/[A-Za-z0-9\-.]+)?$")
_UUID_REF = re.compile(r"^urn:uuid:([A-Za-z0-9\-.]{1,64})$")
_CHOICE = re.compile(r"\['([a-z]+)[A-Z]")
_FULL_DATE = re.compile(r"^(\d{4})-(\d{2})-(\d{2})")


@dataclass(frozen=True, slots=True)
class Rejection:
    """Why a record goes to the quarantine: the FHIR field path (or None) and a short reason."""

    field: str | None
    reason: str


@dataclass(frozen=True, slots=True)
class Exclusion:
    """A valid record that is not used, with the reason counted in ``excluded_at_read``."""

    reason: str


@dataclass(frozen=True, slots=True)
class Rows:
    """The rows one record gives, for ``table`` (``persons`` or ``events``)."""

    table: str
    rows: list[tuple[Any, ...]]


def clip(text: str, limit: int = _MAX_TEXT) -> str:
    """``text`` on one line, cut to ``limit`` characters (messages come from outside)."""
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


# ---------------------------------------------------------------- validation
def validate(resource_type: str, resource: dict[str, Any]) -> FHIRAbstractModel | Rejection:
    """Validate ``resource`` with the ``fhir.resources`` R4B model of ``resource_type``.

    Returns the model, or a :class:`Rejection` naming the first failing field
    as a dotted path (``component[0].valueQuantity.value``) and pydantic's
    message as the reason.
    """
    try:
        return MODELS[resource_type].model_validate(resource)
    except ValidationError as error:
        first = error.errors()[0]
        message = str(first["msg"]).removeprefix("Value error, ")
        return Rejection(_error_field(first["loc"], message), clip(f"not valid FHIR: {message}"))
    except RecursionError:
        return Rejection(None, "not valid FHIR: nested too deeply")
    except (AttributeError, TypeError) as error:
        # fhir.resources' own validators can fail on input of an unexpected JSON type
        # (e.g. a number where a primitive's extension object belongs) instead of raising
        # a ValidationError; such a record is rejected like any other invalid one.
        return Rejection(None, clip(f"not valid FHIR: {type(error).__name__} in a validator"))


def _error_field(loc: tuple[int | str, ...], message: str) -> str | None:
    parts: list[str] = []
    for part in loc:
        if isinstance(part, int):
            if parts:
                parts[-1] = f"{parts[-1]}[{part}]"
        elif part == "resource_type":
            parts.append("resourceType")
        elif part != "root":
            parts.append(part)
    if parts:
        return ".".join(parts)
    choice = _CHOICE.search(message)  # "one of many" errors name the choice's variants
    return f"{choice.group(1)}[x]" if choice else None


# ---------------------------------------------------------------- exclusion
def status_exclusion(resource_type: str, model: Any) -> Exclusion | None:
    """An :class:`Exclusion` when the record's status says the event did not happen."""
    statuses = NOT_HAPPENED.get(resource_type)
    if statuses is None:
        return None
    if resource_type == "Condition":
        concept = model.verificationStatus
        codes = [c.code for c in (concept.coding or [])] if concept is not None else []
    else:
        codes = [model.status]
    for code in codes:
        if code in statuses:
            return Exclusion(f"status {code}")
    return None


# ---------------------------------------------------------------- mapping
def to_rows(resource_type: str, model: Any, record_ref: str, today: date) -> Rows | Rejection:
    """Rows of one validated resource, or why it is rejected (see the module docstring)."""
    if resource_type == "Patient":
        return _patient(model, record_ref, today)
    person = _person_id(model)
    if isinstance(person, Rejection):
        return person
    mapper = _EVENT_MAPPERS[resource_type]
    return mapper(model, person, record_ref, today)


def _patient(model: Any, record_ref: str, today: date) -> Rows | Rejection:
    if not model.id:
        return Rejection("id", "Patient without an id")
    if model.birthDate is None:
        return Rejection("birthDate", "Patient without birthDate")
    birth = _date_of("birthDate", model.birthDate, today)
    if isinstance(birth, Rejection):
        return birth
    sex = model.gender
    if sex is not None and sex not in SEXES:
        return Rejection("gender", clip(f"gender {sex!r} is not one of {', '.join(SEXES)}"))
    death = None
    if model.deceasedDateTime is not None:
        death = _date_of("deceasedDateTime", model.deceasedDateTime, today)
        if isinstance(death, Rejection):
            return death
        if death < birth:
            return Rejection("deceasedDateTime", f"death date {death} before birth date {birth}")
    elif model.deceasedBoolean:
        return Rejection("deceasedBoolean", "deceased without a date")
    return Rows("persons", [(model.id, birth, sex, death, "Patient", record_ref)])


def _person_id(model: Any) -> str | Rejection:
    reference = model.subject.reference if model.subject is not None else None
    if not reference:
        return Rejection("subject.reference", "missing subject reference")
    match = _UUID_REF.match(reference) or _PATIENT_REF.search(reference)
    if match is None:
        return Rejection("subject.reference", clip(f"subject is not a Patient: {reference!r}"))
    return match.group(1)


def _event_date(candidates: list[tuple[str, Any]], missing: str, today: date) -> date | Rejection:
    """The first present candidate ``(field, value)`` as a calendar date."""
    for field, value in candidates:
        if value is not None:
            return _date_of(field, value, today)
    return Rejection(missing, "missing date")


def _date_of(field: str, value: Any, today: date) -> date | Rejection:
    """A validated FHIR date/dateTime/instant as the calendar date written, not after today."""
    if isinstance(value, datetime):
        day = value.date()
    elif isinstance(value, date):
        day = value
    else:  # fhir.resources keeps partial dates (and leap seconds) as the string written
        match = _FULL_DATE.match(str(value))
        if match is None:
            return Rejection(field, clip(f"partial date {value!r}: no day"))
        try:
            day = date(*(int(part) for part in match.groups()))
        except ValueError:
            return Rejection(field, clip(f"unparseable date {value!r}"))
    if day > today:
        return Rejection(field, f"date {day} is in the future (after {today})")
    return day


def _codings(concept: Any) -> list[tuple[str | None, str]]:
    if concept is None:
        return []
    return [(c.system, c.code) for c in (concept.coding or []) if c.code]


def _period_start(period: Any) -> Any:
    return period.start if period is not None else None


def _event_rows(
    person: str,
    domain: str,
    codings: list[tuple[str | None, str]],
    day: date,
    record_type: str,
    record_ref: str,
) -> Rows:
    rows = [
        (person, domain, system, code, None, day, None, None, record_type, record_ref)
        for system, code in codings
    ] or [(person, domain, None, None, None, day, None, None, record_type, record_ref)]
    return Rows("events", rows)


def _encounter(model: Any, person: str, ref: str, today: date) -> Rows | Rejection:
    day = _event_date([("period.start", _period_start(model.period))], "period.start", today)
    if isinstance(day, Rejection):
        return day
    first = next((c for concept in model.type or [] for c in _codings(concept)), None)
    return _event_rows(person, "visit", [first] if first else [], day, "Encounter", ref)


def _condition(model: Any, person: str, ref: str, today: date) -> Rows | Rejection:
    candidates = [
        ("onsetDateTime", model.onsetDateTime),
        ("onsetPeriod.start", _period_start(model.onsetPeriod)),
        ("recordedDate", model.recordedDate),
    ]
    day = _event_date(candidates, "onset[x]", today)
    if isinstance(day, Rejection):
        return day
    return _event_rows(person, "condition", _codings(model.code), day, "Condition", ref)


def _medication(model: Any, person: str, ref: str, today: date) -> Rows | Rejection:
    day = _event_date([("authoredOn", model.authoredOn)], "authoredOn", today)
    if isinstance(day, Rejection):
        return day
    codings = _codings(model.medicationCodeableConcept)
    if not codings:
        field = "medicationReference" if model.medicationReference is not None else "medication[x]"
        return Rejection(field, "medication without a code")
    return _event_rows(person, "medication", codings, day, "MedicationRequest", ref)


def _procedure(model: Any, person: str, ref: str, today: date) -> Rows | Rejection:
    candidates = [
        ("performedDateTime", model.performedDateTime),
        ("performedPeriod.start", _period_start(model.performedPeriod)),
    ]
    day = _event_date(candidates, "performed[x]", today)
    if isinstance(day, Rejection):
        return day
    return _event_rows(person, "procedure", _codings(model.code), day, "Procedure", ref)


def _quantity(quantity: Any, field: str) -> tuple[float | None, str | None] | Rejection:
    """``(value, unit)`` of a Quantity; a value with a comparator (``<5``) gives value NULL."""
    if quantity is None:
        return None, None
    unit = quantity.code or quantity.unit
    if not unit:
        return Rejection(f"{field}.code", "quantity without a unit")
    value = quantity.value
    if value is None or quantity.comparator is not None:
        return None, unit
    number = float(value)
    if not math.isfinite(number):
        return Rejection(f"{field}.value", "value is not a finite number")
    return number, unit


def _observation(model: Any, person: str, ref: str, today: date) -> Rows | Rejection:
    candidates = [
        ("effectiveDateTime", model.effectiveDateTime),
        ("effectivePeriod.start", _period_start(model.effectivePeriod)),
        ("effectiveInstant", model.effectiveInstant),
        ("issued", model.issued),
    ]
    day = _event_date(candidates, "effective[x]", today)
    if isinstance(day, Rejection):
        return day
    main = _quantity(model.valueQuantity, "valueQuantity")
    if isinstance(main, Rejection):
        return main
    measured = [(model.code, main)]
    for i, part in enumerate(model.component or []):
        value_unit = _quantity(part.valueQuantity, f"component[{i}].valueQuantity")
        if isinstance(value_unit, Rejection):
            return value_unit
        measured.append((part.code, value_unit))
    rows = [
        (person, "measurement", system, code, None, day, value, unit, "Observation", ref)
        for concept, (value, unit) in measured
        for system, code in _codings(concept)
    ]
    if not rows:
        value, unit = main
        rows = [(person, "measurement", None, None, None, day, value, unit, "Observation", ref)]
    return Rows("events", rows)


_EVENT_MAPPERS = {
    "Encounter": _encounter,
    "Condition": _condition,
    "Observation": _observation,
    "MedicationRequest": _medication,
    "Procedure": _procedure,
}
