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
   Patient            persons       ``birthDate`` (or NULL); sex from ``gender``;
                                    death date from ``deceasedDateTime``;
                                    ``deceased`` also from ``deceasedBoolean``
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
                                    ``medicationCodeableConcept``, or of the
                                    ``code`` and the ingredients'
                                    ``itemCodeableConcept`` of the Medication
                                    that ``medicationReference`` points to
   Procedure          procedure     ``performedDateTime`` (or
                                    ``performedPeriod.start``)
   =================  ============  ==============================================

The ``subject`` of an event names its Patient: ``Patient/<id>`` (relative
or absolute, with or without ``_history``), a Bundle entry's ``urn:uuid:``
or absolute fullUrl (the reader replaces the person id by that entry's
Patient's, see :class:`Rows`), or ``#<id>``, a Patient contained in the
resource, which becomes a person of its own (``<Type>/<id>#<id>``) whose
persons row the record carries. A Patient without ``birthDate`` or with
``deceasedBoolean: true`` and no date is valid FHIR: its row says so
(birth date NULL, ``deceased`` true) and the frame builder excludes it from
the cohort with a named reason.

Every rejection has a reason naming the kind of problem and a detail with
what differs from record to record (the value, the reference).
:func:`scope_of` reads, from the record's JSON alone, the codes by which it
could match the study's concept sets, so that the reader can count a record
outside them as unused instead of rejecting it.

A ``medicationReference`` to a contained Medication (``#med1``) is resolved
here, from the resource itself. Any other reference (``Medication/abc``, an
absolute URL, a Bundle entry's ``urn:uuid:`` fullUrl) points to a Medication
elsewhere in the export, which may come later in the same file or in another
file: :func:`to_rows` then returns a :class:`MedicationReference`, which the
reader resolves with its index of the export's Medication codes
(:mod:`harmonize.fhir_medications`). Medication resources themselves give no
rows: they are validated, and excluded at read with the reason
:data:`MEDICATION_USED`.

A Condition without ``onsetDateTime`` or ``onsetPeriod.start`` (for instance
one with only ``onsetAge`` or ``onsetString``) is dated by its
``recordedDate``; its rows say so (``Rows.dated_by``) so that the report can
count such conditions.

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

MEDICATION = "Medication"
USED_TYPES = frozenset({"Patient", MEDICATION, *DOMAINS_BY_TYPE})
"""Resource types the reader validates and maps; every other type is excluded at read."""

MEDICATION_USED = "Medication: its code is used by the MedicationRequests that reference it"
"""Why a valid Medication resource is excluded at read: it gives no rows of its own."""

DATED_BY_RECORDED_DATE = "recordedDate"
"""``Rows.dated_by`` of a Condition without an onset date, dated by its ``recordedDate``."""

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
PERSON_COLUMNS = [
    "person_id",
    "birth_date",
    "sex",
    "death_date",
    "deceased",
    "record_type",
    "record_ref",
]
SCOPED_TYPES = frozenset({"Condition", "Observation", "MedicationRequest", "Procedure", MEDICATION})
"""Resource types used only when a code of theirs is in a concept set of the study."""

_MAX_TEXT = 200
PATIENT_REFERENCE = re.compile(
    r"(?:^|/)Patient/([A-Za-z0-9\-.]{1,64})(?:/_history/[A-Za-z0-9\-.]+)?$"
)
"""A reference to a Patient by id: ``Patient/<id>``, relative or absolute, with ``_history``."""
_UUID_REF = re.compile(r"^urn:uuid:([A-Za-z0-9\-.]{1,64})$")
_CHOICE = re.compile(r"\['([a-z]+)[A-Z]")
FULL_DATE = re.compile(r"^(\d{4})-(\d{2})-(\d{2})")
"""The calendar date a FHIR date, dateTime or instant starts with, when it has a day."""


@dataclass(frozen=True, slots=True)
class Rejection:
    """Why a record goes to the quarantine.

    ``field`` is the FHIR field path (or None); ``reason`` names the kind of
    problem and is the same for every record with that problem (the report
    groups by it), so it never holds a file name, a reference or a value;
    those go to ``detail``, which the quarantine keeps for each record.
    """

    field: str | None
    reason: str
    detail: str | None = None


@dataclass(frozen=True, slots=True)
class Exclusion:
    """A valid record that is not used, with the reason counted in ``excluded_at_read``."""

    reason: str


@dataclass(frozen=True, slots=True)
class Rows:
    """The rows one record gives, for ``table`` (``persons`` or ``events``).

    ``dated_by`` names the fallback element that dated the record when its
    usual date was absent (:data:`DATED_BY_RECORDED_DATE`), else None.
    ``subject`` is the subject reference as written when only the export's
    Bundle ``fullUrl`` identities can say which Patient it names
    (``urn:uuid:...`` or an absolute URL); the reader then replaces the rows'
    ``person_id`` (first column) with that Patient's (see
    :class:`harmonize.fhir_medications.PatientIndex`). ``persons`` are the
    rows of a Patient contained in the record and named by its subject.
    """

    table: str
    rows: list[tuple[Any, ...]]
    dated_by: str | None = None
    subject: str | None = None
    persons: tuple[tuple[Any, ...], ...] = ()


Coding = tuple[str | None, str]
"""``(system, code)`` of one coding."""


@dataclass(frozen=True, slots=True)
class Person:
    """The Patient an event's ``subject`` names.

    ``id`` is the person id (``Patient/<id>`` gives ``<id>``); ``subject``
    is the reference as written when the export's ``fullUrl`` identities
    decide (``urn:uuid:...``, absolute URLs; ``id`` is then the fallback when
    no Bundle entry has that fullUrl); ``rows`` is the persons row of a
    contained Patient (``#newborn``).
    """

    id: str
    subject: str | None = None
    rows: tuple[tuple[Any, ...], ...] = ()


@dataclass(frozen=True, slots=True)
class MedicationReference:
    """A valid MedicationRequest whose codes are those of a Medication elsewhere in the export.

    The reader resolves ``reference`` (as written) and calls :meth:`rows`
    with the Medication's codings, or rejects the record naming the reference.
    """

    reference: str
    person: Person
    day: date
    record_ref: str

    def rows(self, codings: list[Coding]) -> Rows:
        return _event_rows(
            self.person, "medication", codings, self.day, "MedicationRequest", self.record_ref
        )


def clip(text: str, limit: int = _MAX_TEXT) -> str:
    """``text`` on one line, cut to ``limit`` characters (messages come from outside)."""
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


@dataclass(frozen=True, slots=True)
class Scope:
    """The codes by which a record could match the study's concept sets, read from its JSON.

    ``codings`` are those of ``code`` (and of each ``component``), of
    ``medicationCodeableConcept``, of a contained Medication the request
    names, and of a Medication's ingredients; ``medication`` is a reference
    to a Medication elsewhere in the export, whose codes also count.
    """

    codings: tuple[Coding, ...]
    medication: str | None = None


def scope_of(resource_type: str, resource: dict[str, Any]) -> Scope | None:
    """The :class:`Scope` of a record of a :data:`SCOPED_TYPES` type, from its JSON alone.

    None when the type is always used (Patient, Encounter) or the codes
    cannot be read (the code elements are not what FHIR says): such a record
    is never taken for one outside the concept sets. Read from the JSON, not
    the validated model, so that a record outside the concept sets is known
    as such even when it is not valid FHIR.
    """
    if resource_type not in SCOPED_TYPES:
        return None
    concepts: list[Any] = [resource.get("code"), resource.get("medicationCodeableConcept")]
    components = resource.get("component") or []
    if not isinstance(components, list):
        return None
    concepts += [c.get("code") if isinstance(c, dict) else 0 for c in components]
    medication = None
    if resource_type == MEDICATION:
        concepts += _raw_ingredients(resource)
    reference = resource.get("medicationReference")
    if reference is not None:
        target = reference.get("reference") if isinstance(reference, dict) else None
        if not isinstance(target, str):
            return None
        if target.startswith("#"):
            contained = resource.get("contained") or []
            if not isinstance(contained, list):
                return None
            for item in contained:
                if isinstance(item, dict) and item.get("id") == target[1:]:
                    concepts += [item.get("code"), *_raw_ingredients(item)]
        else:
            medication = target
    codings: list[Coding] = []
    for concept in concepts:
        found = _raw_codings(concept)
        if found is None:
            return None
        codings += found
    return Scope(tuple(codings), medication)


def _raw_ingredients(resource: dict[str, Any]) -> list[Any]:
    ingredients = resource.get("ingredient") or []
    if not isinstance(ingredients, list):
        return [0]  # unreadable
    return [i.get("itemCodeableConcept") if isinstance(i, dict) else 0 for i in ingredients]


def _raw_codings(concept: Any) -> list[Coding] | None:
    """``(system, code)`` of a CodeableConcept's JSON; None when it is not one."""
    if concept is None:
        return []
    if not isinstance(concept, dict):
        return None
    coding = concept.get("coding") or []
    if not isinstance(coding, list):
        return None
    out: list[Coding] = []
    for item in coding:
        if not isinstance(item, dict):
            return None
        system, code = item.get("system"), item.get("code")
        if not isinstance(code, str | None) or not isinstance(system, str | None):
            return None
        if code:
            out.append((system, code))
    return out


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
def to_rows(
    resource_type: str, model: Any, record_ref: str, today: date, full_url: str | None = None
) -> Rows | Rejection | Exclusion | MedicationReference:
    """Rows of one validated resource, or why it is rejected (see the module docstring).

    ``full_url`` is the Bundle entry's ``fullUrl``, which identifies a
    Patient without an id.
    """
    if resource_type == MEDICATION:
        return Exclusion(MEDICATION_USED)
    if resource_type == "Patient":
        return _patient(model, record_ref, today, full_url)
    person = _person_id(model, record_ref, today)
    if isinstance(person, Rejection):
        return person
    mapper = _EVENT_MAPPERS[resource_type]
    return mapper(model, person, record_ref, today)


def _patient(
    model: Any, record_ref: str, today: date, full_url: str | None = None
) -> Rows | Rejection:
    """A Patient's persons row; its person id is its ``id``, else its entry's ``fullUrl``.

    A Patient without ``birthDate``, or ``deceasedBoolean: true`` without a
    date, is valid FHIR: it gives a row (birth date NULL, ``deceased``
    true) that the frame builder excludes from the cohort with a named reason.
    """
    person = model.id or full_url
    if not person:
        return Rejection("id", "Patient without an id or a Bundle entry fullUrl")
    row = _patient_row(model, person, record_ref, today)
    return row if isinstance(row, Rejection) else Rows("persons", [row])


def _patient_row(model: Any, person: str, record_ref: str, today: date) -> tuple | Rejection:
    birth = None
    if model.birthDate is not None:
        birth = _date_of("birthDate", model.birthDate, today)
        if isinstance(birth, Rejection):
            return birth
    sex = model.gender
    if sex is not None and sex not in SEXES:
        return Rejection("gender", f"gender is not one of {', '.join(SEXES)}", clip(repr(sex)))
    death = None
    if model.deceasedDateTime is not None:
        death = _date_of("deceasedDateTime", model.deceasedDateTime, today)
        if isinstance(death, Rejection):
            return death
        if birth is not None and death < birth:
            return Rejection(
                "deceasedDateTime", "death date before birth date", f"died {death}, born {birth}"
            )
    deceased = death is not None or bool(model.deceasedBoolean)
    return (person, birth, sex, death, deceased, "Patient", record_ref)


def _person_id(model: Any, record_ref: str, today: date) -> Person | Rejection:
    """The Patient ``model.subject`` names (FHIR R4, 2.3.0 References and 2.36.0 Bundle).

    ``Patient/<id>`` (relative, absolute, with ``_history``) gives ``<id>``;
    ``urn:uuid:...`` and absolute URLs are resolved by the reader through
    the export's Bundle ``fullUrl`` identities; ``#<id>`` names a Patient
    contained in the resource, which becomes a person of its own.
    """
    reference = model.subject.reference if model.subject is not None else None
    if not reference:
        return Rejection("subject.reference", "missing subject reference")
    if reference.startswith("#"):
        return _contained_person(model, reference, record_ref, today)
    match = _UUID_REF.match(reference)
    if match is not None:
        return Person(match.group(1), subject=reference)
    match = PATIENT_REFERENCE.search(reference)
    if match is None:
        return Rejection("subject.reference", "subject is not a Patient", clip(repr(reference)))
    absolute = "://" in reference
    return Person(match.group(1), subject=reference if absolute else None)


def _contained_person(
    model: Any, reference: str, record_ref: str, today: date
) -> Person | Rejection:
    """The contained Patient ``reference`` (``#local``) names, as a person of its own.

    A contained resource has no identity outside its container (FHIR R4,
    2.40 Contained Resources): its person id is ``<Type>/<id>#local`` of the
    container (or ``<record_ref>#local`` when the container has no id).
    """
    local = reference[1:]
    contained = next(
        (r for r in model.contained or [] if r.get_resource_type() == "Patient" and r.id == local),
        None,
    )
    if contained is None:
        return Rejection(
            "subject.reference", "subject names no contained Patient", clip(repr(reference))
        )
    owner = f"{model.get_resource_type()}/{model.id}" if model.id else record_ref
    person = f"{owner}{reference}"
    row = _patient_row(contained, person, record_ref, today)
    if isinstance(row, Rejection):
        return Rejection(
            f"contained.{row.field}" if row.field else "contained", row.reason, row.detail
        )
    return Person(person, rows=(row,))


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
        match = FULL_DATE.match(str(value))
        if match is None:
            return Rejection(field, "partial date: no day", clip(repr(str(value))))
        try:
            day = date(*(int(part) for part in match.groups()))
        except ValueError:
            return Rejection(field, "unparseable date", clip(repr(str(value))))
    if day > today:
        return Rejection(field, f"date in the future (after {today})", str(day))
    return day


def codings_of(concept: Any) -> list[Coding]:
    """The ``(system, code)`` of each coding of a CodeableConcept model that has a code."""
    if concept is None:
        return []
    return [(c.system, c.code) for c in (concept.coding or []) if c.code]


def _period_start(period: Any) -> Any:
    return period.start if period is not None else None


def _event_rows(
    person: Person,
    domain: str,
    codings: list[Coding],
    day: date,
    record_type: str,
    record_ref: str,
) -> Rows:
    pid = person.id
    rows = [
        (pid, domain, system, code, None, day, None, None, record_type, record_ref)
        for system, code in codings
    ] or [(pid, domain, None, None, None, day, None, None, record_type, record_ref)]
    return _for(person, rows)


def _for(person: Person, rows: list[tuple[Any, ...]]) -> Rows:
    return Rows("events", rows, subject=person.subject, persons=person.rows)


def _encounter(model: Any, person: Person, ref: str, today: date) -> Rows | Rejection:
    day = _event_date([("period.start", _period_start(model.period))], "period.start", today)
    if isinstance(day, Rejection):
        return day
    first = next((c for concept in model.type or [] for c in codings_of(concept)), None)
    return _event_rows(person, "visit", [first] if first else [], day, "Encounter", ref)


def _condition(model: Any, person: Person, ref: str, today: date) -> Rows | Rejection:
    onset = [
        ("onsetDateTime", model.onsetDateTime),
        ("onsetPeriod.start", _period_start(model.onsetPeriod)),
    ]
    has_onset = any(value is not None for _, value in onset)
    day = _event_date([*onset, ("recordedDate", model.recordedDate)], "onset[x]", today)
    if isinstance(day, Rejection):
        return day
    rows = _event_rows(person, "condition", codings_of(model.code), day, "Condition", ref)
    if has_onset:
        return rows
    return Rows(rows.table, rows.rows, DATED_BY_RECORDED_DATE, rows.subject, rows.persons)


def _medication(
    model: Any, person: Person, ref: str, today: date
) -> Rows | Rejection | MedicationReference:
    day = _event_date([("authoredOn", model.authoredOn)], "authoredOn", today)
    if isinstance(day, Rejection):
        return day
    codings = codings_of(model.medicationCodeableConcept)
    if codings:
        return _event_rows(person, "medication", codings, day, "MedicationRequest", ref)
    if model.medicationReference is None:
        return Rejection("medication[x]", "medication without a code")
    reference = model.medicationReference.reference
    if not reference:
        return Rejection(
            "medicationReference.reference",
            "medication without a code: medicationReference has no reference to a Medication",
        )
    if not reference.startswith("#"):
        return MedicationReference(reference, person, day, ref)
    shown = clip(reference, 100)
    contained = _contained_medication(model, reference[1:])
    if contained is None:
        return Rejection(
            "medicationReference.reference",
            "medicationReference names no contained Medication",
            f"medicationReference {shown!r} names no contained Medication",
        )
    codings = medication_codings(contained)
    if not codings:
        return Rejection(
            "medicationReference.reference",
            "the contained Medication it names has no code",
            f"the contained Medication {shown!r} has no code nor coded ingredient",
        )
    return _event_rows(person, "medication", codings, day, "MedicationRequest", ref)


def medication_codings(model: Any) -> list[Coding]:
    """The codings of a Medication model: its ``code``, then each ingredient's.

    An R4 Medication may be coded only through its ingredients
    (``Medication.ingredient[].itemCodeableConcept``, FHIR R4 section
    12.19; R5 renamed it ``ingredient[].item.concept``, which R4 does not
    have): every coding of either kind can match a concept set.
    """
    codings = codings_of(model.code)
    for ingredient in model.ingredient or []:
        for coding in codings_of(ingredient.itemCodeableConcept):
            if coding not in codings:
                codings.append(coding)
    return codings


def _contained_medication(model: Any, local_id: str) -> Any | None:
    """The Medication in ``model.contained`` with id ``local_id`` (FHIR R4, 2.39 References)."""
    for resource in model.contained or []:
        if resource.get_resource_type() == MEDICATION and resource.id == local_id:
            return resource
    return None


def _procedure(model: Any, person: Person, ref: str, today: date) -> Rows | Rejection:
    candidates = [
        ("performedDateTime", model.performedDateTime),
        ("performedPeriod.start", _period_start(model.performedPeriod)),
    ]
    day = _event_date(candidates, "performed[x]", today)
    if isinstance(day, Rejection):
        return day
    return _event_rows(person, "procedure", codings_of(model.code), day, "Procedure", ref)


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
        return Rejection(f"{field}.value", "value is not a finite number", str(value))
    return number, unit


def _observation(model: Any, person: Person, ref: str, today: date) -> Rows | Rejection:
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
    pid = person.id
    rows = [
        (pid, "measurement", system, code, None, day, value, unit, "Observation", ref)
        for concept, (value, unit) in measured
        for system, code in codings_of(concept)
    ]
    if not rows:
        value, unit = main
        rows = [(pid, "measurement", None, None, None, day, value, unit, "Observation", ref)]
    return _for(person, rows)


_EVENT_MAPPERS = {
    "Encounter": _encounter,
    "Condition": _condition,
    "Observation": _observation,
    "MedicationRequest": _medication,
    "Procedure": _procedure,
}
