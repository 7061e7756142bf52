"""Read a site's FHIR R4 data (Bundles and Bulk Data NDJSON) into a :class:`RecordStore`.

:func:`read_fhir` reads ``.json`` files (one Bundle, or one resource) and
``.ndjson`` files (FHIR Bulk Data export: one resource per line, streamed
line by line). Every input record -- a Bundle entry or an NDJSON line -- is
counted in ``read_counts`` and then becomes exactly one of:

* rows of ``persons`` (Patient, and a Patient contained in the record that
  its subject names) or ``events`` (Encounter, Condition, Observation,
  MedicationRequest, Procedure), all carrying the record's ``record_ref``,
  ``"<file name>:<location>"``; the mapping is described in
  :mod:`harmonize.fhir_mapping`. A subject ``urn:uuid:...`` or an absolute
  URL names the Patient of the Bundle entry with that ``fullUrl`` (indexed
  by the first pass), whose person id is its ``id``, or its ``fullUrl``
  when it has none (a Patient POSTed in a transaction);
* an ``excluded_at_read`` count: a resource type the study does not use
  (``resource type not used by the spec``), a status saying the event did
  not happen (``status entered-in-error``, ``status cancelled``,
  ``status not-done``, ``status refuted``), the lines of a Bulk Data
  export log (``log.ndjson``: record type ``BulkDataExportLog``), a batch
  or transaction entry holding only a request (``not data: a DELETE
  request``, record type ``Bundle.entry.request``) or only a response, or
  a record whose codes are in no concept set of the study (``concepts``)
  and that could not be mapped (:data:`~harmonize.records.OUTSIDE_CONCEPTS`);
* one ``rejected`` row naming the file, the location (``line N``, counted
  from 1, or ``entry N``, the index in ``Bundle.entry`` counted from 0;
  ``entry 3/entry 5`` in a Bundle inside a Bundle), the resource type and
  id, the field, the reason and its detail: malformed JSON, a resource
  ``fhir.resources`` does not validate as FHIR R4, a duplicated id, no
  Patient subject, a missing, partial or future date, a quantity without a
  unit, a medication without a code, or a ``medicationReference`` that
  resolves to no coded Medication (the detail names the reference, the
  file and line). The reason names the kind of problem only, so that
  records with the same problem share it.

A Bundle whose entries are Bundles is walked, up to
:data:`~harmonize.fhir_medications.MAX_BUNDLE_DEPTH` levels; its entries are
the records, not the inner Bundles.

So ``read = represented + excluded_at_read + rejected`` holds per file.

Before any record is mapped, a first pass (:func:`harmonize.fhir_medications.survey`)
counts every file's records and indexes the export's Medication codes, so
that a MedicationRequest naming ``Medication/abc`` or a Bundle entry's
``fullUrl`` is coded by that Medication whichever file, and wherever in it,
the Medication is. A ``.json`` file that is not valid JSON stops the run in
this pass, before anything is read. When a file's rejected share stops the
run, the records of the files not yet read are counted in the store's
``unprocessed`` table, so the report still balances. The store's notes say
how many conditions were dated by ``recordedDate`` (no onset) and how many
medication requests were coded through a reference to an exported Medication.

Rows are buffered per table and appended to the store every ``batch_size``
rows: memory stays bounded whatever the size of an NDJSON file (a ``.json``
Bundle is one JSON document and is parsed whole). The ids already seen are
kept, per resource type, to refuse duplicates: about 100 bytes per resource.

Validating a resource with ``fhir.resources`` costs about 0.1 ms, which
dominates large exports; NDJSON files may therefore be validated by several
processes (``workers``), each taking chunks of lines. The main process takes
their decisions in file order, checks duplicates and writes the store, so
the result does not depend on the number of workers, and only a few chunks
per worker are in flight at a time.
"""

from __future__ import annotations

import json
import multiprocessing
import os
from collections import Counter, deque
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from datetime import date
from itertools import chain, islice
from pathlib import Path
from typing import Any

import pandas as pd

