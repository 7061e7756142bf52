"""NDJSON lines as JSON, and the rows of a plain Observation or Encounter read from its JSON alone.

:func:`parse_json` parses a line with ``orjson`` (several times faster than
``json``); the inputs ``orjson`` refuses and ``json`` accepts (``NaN`` and
``Infinity``, numbers beyond a double's range, lone surrogates in strings,
UTF-16 text) are handed to ``json``, so a line is malformed exactly when
``json.loads`` says it is. (``orjson`` reads an integer beyond 64 bits as the
nearest double, where ``json`` keeps it exact; no element the reader maps is
an integer, and a FHIR ``decimal`` becomes the same double either way.)

:func:`plain_rows` gives the ``events`` rows an Observation or Encounter of
a plain shape would give if it were valid FHIR: exactly the rows
:func:`harmonize.fhir_mapping.to_rows` gives for the validated resource,
without building the ``fhir.resources`` model (about 0.1 ms a resource, the
cost of reading a large export). The shape (FHIR R4 Observation 4.1.x and
Encounter 4.4.x, mapped as in :mod:`harmonize.fhir_mapping`):

* a ``status`` that does not say the event did not happen, and a ``code``
  (Observation) or a ``class`` (Encounter);
* ``subject.reference`` ``Patient/<id>`` (relative, with or without
  ``_history``): no Bundle ``fullUrl`` or contained Patient to resolve;
* ``effectiveDateTime`` (Observation) or ``period.start`` (Encounter) with
  a full calendar date not after *today*;
* Observation: ``valueQuantity`` and each ``component[].valueQuantity``
  absent or with a unit (``code`` or ``unit``) and a JSON number (or a
  comparator) as value;
* codings whose ``system`` and ``code`` are strings or absent.

For any other record it returns None, and the reader validates the record
as it reads it, as always. The reader stores these rows for the records the
analysis frame may not use and validates such a record in full only when the
frame relies on it (see :mod:`harmonize.fhir`).

:func:`record_key` is the 64-bit key of a resource's type and id by which
the first pass finds ids that occur more than once (CRC-32 and Adler-32 of
``<type>/<id>``, the same in every process, unlike ``hash``; two ids that
share a key are only validated as they are read, never confused).
:func:`line_key` reads it from an NDJSON line, without parsing the line when
it begins ``{"resourceType":"<type>","id":"...`` and holds no other
``"id"`` or ``"resourceType"`` and no escape. It must find the key of every
line the reader may read without validation, however the line spells the
resource (an escaped ``"Observ\\u0061tion"``, a ``resourceType`` written
twice, UTF-16 text, which ``json`` reads): a line is passed over unparsed only
when :func:`may_hold` says the type's name cannot be in it.
"""

from __future__ import annotations

import functools
import json
import math
import zlib
from datetime import date
from typing import Any

import orjson

from harmonize.fhir_mapping import FULL_DATE, NOT_HAPPENED, PATIENT_REFERENCE

__all__ = [
    "PLAIN_TYPES",
    "line_key",
    "may_hold",
    "parse_json",
    "plain_key",
    "plain_rows",
    "record_key",
]

PLAIN_TYPES = ("Observation", "Encounter")
"""The resource types whose records :func:`plain_rows` may read."""
_PREFIXES = {kind: f'{{"resourceType":"{kind}","id":"'.encode() for kind in PLAIN_TYPES}
_MARKS = {kind: f'"{kind}"'.encode() for kind in PLAIN_TYPES}
_CACHED = 1 << 16

Row = tuple[Any, ...]


def parse_json(data: bytes) -> Any:
    """``json.loads(data)``, computed by ``orjson`` when it can (see the module docstring).

    Raises ``ValueError`` (or ``RecursionError``) exactly when ``json.loads`` does.
    """
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return json.loads(data)


def record_key(resource_type: str, record_id: object) -> int | None:
    """The 64-bit key of ``<type>/<id>`` (an id written as a string or integer), else None."""
    if isinstance(record_id, bool) or not isinstance(record_id, str | int):
        return None
    return _key(f"{resource_type}/{record_id}".encode("utf-8", "surrogatepass"))


def _key(text: bytes) -> int:
    return (zlib.crc32(text) << 32 | zlib.adler32(text)) - (1 << 63)


def plain_key(resource_type: bytes, record_id: bytes) -> int:
    """:func:`record_key` of a type and an id as a line writes them (UTF-8, no escape)."""
    return _key(resource_type + b"/" + record_id)


def line_key(line: bytes) -> int | None:
    """:func:`record_key` of the line's resource if it is of a :data:`PLAIN_TYPES` type."""
    for kind in PLAIN_TYPES:
        prefix = _PREFIXES[kind]
        if (
            line.startswith(prefix)
            and line.count(b'"id"') == 1
            and line.count(b'"resourceType"') == 1
            and b"\\" not in line
        ):
            end = line.find(b'"', len(prefix))
            if end > 0:
                return plain_key(kind.encode(), line[len(prefix) : end])
    if not any(may_hold(mark, line) for mark in _MARKS.values()):
        return None
    try:
        resource = parse_json(line)
    except (ValueError, RecursionError):
        return None  # the reader rejects it
    if not isinstance(resource, dict) or resource.get("resourceType") not in PLAIN_TYPES:
        return None
    return record_key(resource["resourceType"], resource.get("id"))


