"""What one FHIR record becomes, decided from its JSON alone, in whichever process reads it.

:func:`decide` validates a parsed record with ``fhir.resources`` and maps it
(:mod:`harmonize.fhir_mapping`); the result, a :class:`Decision`, needs none
of the run's state, so worker processes can take it. The reader applies
decisions in file order (duplicated ids, references to other records).

:func:`decide_lines` does this for numbered NDJSON lines, and may instead
*defer* a record: an Observation or Encounter of the plain shape of
:func:`harmonize.fhir_json.plain_rows` whose id occurs once in the export
is then not validated; its rows, as they would be if it were valid,
go to a :class:`DeferredRows` sink with ``unvalidated`` set, and the
reader validates it in full only if the analysis frame relies on it (see
:mod:`harmonize.fhir`). Without the set of repeated ids (``repeated=None``)
every record is validated.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import date
from typing import Any

import pyarrow as pa

from harmonize.fhir_json import PLAIN_TYPES, parse_json, plain_rows, record_key
from harmonize.fhir_mapping import (
    USED_TYPES,
    Exclusion,
    MedicationReference,
    Rejection,
    Rows,
    Scope,
    clip,
    scope_of,
    status_exclusion,
    to_rows,
    validate,
)

__all__ = ["NOT_USED", "Decision", "DeferredRows", "decide", "decide_lines", "malformed"]

NOT_USED = "resource type not used by the spec"


@dataclass(frozen=True, slots=True)
class Decision:
    """What one record becomes, decided without the run's state (so in any process).

    ``model_id`` is the validated resource's id (a Patient's person id),
    which the run checks for duplicates before it applies ``outcome``;
    ``scope`` the codes by which it could match the study's concept sets
    (None: always used, or unreadable).
    """

    record_type: str
    record_id: str | None
    model_id: str | None
    outcome: Rows | Exclusion | Rejection | MedicationReference
    scope: Scope | None = None


def decide(resource: object, record_ref: str, today: date, full_url: str | None = None) -> Decision:
    """Validate and map one parsed record (see :mod:`harmonize.fhir` for the rules).

    ``full_url``: the Bundle entry's ``fullUrl``, the identity of a Patient without an id.
    """
    if not isinstance(resource, dict):
        problem = Rejection(None, f"not a JSON object but {type(resource).__name__}")
        return Decision("unknown", None, None, problem)
    resource_type = resource.get("resourceType")
    if not isinstance(resource_type, str) or not resource_type:
        problem = Rejection("resourceType", "missing resourceType")
        return Decision("unknown", record_id(resource), None, problem)
    resource_type = clip(resource_type, 64)
    if resource_type not in USED_TYPES:
        return Decision(resource_type, None, None, Exclusion(NOT_USED))
    scope = scope_of(resource_type, resource)
    model = validate(resource_type, resource)
    if isinstance(model, Rejection):
        return Decision(resource_type, record_id(resource), None, model, scope)
    outcome = status_exclusion(resource_type, model) or to_rows(
        resource_type, model, record_ref, today, full_url
    )
    model_id = model.id
    if resource_type == "Patient" and isinstance(outcome, Rows):
        model_id = outcome.rows[0][0]
    return Decision(resource_type, record_id(resource), model_id, outcome, scope)


def malformed(error: Exception) -> Decision:
    """The decision for a line that is not JSON."""
    return Decision("unknown", None, None, Rejection(None, clip(f"malformed JSON: {error}")))


def decide_lines(
    lines: Iterable[tuple[int, bytes]],
    source: str,
    today: date,
    repeated: frozenset[int] | None,
    deferred: DeferredRows,
) -> Iterator[tuple[int, Decision]]:
    """Decisions for numbered NDJSON lines of ``source``; deferred records go to ``deferred``.

    ``repeated``: the keys (:func:`harmonize.fhir_json.record_key`) of the
    ids that occur more than once in the export; None: defer nothing.
    """
    for number, line in lines:
        record_ref = f"{source}:line {number}"
        try:
            resource = parse_json(line)
        except (ValueError, RecursionError) as error:
            yield number, malformed(error)
            continue
        if repeated is not None and _deferrable(resource, repeated):
            rows = plain_rows(resource, record_ref, today)
            if rows is not None:
                deferred.add(resource["resourceType"], rows)
                continue
        yield number, decide(resource, record_ref, today)


def _deferrable(resource: object, repeated: frozenset[int]) -> bool:
    if not isinstance(resource, dict):
        return False
    kind = resource.get("resourceType")
    if kind not in PLAIN_TYPES:
        return False
    return not repeated or record_key(kind, resource.get("id")) not in repeated


def record_id(resource: dict[str, Any]) -> str | None:
    """The record's ``id`` as written (clipped), for the quarantine."""
    value = resource.get("id")
    if isinstance(value, bool) or not isinstance(value, str | int):
        return None
    return clip(str(value), 64)


_DEFERRED_SCHEMA = pa.schema(
    [
        ("person_id", pa.string()),
        ("domain", pa.string()),
        ("system", pa.string()),
        ("code", pa.string()),
        ("concept_id", pa.int64()),
        ("event_date", pa.date32()),
        ("value", pa.float64()),
        ("unit", pa.string()),
        ("record_type", pa.string()),
        ("record_ref", pa.string()),
    ]
)


class DeferredRows:
    """``events`` rows of deferred records, handed over as an Arrow table (``unvalidated`` true).

    ``records`` counts the records by resource type, ``len()`` their rows.
    """

    def __init__(self) -> None:
        self.rows: list[tuple[Any, ...]] = []
        self.records: Counter[str] = Counter()

    def __len__(self) -> int:
        return len(self.rows)

    def add(self, resource_type: str, rows: list[tuple[Any, ...]]) -> None:
        self.rows.extend(rows)
        self.records[resource_type] += 1

    def take(self) -> tuple[pa.Table, Counter[str]]:
        """The rows so far as a table (columns of ``events``) and their records; then empty."""
        rows = self.rows
        arrays = [
            pa.array([row[i] for row in rows], type=column.type)
            for i, column in enumerate(_DEFERRED_SCHEMA)
        ]
        table = pa.Table.from_arrays(arrays, schema=_DEFERRED_SCHEMA)
        table = table.append_column("unvalidated", pa.array([True] * len(self.rows)))
        records = self.records
        self.rows = []
        self.records = Counter()
        return table, records