from harmonize.errors import HarmonizationError
from harmonize.fhir_mapping import (
    DATED_BY_RECORDED_DATE,
    EVENT_COLUMNS,
    MEDICATION,
    PERSON_COLUMNS,
    USED_TYPES,
    Coding,
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
from harmonize.fhir_medications import (
    MedicationIndex,
    PatientIndex,
    bundle_entries,
    load_json_document,
    survey,
)
from harmonize.progress import Progress, ProgressCounter
from harmonize.records import OUTSIDE_CONCEPTS, RecordStore

__all__ = ["NOT_READ", "NOT_USED", "REQUEST_ONLY", "read_fhir"]

NOT_USED = "resource type not used by the spec"
EXPORT_LOG = "BulkDataExportLog"
EXPORT_LOG_REASON = "not a FHIR resource: Bulk Data export log"
NOT_READ = "not read: the run stopped at an earlier file (max_rejected_share)"
REQUEST_ONLY = "Bundle.entry.request"
"""The record type of a batch or transaction entry that carries a request and no resource."""
_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "DELETE", "PATCH"})
_REJECTED_COLUMNS = ["source", "location", "record_type", "record_id", "field", "reason", "detail"]
_COLUMNS = {"persons": PERSON_COLUMNS, "events": EVENT_COLUMNS, "rejected": _REJECTED_COLUMNS}
_SUFFIXES = (".json", ".ndjson")
_FIRST_REASONS = 3
_MAX_REASON = 500
PARALLEL_MIN_BYTES = 64 * 2**20
"""NDJSON files this large are validated by several processes unless ``workers`` says."""
MAX_AUTO_WORKERS = 4
CHUNK_LINES = 2_000
CHUNKS_IN_FLIGHT_PER_WORKER = 3


def read_fhir(
    paths: str | Path | Iterable[str | Path],
    store: RecordStore,
    *,
    max_rejected_share: float = 0.10,
    today: date | None = None,
    batch_size: int = 50_000,
    workers: int | None = None,
    progress: Progress | None = None,
    concepts: Iterable[Coding] | None = None,
) -> None:
    """Read FHIR R4 Bundles and NDJSON files into ``store``, accounting for every record.

    Parameters
    ----------
    paths
        Files or directories. A directory stands for every ``*.json`` and
        ``*.ndjson`` file in it (not recursively), in name order. A ``.json``
        file holds one Bundle (each entry is a record) or one resource; an
        ``.ndjson`` file holds one resource per line. Files are named in the
        store by their file name, so two inputs may not share a name.
    store
        The record store to fill: ``persons``, ``events``, ``read_counts``,
        ``excluded_at_read`` and ``rejected`` (see :mod:`harmonize.records`).
    max_rejected_share
        Largest share of a file's records that may be rejected; above it the
        file is unusable as a whole and the run stops.
    today
        Dates after this day are rejected as in the future (default: the
        day of the call).
    batch_size
        Rows buffered per table before they are appended to the store.
    workers
        Processes validating NDJSON lines. ``None``: the machine's cores (at
        most 4) for NDJSON files of at least 64 MB, else one; ``1``: this
        process only; more: that many for every NDJSON file.
    progress
        Called as ``progress(done, total)`` with the records processed so far
        and the total counted by the first pass (see :mod:`harmonize.progress`).
    concepts
        The ``(system, code)`` pairs of the study's concept sets. A
        Condition, Observation, MedicationRequest, Procedure or Medication
        none of whose codes is among them is not used by the study: when it
        could not be mapped (a missing date, say) it is excluded at read as
        :data:`~harmonize.records.OUTSIDE_CONCEPTS`, never rejected, so it
        never stops the run. ``None``: every record is checked.

    Raises
    ------
    HarmonizationError
        A path is missing or unreadable, a ``.json`` file is not valid JSON or
        not a Bundle or resource, two inputs share a file name, or a file's
        rejected share exceeds ``max_rejected_share`` (the message gives the
        counts and the first reasons; what was read so far, including that
        file's quarantine, is in the store, and the records of the files not
        read are in its ``unprocessed`` table).
    """
    if not 0.0 <= max_rejected_share <= 1.0:
        raise ValueError(f"max_rejected_share must be within [0, 1], got {max_rejected_share}")
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size}")
    if workers is not None and workers < 1:
        raise ValueError(f"workers must be at least 1, got {workers}")
    files = _input_files(paths)
    found = survey(files)
    counter = ProgressCounter(progress, found.total)
    counter.report()
    with _Reader(store, today or date.today(), batch_size, workers) as reader:
        reader.medications, reader.patients = found.medications, found.patients
        reader.counter = counter
        reader.concepts = frozenset(concepts) if concepts is not None else None
        try:
            for number, path in enumerate(files):
                try:
                    _check_share(path, reader.read_file(path), max_rejected_share)
                except HarmonizationError:
                    left = found.records[path] - sum(reader.tally.read.values())
                    if left > 0:  # the file stopped part way (a process died, say)
                        store.count_unprocessed(path.name, NOT_READ, left)
                    for later in files[number + 1 :]:
                        if found.records[later]:
                            store.count_unprocessed(later.name, NOT_READ, found.records[later])
                    raise
        finally:
            reader.write_notes()
    counter.report()


