"""The first pass over a FHIR export: record counts, Medication codes and Patient fullUrls.

A MedicationRequest usually names its drug by reference (FHIR R4
``MedicationRequest.medication[x]``, section 3.3.1): to a Medication
contained in it (``#med1``, resolved by :mod:`harmonize.fhir_mapping`), to a
Bundle entry (its ``fullUrl``, often ``urn:uuid:...``), or to an exported
Medication (``Medication/abc``, in a Bundle or in the Bulk Data export's
``Medication.ndjson``). The Medication may come after the request, in the
same file or in a later one, so :func:`survey` reads every input once before
the records are mapped and keeps only what resolving needs: each
Medication's codings (``(system, code)`` pairs) under the references that may
name it. That costs about 150 bytes per Medication, whatever the size of the
other resources; identical codings are stored once.

NDJSON lines are only parsed when they contain the text ``"Medication"``,
so the pass over the other lines is a byte scan; it also counts the records
of every file (non-blank lines, Bundle entries), which gives the total for
progress reports and the records a stopped run did not process. Medications
are validated with the same ``fhir.resources`` models as every other
record; one that is not valid FHIR, has no code, or shares its reference
with a Medication of other codes makes the requests naming it unresolvable,
with a reason that says so.

The same pass indexes the ``fullUrl`` of every Patient entry of a Bundle
(:class:`PatientIndex`), so that a subject ``urn:uuid:...`` names its
Patient wherever the entry is, and walks Bundles inside Bundles
(:func:`bundle_entries`) as the reader will.

Asked for ``keys``, it also finds the Observation and Encounter ids that
occur more than once in the export (by their 64-bit
:func:`~harmonize.fhir_json.record_key`, 8 bytes per record while the pass
runs): a record with such an id is always validated as it is read, so that
duplicates are refused in file order as before, while the others may be
read without validation (see
:mod:`harmonize.fhir`). Large NDJSON files are surveyed in blocks
(:mod:`harmonize.fhir_blocks`) by the reader's worker processes, which then
read the same blocks.
"""

from __future__ import annotations

import re
from array import array
from collections.abc import Callable, Collection, Iterable, Iterator
from dataclasses import dataclass, field
from itertools import repeat
from pathlib import Path
from typing import Any

import numpy as np

from harmonize.errors import BundleTooDeep, HarmonizationError
from harmonize.fhir_blocks import Block, BlockSurvey, renumber, split, survey_block, whole
from harmonize.fhir_json import PLAIN_TYPES, parse_json, record_key
from harmonize.fhir_mapping import (
    MEDICATION,
    Coding,
    Rejection,
    clip,
    medication_codings,
    validate,
)

__all__ = [
    "MAX_BUNDLE_DEPTH",
    "MedicationIndex",
    "PatientIndex",
    "Survey",
    "bundle_entries",
    "load_json_document",
    "survey",
]

MAX_BUNDLE_DEPTH = 8
"""Bundles nested deeper than this (a file's Bundle is depth 1) stop the run (BundleTooDeep)."""
_REFERENCE_FIELD = "medicationReference.reference"

_MEDICATION_REF = re.compile(
    r"(?:^|/)Medication/([A-Za-z0-9\-.]{1,64})(?:/_history/[A-Za-z0-9\-.]+)?$"
)
_SHOWN_REFERENCE = 100