def may_hold(mark: bytes, line: bytes) -> bool:
    """Whether ``line`` may hold the JSON string ``mark`` (``b'"Medication"'``, say) once parsed.

    It does when it holds those bytes; else only through an escape
    (``"Medic\\u0061tion"``) or in a text ``json`` does not read as UTF-8
    (UTF-16 or UTF-32, whose ASCII characters take zero bytes).
    """
    return mark in line or b"\\" in line or b"\x00" in line


def plain_rows(resource: dict[str, Any], record_ref: str, today: date) -> list[Row] | None:
    """The ``events`` rows of a plain Observation or Encounter if it is valid FHIR, else None."""
    kind = resource.get("resourceType")
    status = resource.get("status")
    if kind not in PLAIN_TYPES or not isinstance(status, str) or status in NOT_HAPPENED[kind]:
        return None
    if not isinstance(resource.get("id", ""), str):
        return None
    subject = resource.get("subject")
    reference = subject.get("reference") if isinstance(subject, dict) else None
    person = _person(reference) if isinstance(reference, str) else None
    if person is None:
        return None
    if kind == "Observation":
        return _observation(resource, person, record_ref, today)
    return _encounter(resource, person, record_ref, today)


def _observation(resource: dict[str, Any], person: str, ref: str, today: date) -> list[Row] | None:
    """As ``fhir_mapping._observation``: a row per coding of the code and of each component."""
    if "code" not in resource:
        return None
    day = _day(resource.get("effectiveDateTime"), today)
    main = _quantity(resource.get("valueQuantity"))
    codes = _codings(resource.get("code"))
    if day is None or main is None or codes is None:
        return None
    measured = [(codes, main)]
    components = resource.get("component")
    if components is not None:
        if not isinstance(components, list):
            return None
        for part in components:
            if not isinstance(part, dict):
                return None
            part_codes = _codings(part.get("code"))
            part_value = _quantity(part.get("valueQuantity"))
            if part_codes is None or part_value is None:
                return None
            measured.append((part_codes, part_value))
    rows = [
        (person, "measurement", system, code, None, day, value, unit, "Observation", ref)
        for codings, (value, unit) in measured
        for system, code in codings
    ]
    if not rows:
        value, unit = main
        rows = [(person, "measurement", None, None, None, day, value, unit, "Observation", ref)]
    return rows


def _encounter(resource: dict[str, Any], person: str, ref: str, today: date) -> list[Row] | None:
    """As ``fhir_mapping._encounter``: one visit row, with the first coding of ``type``."""
    if "class" not in resource:
        return None
    period = resource.get("period")
    day = _day(period.get("start") if isinstance(period, dict) else None, today)
    types = resource.get("type")
    if day is None or not isinstance(types, list | None):
        return None
    first = None
    for concept in types or []:
        codings = _codings(concept)
        if codings is None:
            return None
        if codings and first is None:
            first = codings[0]
    system, code = first if first is not None else (None, None)
    return [(person, "visit", system, code, None, day, None, None, "Encounter", ref)]


@functools.lru_cache(maxsize=_CACHED)
def _person(reference: str) -> str | None:
    """``<id>`` of a relative ``Patient/<id>`` reference (as ``_person_id`` reads it)."""
    if reference.startswith(("#", "urn:")) or "://" in reference:
        return None
    match = PATIENT_REFERENCE.search(reference)
    return match.group(1) if match is not None else None


def _day(value: object, today: date) -> date | None:
    """The calendar date a dateTime was written on, when it is full and not after ``today``."""
    day = _calendar_day(value) if isinstance(value, str) else None
    return day if day is not None and day <= today else None


@functools.lru_cache(maxsize=_CACHED)
def _calendar_day(value: str) -> date | None:
    match = FULL_DATE.match(value)
    if match is None:
        return None
    try:
        return date(int(match.group(1)), int(match.group(2)), int(match.group(3)))
    except ValueError:
        return None


def _quantity(quantity: object) -> tuple[float | None, str | None] | None:
    """``(value, unit)`` as ``_quantity`` maps a valid Quantity; None when it would not map."""
    if quantity is None:
        return None, None
    if not isinstance(quantity, dict):
        return None
    unit = quantity.get("code") or quantity.get("unit")
    if not unit or not isinstance(unit, str):
        return None
    value = quantity.get("value")
    if value is None or quantity.get("comparator") is not None:
        return None, unit
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    number = float(value)
    return (number, unit) if math.isfinite(number) else None


def _codings(concept: object) -> list[tuple[str | None, str]] | None:
    """``(system, code)`` of each coding with a code, as ``codings_of`` reads a valid concept."""
    if concept is None:
        return []
    if not isinstance(concept, dict):
        return None
    coding = concept.get("coding")
    if coding is None:
        return []
    if not isinstance(coding, list):
        return None
    out: list[tuple[str | None, str]] = []
    for item in coding:
        if not isinstance(item, dict):
            return None
        system, code = item.get("system"), item.get("code")
        if not isinstance(system, str | None) or not isinstance(code, str | None):
            return None
        if code:
            out.append((system, code))
    return out