def _check_share(path: Path, tally: _Tally, max_rejected_share: float) -> None:
    """Stop the run when ``path`` has more rejected records than ``max_rejected_share``."""
    read = sum(tally.read.values())
    if read and tally.rejected / read > max_rejected_share:
        raise HarmonizationError(
            f"{path}: {tally.rejected} of {read} records rejected "
            f"({tally.rejected / read:.1%}, more than max_rejected_share "
            f"{max_rejected_share:.1%}); first reasons: {'; '.join(tally.reasons)}. "
            "The file is unusable as a whole: fix the export, or raise max_rejected_share "
            "after reviewing the store's rejected table."
        )


def _input_files(paths: str | Path | Iterable[str | Path]) -> list[Path]:
    """The files ``read_fhir`` reads for ``paths``, checked to exist and to have distinct names."""
    given = [paths] if isinstance(paths, str | os.PathLike) else list(paths)
    if not given:
        raise HarmonizationError("no FHIR input given: pass files or directories")
    files: list[Path] = []
    for item in map(Path, given):
        if item.is_dir():
            found = sorted(p for p in item.iterdir() if p.suffix in _SUFFIXES and p.is_file())
            if not found:
                raise HarmonizationError(f"{item}: no .json or .ndjson files in this directory")
            files += found
        elif item.is_file():
            if item.suffix not in _SUFFIXES:
                raise HarmonizationError(f"{item}: not a FHIR file (expected .json or .ndjson)")
            files.append(item)
        else:
            raise HarmonizationError(f"{item}: no such file or directory")
    unique: dict[Path, Path] = {}
    by_name: dict[str, Path] = {}
    for path in files:
        resolved = path.resolve()
        if resolved in unique:
            continue
        other = by_name.setdefault(path.name, path)
        if other != path:
            raise HarmonizationError(
                f"{other} and {path} share the file name {path.name!r}, which names the source "
                "of every record: rename one of them or read them into separate stores"
            )
        unique[resolved] = path
    return list(unique.values())


@dataclass
class _Tally:
    """What became of one file's records."""

    read: Counter[str] = field(default_factory=Counter)
    excluded: Counter[tuple[str, str]] = field(default_factory=Counter)
    rejected: int = 0
    reasons: list[str] = field(default_factory=list)


@dataclass
class _RunCounts:
    """Facts of the whole run that become notes: how records were dated and coded."""

    dated_by_recorded_date: int = 0
    coded_by_reference: int = 0


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
    """Validate and map one parsed record (see the module docstring for the rules).

    ``full_url``: the Bundle entry's ``fullUrl``, the identity of a Patient without an id.
    """
    if not isinstance(resource, dict):
        problem = Rejection(None, f"not a JSON object but {type(resource).__name__}")
        return Decision("unknown", None, None, problem)
    resource_type = resource.get("resourceType")
    if not isinstance(resource_type, str) or not resource_type:
        problem = Rejection("resourceType", "missing resourceType")
        return Decision("unknown", _record_id(resource), None, problem)
    resource_type = clip(resource_type, 64)
    if resource_type not in USED_TYPES:
        return Decision(resource_type, None, None, Exclusion(NOT_USED))
    record_id = _record_id(resource)
    scope = scope_of(resource_type, resource)
    model = validate(resource_type, resource)
    if isinstance(model, Rejection):
        return Decision(resource_type, record_id, None, model, scope)
    outcome = status_exclusion(resource_type, model) or to_rows(
        resource_type, model, record_ref, today, full_url
    )
    model_id = model.id
    if resource_type == "Patient" and isinstance(outcome, Rows):
        model_id = outcome.rows[0][0]
    return Decision(resource_type, record_id, model_id, outcome, scope)


