"""The identifier table of a FHIR site: read back from the Patient records of the frame's patients.

The reader (:mod:`harmonize.fhir`) stores no identifier: a study without
linkage never reads or keeps one, and its NDJSON path does no extra work.
A study with a ``[linkage]`` table then calls :func:`fhir_identifiers`
after the frame is built. Each patient of the frame has one ``persons`` row
whose ``record_ref`` (``"<file>:line N"``, ``"<file>:entry 3"``,
``"<file>:entry 3/entry 5"`` or ``"<file>:resource"``) names the record it
came from; those records, and only those, are read again (an NDJSON file
streamed line by line, a Bundle parsed whole, as the reader does) and
validated with ``fhir.resources`` (they were valid when first read). A
patient contained in another record (person id ``<Type>/<id>#<local>``)
is the contained Patient with that local id.

Fields, from the Patient (FHIR R4 Patient, HumanName, Address):

* names: the first HumanName with ``use`` ``official``, else the first
  HumanName; its first ``given`` and its ``family``;
* ``birthDate``, ``gender``;
* postal code: the first Address with ``use`` ``home`` and a
  ``postalCode``, else the first Address with a ``postalCode``.

Each is normalised by :mod:`harmonize.identifiers`.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa

from harmonize.errors import HarmonizationError
from harmonize.fhir_blocks import numbered_lines, whole
from harmonize.fhir_json import parse_json
from harmonize.fhir_mapping import Rejection, validate
from harmonize.fhir_medications import bundle_entries, load_json_document
from harmonize.identifiers import (
    identifier_table,
    normalize_birth_date,
    normalize_name,
    normalize_postal_code,
    normalize_sex,
)
from harmonize.records import RecordStore

__all__ = ["fhir_identifiers", "patient_identifiers"]

_LINE = "line "


def patient_identifiers(patient: Any) -> dict[str, str]:
    """The normalised identifiers of a validated ``fhir.resources`` Patient model."""
    names = list(patient.name or [])
    name = next((n for n in names if n.use == "official"), names[0] if names else None)
    given = (name.given or [None])[0] if name is not None else None
    family = name.family if name is not None else None
    addresses = [a for a in patient.address or [] if a.postalCode]
    address = next((a for a in addresses if a.use == "home"), addresses[0] if addresses else None)
    return {
        "given_name": normalize_name(given),
        "family_name": normalize_name(family),
        "birth_date": normalize_birth_date(patient.birthDate),
        "sex": normalize_sex(patient.gender),
        "postal_code": normalize_postal_code(address.postalCode if address else None),
    }


def fhir_identifiers(
    store: RecordStore, patients: pd.Index, files: Mapping[str, Path]
) -> pd.DataFrame:
    """The identifier table of ``patients`` (the frame's index) from their Patient records.

    ``files``: the input files by the name the store gives them as sources
    (``FhirReading.by_name``).

    Raises
    ------
    HarmonizationError
        A patient's record is no longer where the store says, or is no
        longer a valid Patient (the file changed since it was read), naming
        the file and the location.
    """
    refs = _record_refs(store, patients)
    wanted: dict[str, dict[str, list[str]]] = {}
    for person, ref in refs.items():
        source, _, location = ref.partition(":")
        wanted.setdefault(source, {}).setdefault(location, []).append(person)
    rows: list[tuple[str, dict[str, str]]] = []
    for source, locations in sorted(wanted.items()):
        path = files.get(source)
        if path is None:
            raise HarmonizationError(f"{source}: not an input of this reading")
        for location, resource in _records(path, set(locations)):
            for person in locations[location]:
                patient = _patient_of(resource, person, f"{path}:{location}")
                rows.append((person, patient_identifiers(patient)))
    return identifier_table(rows, patients)


def _record_refs(store: RecordStore, patients: pd.Index) -> dict[str, str]:
    """Each patient's ``record_ref`` in ``persons`` (the first, should there be several)."""
    ids = pa.table({"person_id": pa.array([str(p) for p in patients], pa.string())})
    connection = store.connection
    connection.register("_frame_patients", ids)
    try:
        found = connection.execute(
            "SELECT person_id, min(record_ref) FROM persons "
            "WHERE person_id IN (SELECT person_id FROM _frame_patients) GROUP BY person_id"
        ).fetchall()
    finally:
        connection.unregister("_frame_patients")
    return dict(found)


def _records(path: Path, locations: set[str]) -> list[tuple[str, Any]]:
    """The parsed records of ``path`` at ``locations``; every one must be found."""
    found: list[tuple[str, Any]] = []
    if path.suffix == ".ndjson":
        numbers = {int(loc.removeprefix(_LINE)) for loc in locations if loc.startswith(_LINE)}
        for number, line in numbered_lines(whole(path)):
            if number in numbers:
                found.append((f"{_LINE}{number}", parse_json(line)))
                if len(found) == len(numbers):
                    break
    else:
        document = load_json_document(path)
        if document["resourceType"] != "Bundle":
            entries = iter([("resource", {"resource": document})])
        else:
            entries = bundle_entries(document, path)
        for location, entry in entries:
            if location in locations:
                found.append((location, entry.get("resource")))
    missing = sorted(locations - {location for location, _ in found})
    if missing:
        raise HarmonizationError(
            f"{path}: no record at {', '.join(missing)}: the file changed since it was read; "
            "harmonise again"
        )
    return found


def _patient_of(resource: Any, person: str, where: str) -> Any:
    """The validated Patient of ``person`` in ``resource``: itself, or a contained Patient."""
    if not isinstance(resource, dict):
        raise HarmonizationError(f"{where}: not a FHIR resource any more; harmonise again")
    _, hash_, local = person.partition("#")
    if hash_ and resource.get("resourceType") != "Patient":
        contained = resource.get("contained")
        resource = next(
            (
                item
                for item in (contained if isinstance(contained, list) else [])
                if isinstance(item, dict)
                and item.get("resourceType") == "Patient"
                and item.get("id") == local
            ),
            None,
        )
        where = f"{where} (contained #{local})"
    model = validate("Patient", resource) if isinstance(resource, dict) else None
    if model is None or isinstance(model, Rejection):
        raise HarmonizationError(f"{where}: not a valid Patient any more; harmonise again")
    return model