@dataclass
class MedicationIndex:
    """Codings of the export's Medications, by ``Medication/<id>`` and by Bundle ``fullUrl``.

    A value is the Medication's codings (of its ``code`` and of its
    ingredients' ``itemCodeableConcept``), or a ``(reason, detail)`` pair
    saying why a reference to it cannot give a code.
    """

    entries: dict[str, tuple[Coding, ...] | tuple[str, str]] = field(default_factory=dict)
    _interned: dict[tuple[Coding, ...], tuple[Coding, ...]] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.entries)

    def add(self, resource: dict[str, Any], where: str, full_url: object = None) -> None:
        """Index one Medication resource (a parsed JSON object) found at ``where``."""
        keys = []
        if isinstance(resource.get("id"), str):
            keys.append(f"{MEDICATION}/{resource['id']}")
        if isinstance(full_url, str) and full_url:
            keys.append(full_url)
        if not keys:
            return  # nothing can reference it
        model = validate(MEDICATION, resource)
        value: tuple[Coding, ...] | tuple[str, str]
        if isinstance(model, Rejection):
            value = (
                "medicationReference names a Medication that is not valid FHIR",
                f"the Medication it names ({where}) is not valid FHIR",
            )
        else:
            codings = tuple(medication_codings(model))
            value = (
                self._interned.setdefault(codings, codings)
                if codings
                else (
                    "medicationReference names a Medication without a code",
                    f"the Medication it names ({where}) has no code nor coded ingredient",
                )
            )
        for key in keys:
            known = self.entries.get(key)
            if known is None:
                self.entries[key] = value
            elif known != value:
                self.entries[key] = (
                    "medicationReference names Medications with different codes",
                    f"Medications with different codes share it (another one at {where})",
                )

    def resolve(self, reference: str) -> list[Coding] | Rejection:
        """The codings ``reference`` points to, or why not (the detail names the reference)."""
        value = self.entries.get(reference)
        if value is None:
            match = _MEDICATION_REF.search(reference)
            if match is not None:
                value = self.entries.get(f"{MEDICATION}/{match.group(1)}")
        shown = clip(reference, _SHOWN_REFERENCE)
        if value is None:
            return Rejection(
                _REFERENCE_FIELD,
                "medicationReference matches no Medication in the export",
                f"medicationReference {shown!r} matches no Medication in the export "
                "(no Bundle entry or NDJSON line with that id or fullUrl)",
            )
        if isinstance(value[0], str):
            reason, detail = value
            return Rejection(
                _REFERENCE_FIELD, str(reason), f"medicationReference {shown!r}: {detail}"
            )
        return list(value)  # type: ignore[arg-type]


@dataclass
class PatientIndex:
    """The person id of each Patient a Bundle entry's ``fullUrl`` identifies.

    A reference ``urn:uuid:...`` (a Patient POSTed in a transaction) or an
    absolute URL names the entry with that ``fullUrl`` (FHIR R4, 2.36.4
    Resolving references in Bundles); the person id is the Patient's ``id``,
    or its ``fullUrl`` when it has none (as :mod:`harmonize.fhir_mapping`
    gives it). A ``fullUrl`` given to Patients of different ids names none
    of them: ``None``.
    """

    persons: dict[str, str | None] = field(default_factory=dict)

    def add(self, resource: dict[str, Any], full_url: object) -> None:
        if not isinstance(full_url, str) or not full_url:
            return
        rid = resource.get("id")
        person = rid if isinstance(rid, str) and rid else full_url
        known = self.persons.setdefault(full_url, person)
        if known != person:
            self.persons[full_url] = None

    def resolve(self, reference: str) -> str | Rejection | None:
        """The person id ``reference`` names; None when no entry has that fullUrl."""
        if reference not in self.persons:
            return None
        person = self.persons[reference]
        if person is None:
            return Rejection(
                "subject.reference",
                "subject fullUrl is shared by Patients of different ids",
                clip(repr(reference), _SHOWN_REFERENCE),
            )
        return person


@dataclass
class Survey:
    """What the first pass found.

    ``records`` per file (in read order), the Medication and Patient
    indexes, the numbered ``blocks`` of each NDJSON file (one block when
    it is read in this process), and ``repeated``: the keys of the
    Observation and Encounter ids that occur more than once (None when not asked).
    """

    records: dict[Path, int]
    medications: MedicationIndex
    patients: PatientIndex = field(default_factory=PatientIndex)
    blocks: dict[Path, list[Block]] = field(default_factory=dict)
    repeated: frozenset[int] | None = None

    @property
    def total(self) -> int:
        return sum(self.records.values())


BlockMap = Callable[..., Iterable[BlockSurvey]]
"""``map``-like: ``(survey_block, blocks, keys)`` to each block's survey, in order."""