def decide_line(line: bytes, record_ref: str, today: date) -> Decision:
    """:func:`decide` for one NDJSON line, which may not even be JSON."""
    try:
        resource = json.loads(line)
    except (ValueError, RecursionError) as error:
        return Decision("unknown", None, None, Rejection(None, clip(f"malformed JSON: {error}")))
    return decide(resource, record_ref, today)


def _decide_chunk(
    chunk: list[tuple[int, bytes]], source: str, today: date
) -> list[tuple[str, Decision]]:
    """Decisions for a chunk of numbered NDJSON lines (run in a worker process)."""
    return [(f"line {n}", decide_line(line, f"{source}:line {n}", today)) for n, line in chunk]


class _Reader:
    """One run: row buffers, the ids seen so far, the worker pool, and applying decisions."""

    def __init__(
        self, store: RecordStore, today: date, batch_size: int, workers: int | None
    ) -> None:
        self.store = store
        self.today = today
        self.batch_size = batch_size
        self.workers = workers
        self.pool: ProcessPoolExecutor | None = None
        self.buffers: dict[str, list[tuple[Any, ...]]] = {name: [] for name in _COLUMNS}
        # Medications are not checked for repeated ids: a Bundle per patient may repeat
        # the same Medication; the index flags one id given with different codes.
        self.seen: dict[str, set[str]] = {name: set() for name in USED_TYPES - {MEDICATION}}
        self.medications = MedicationIndex()
        self.patients = PatientIndex()
        self.concepts: frozenset[Coding] | None = None
        self.counter = ProgressCounter(None)
        self.counts = _RunCounts()
        self.tally = _Tally()

    def __enter__(self) -> _Reader:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.pool is not None:
            self.pool.shutdown(cancel_futures=True)

    def _workers_for(self, path: Path) -> int:
        if self.workers is not None:
            return self.workers
        if path.stat().st_size < PARALLEL_MIN_BYTES:
            return 1
        return max(1, min(MAX_AUTO_WORKERS, os.cpu_count() or 1))

    def _pool(self, workers: int) -> ProcessPoolExecutor:
        if self.pool is None:
            # spawn: workers must not inherit the store's DuckDB threads and locks
            context = multiprocessing.get_context("spawn")
            self.pool = ProcessPoolExecutor(max_workers=workers, mp_context=context)
        return self.pool

    def write_notes(self) -> None:
        """The run's counts that change no total but say how records were dated and coded."""
        if self.counts.dated_by_recorded_date:
            self.store.note(
                "fhir",
                f"{_plural(self.counts.dated_by_recorded_date, 'condition')} dated by "
                "recordedDate (no onset)",
            )
        if self.counts.coded_by_reference:
            self.store.note(
                "fhir",
                f"{_plural(self.counts.coded_by_reference, 'medication request')} coded by the "
                "exported Medication their medicationReference names",
            )

    # ------------------------------------------------------------ files
    def read_file(self, path: Path) -> _Tally:
        """Read one file; what it applied is written to the store even when it stops part way."""
        tally = self.tally = _Tally()
        source = path.name
        try:
            if path.suffix == ".ndjson":
                self._read_ndjson(path, source, tally)
            else:
                self._read_json(path, source, tally)
        except OSError as error:
            raise HarmonizationError(f"{path}: cannot read ({error})") from None
        except BrokenProcessPool as error:
            raise HarmonizationError(
                f"{path}: a validating process died ({error}); rerun with workers=1 "
                "(--workers 1) or with more memory"
            ) from None
        finally:
            for table in _COLUMNS:
                self._flush(table)
            for record_type, n in sorted(tally.read.items()):
                self.store.count_read(source, record_type, n)
            for (record_type, reason), n in sorted(tally.excluded.items()):
                self.store.exclude_at_read(source, record_type, reason, n)
        return tally

    def _read_json(self, path: Path, source: str, tally: _Tally) -> None:
        document = load_json_document(path)
        if document["resourceType"] != "Bundle":
            self._apply(
                source, "resource", decide(document, f"{source}:resource", self.today), tally
            )
            return
        for location, entry in bundle_entries(document, path):
            resource = entry.get("resource") if isinstance(entry, dict) else None
            if resource is None:
                decision = _entry_without_resource(entry)
            else:
                full_url = entry.get("fullUrl")
                full_url = full_url if isinstance(full_url, str) and full_url else None
                decision = decide(resource, f"{source}:{location}", self.today, full_url)
            self._apply(source, location, decision, tally)

    def _read_ndjson(self, path: Path, source: str, tally: _Tally) -> None:
        with path.open("rb") as handle:
            lines = _lines(handle)
            first = next(lines, None)
            if first is None:
                return
            if _is_export_log(first[1]):
                tally.read[EXPORT_LOG] += 1 + sum(1 for _ in lines)
                tally.excluded[(EXPORT_LOG, EXPORT_LOG_REASON)] = tally.read[EXPORT_LOG]
                self.counter.advance(tally.read[EXPORT_LOG])
                return
            numbered = chain([first], lines)
            workers = self._workers_for(path)
            if workers == 1:
                for number, line in numbered:
                    location = f"line {number}"
                    decision = decide_line(line, f"{source}:{location}", self.today)
                    self._apply(source, location, decision, tally)
                return
            pool = self._pool(workers)
            self.store.note("fhir", f"{source}: validated by {workers} worker processes")
            in_flight: deque[Future[list[tuple[str, Decision]]]] = deque()
            for chunk in _chunks(numbered, CHUNK_LINES):
                in_flight.append(pool.submit(_decide_chunk, chunk, source, self.today))
                if len(in_flight) >= CHUNKS_IN_FLIGHT_PER_WORKER * workers:
                    self._apply_chunk(source, in_flight.popleft().result(), tally)
            while in_flight:
                self._apply_chunk(source, in_flight.popleft().result(), tally)

    # ------------------------------------------------------------ records
    def _apply_chunk(
        self, source: str, decisions: list[tuple[str, Decision]], tally: _Tally
    ) -> None:
        for location, decision in decisions:
            self._apply(source, location, decision, tally)

    def _apply(self, source: str, location: str, decision: Decision, tally: _Tally) -> None:
        """Count one record and carry out its decision, refusing duplicated ids."""
        tally.read[decision.record_type] += 1
        self.counter.advance()
        outcome = decision.outcome
        seen = self.seen.get(decision.record_type)
        if decision.model_id is not None and seen is not None:
            if decision.model_id in seen:
                outcome = Rejection("id", "duplicated id")
            else:
                seen.add(decision.model_id)
        if isinstance(outcome, MedicationReference):
            outcome = self._resolve(outcome)
        if isinstance(outcome, Rows) and outcome.subject is not None:
            outcome = self._identify(outcome)
        if isinstance(outcome, Rejection) and self._outside_concepts(decision.scope):
            outcome = Exclusion(OUTSIDE_CONCEPTS)
        if isinstance(outcome, Rejection):
            self._reject(source, location, decision.record_type, decision.record_id, tally, outcome)
        elif isinstance(outcome, Exclusion):
            tally.excluded[(decision.record_type, outcome.reason)] += 1
        else:
            if outcome.dated_by == DATED_BY_RECORDED_DATE:
                self.counts.dated_by_recorded_date += 1
            if outcome.persons:
                self.buffers["persons"].extend(outcome.persons)
                if len(self.buffers["persons"]) >= self.batch_size:
                    self._flush("persons")
            buffer = self.buffers[outcome.table]
            buffer.extend(outcome.rows)
            if len(buffer) >= self.batch_size:
                self._flush(outcome.table)

    def _outside_concepts(self, scope: Scope | None) -> bool:
        """Whether a record of this scope matches no concept set (so it is not used)."""
        if self.concepts is None or scope is None:
            return False
        if any(coding in self.concepts for coding in scope.codings):
            return False
        if scope.medication is not None:
            codings = self.medications.resolve(scope.medication)
            if isinstance(codings, Rejection):
                return False  # its codes are unknown: the rejection stands
            return not any(coding in self.concepts for coding in codings)
        return True

    def _identify(self, outcome: Rows) -> Rows | Rejection:
        """Rows whose subject names a Bundle entry's ``fullUrl`` get that Patient's person id."""
        person = self.patients.resolve(str(outcome.subject))
        if isinstance(person, Rejection):
            return person
        if person is None or person == outcome.rows[0][0]:
            return outcome
        rows = [(person, *row[1:]) for row in outcome.rows]
        return Rows(outcome.table, rows, outcome.dated_by, None, outcome.persons)

    def _resolve(self, pending: MedicationReference) -> Rows | Rejection:
        """Code a MedicationRequest by the exported Medication its reference names."""
        codings = self.medications.resolve(pending.reference)
        if isinstance(codings, Rejection):
            detail = f"{pending.record_ref}: {codings.detail}"
            return Rejection(codings.field, codings.reason, clip(detail, _MAX_REASON))
        self.counts.coded_by_reference += 1
        return pending.rows(codings)

    def _reject(
        self,
        source: str,
        location: str,
        record_type: str,
        record_id: str | None,
        tally: _Tally,
        problem: Rejection,
    ) -> None:
        """Quarantine one record (buffered like rows; same columns as ``RecordStore.reject``)."""
        tally.rejected += 1
        if len(tally.reasons) < _FIRST_REASONS:
            where = f"{location} ({record_type}{', ' + problem.field if problem.field else ''})"
            shown = f" ({problem.detail})" if problem.detail else ""
            tally.reasons.append(f"{where}: {problem.reason}{shown}")
        buffer = self.buffers["rejected"]
        row = (source, location, record_type, record_id, problem.field, problem.reason)
        buffer.append((*row, problem.detail))
        if len(buffer) >= self.batch_size:
            self._flush("rejected")

    def _flush(self, table: str) -> None:
        rows = self.buffers[table]
        if rows:
            self.store.append(table, pd.DataFrame.from_records(rows, columns=_COLUMNS[table]))
            rows.clear()