def survey(
    files: Iterable[Path],
    *,
    keys: bool = False,
    in_blocks: Collection[Path] = (),
    block_map: BlockMap = map,
) -> Survey:
    """Count every file's records and index its Medications (see the module docstring).

    ``keys``: also find the Observation and Encounter ids that occur more than once.
    ``in_blocks``: NDJSON files to survey in blocks, with ``block_map`` (a
    process pool's ``map``, so that workers survey them).

    Raises
    ------
    HarmonizationError
        A file cannot be read, or a ``.json`` file is not valid JSON or not a
        Bundle or resource, or holds Bundles nested deeper than
        :data:`MAX_BUNDLE_DEPTH` (:class:`~harmonize.errors.BundleTooDeep`)
        -- before any record is read.
    """
    found = Survey({}, MedicationIndex())
    collected = array("q")
    for path in files:
        try:
            if path.suffix == ".ndjson":
                parallel = path in in_blocks
                blocks = split(path) if parallel or keys else [whole(path)]
                surveys = list((block_map if parallel else map)(survey_block, blocks, repeat(keys)))
                found.blocks[path] = renumber(blocks, surveys)
                n = _take_block_surveys(path, found.blocks[path], surveys, found, collected)
            else:
                n = _survey_json(path, found, collected if keys else None)
        except OSError as error:
            raise HarmonizationError(f"{path}: cannot read ({error})") from None
        found.records[path] = n
    if keys:
        values, counts = np.unique(np.frombuffer(collected, dtype=np.int64), return_counts=True)
        found.repeated = frozenset(values[counts > 1].tolist())
    return found


def _take_block_surveys(
    path: Path, blocks: list[Block], surveys: list[BlockSurvey], found: Survey, keys: array
) -> int:
    """Index the blocks' Medications (in file order) and collect their keys; their records."""
    for block, block_survey in zip(blocks, surveys, strict=True):
        for line, resource in block_survey.medications:
            found.medications.add(resource, f"{path.name}:line {block.first_line - 1 + line}")
        keys.extend(block_survey.keys)
    return sum(block_survey.records for block_survey in surveys)


def load_json_document(path: Path) -> dict[str, Any]:
    """A ``.json`` input parsed whole: one Bundle or one resource, else a HarmonizationError."""
    try:
        document = parse_json(path.read_bytes())
    except (ValueError, RecursionError) as error:
        raise HarmonizationError(f"{path}: not valid JSON ({clip(str(error))})") from None
    if not isinstance(document, dict) or not isinstance(document.get("resourceType"), str):
        raise HarmonizationError(f"{path}: not a FHIR Bundle or resource (no resourceType)")
    if document["resourceType"] == "Bundle" and not isinstance(document.get("entry", []), list):
        raise HarmonizationError(f"{path}: Bundle.entry is not a list")
    return document


def _survey_json(path: Path, found: Survey, keys: array | None) -> int:
    document = load_json_document(path)
    resources: Iterable[tuple[str, Any]]
    if document["resourceType"] != "Bundle":
        resources = [("resource", {"resource": document})]
    else:
        resources = bundle_entries(document, path)
    n = 0
    for location, entry in resources:
        n += 1
        resource = entry.get("resource") if isinstance(entry, dict) else None
        if not isinstance(resource, dict):
            continue
        kind = resource.get("resourceType")
        if kind == MEDICATION:
            found.medications.add(resource, f"{path.name}:{location}", entry.get("fullUrl"))
        elif kind == "Patient":
            found.patients.add(resource, entry.get("fullUrl"))
        elif kind in PLAIN_TYPES and keys is not None:
            key = record_key(kind, resource.get("id"))
            if key is not None:
                keys.append(key)
    return n


def bundle_entries(
    bundle: dict[str, Any], path: Path, location: str = "", depth: int = 1
) -> Iterator[tuple[str, Any]]:
    """Every entry of ``bundle`` that is not itself a Bundle, with its location, in order.

    An entry whose resource is a Bundle (a ``collection`` of per-patient
    Bundles, say) is walked instead of counted: its entries are records, at
    ``entry 3/entry 5`` (indexes in each ``Bundle.entry``, counted from 0).

    Raises
    ------
    HarmonizationError
        A nested ``Bundle.entry`` is not a list; :class:`BundleTooDeep`
        beyond :data:`MAX_BUNDLE_DEPTH` levels. Both name the file and entry.
    """
    if depth > MAX_BUNDLE_DEPTH:
        raise BundleTooDeep(
            f"{path}: {location.rstrip('/')}: Bundles nested more than {MAX_BUNDLE_DEPTH} deep; "
            "flatten the export (a Bundle of Bundles of resources is read)"
        )
    entries = bundle.get("entry", [])
    if not isinstance(entries, list):
        raise HarmonizationError(f"{path}: {location.rstrip('/')}: Bundle.entry is not a list")
    for index, entry in enumerate(entries):
        here = f"{location}entry {index}"
        resource = entry.get("resource") if isinstance(entry, dict) else None
        if isinstance(resource, dict) and resource.get("resourceType") == "Bundle":
            yield from bundle_entries(resource, path, f"{here}/", depth + 1)
        else:
            yield here, entry