def _entry_without_resource(entry: object) -> Decision:
    """A Bundle entry without a resource: a batch or transaction request is not data.

    An entry of a ``batch`` or ``transaction`` Bundle may carry only a
    ``request`` (``DELETE Patient/1``, ``GET Observation?...``), and one of a
    ``batch-response`` only a ``response`` (FHIR R4, 2.36.0 Bundle): such
    entries hold no record of a patient and are excluded at read, by method.
    An entry with neither is a defect of the export and is rejected.
    """
    if isinstance(entry, dict) and isinstance(entry.get("request"), dict):
        method = entry["request"].get("method")
        method = method if method in _METHODS else "request"
        return Decision(REQUEST_ONLY, None, None, Exclusion(f"not data: a {method} request"))
    if isinstance(entry, dict) and isinstance(entry.get("response"), dict):
        return Decision("Bundle.entry.response", None, None, Exclusion("not data: a response"))
    problem = Rejection("entry.resource", "Bundle entry without a resource")
    return Decision("unknown", None, None, problem)


def _plural(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _chunks(numbered: Iterator[tuple[int, bytes]], size: int) -> Iterator[list[tuple[int, bytes]]]:
    while chunk := list(islice(numbered, size)):
        yield chunk


def _record_id(resource: dict[str, Any]) -> str | None:
    value = resource.get("id")
    if isinstance(value, bool) or not isinstance(value, str | int):
        return None
    return clip(str(value), 64)


def _is_export_log(line: bytes) -> bool:
    """A Bulk Data export log line (``log.ndjson``): ``exportId`` and ``eventId``, no type."""
    try:
        first = json.loads(line)
    except (ValueError, RecursionError):
        return False
    return (
        isinstance(first, dict)
        and "resourceType" not in first
        and {"exportId", "eventId"} <= first.keys()
    )


def _lines(handle: Iterable[bytes]) -> Iterator[tuple[int, bytes]]:
    """Non-blank lines with their number, counted from 1."""
    return ((n, line) for n, line in enumerate(handle, start=1) if line.strip())
