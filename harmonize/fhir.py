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
Bundle is one JSON document and is parsed whole). The ids of the records
validated as read are kept, per resource type, to refuse duplicates: about
100 bytes per resource (a record read without validation has an id that
occurs once in the export, found by the first pass at 8 bytes a record).

Validating a resource with ``fhir.resources`` costs about 0.1 ms, which
dominates large exports; NDJSON files may therefore be read by several
processes (``workers``), each taking blocks of lines (:mod:`harmonize.fhir_blocks`)
that it reads itself. The main process takes their decisions in file order,
checks duplicates and writes the store, so the result does not depend on
the number of workers, and only a few blocks per worker are in flight at a
time. Lines are parsed with ``orjson`` (:func:`harmonize.fhir_json.parse_json`).

**Validating what the frame uses.** :func:`read_fhir` validates every
record. A harmonisation run (:func:`harmonize.run.harmonize`) instead reads
with ``FhirReading(..., defer=True)``: an NDJSON Observation or Encounter
of the plain shape of :func:`harmonize.fhir_json.plain_rows` whose id
occurs once in the export is stored with the rows it gives if valid,
flagged ``unvalidated``, without building its ``fhir.resources`` model.
The frame builder names the unvalidated records it relies on (the value it
takes, values it quarantines, the index visit, the outcome event, the last
record of a follow-up; see :mod:`harmonize.frame`), and
:meth:`FhirReading.validate` validates exactly those in full: a valid one
keeps its rows, an invalid one is rejected with the reason
``fhir.resources`` gives, as if read with :func:`read_fhir`, and the frame
is built again without it, until the frame relies on no unvalidated record.
The frame is then the one full validation gives, and every record full
validation would include, exclude or reject is counted the same way, except
an invalid record the frame would not use even if it were valid (an
earlier value, a value outside the windows, a visit other than the index
visit, a record of a patient outside the frame): it is counted as the frame
counts its rows, and never rejected, as a record outside the concept sets
already was. The rejected share of a file (``max_rejected_share``) counts
the rejections found at read and while validating, so a file whose defects
touch only records the frame does not use is not stopped.
"""

from __future__ import annotations

import multiprocessing
import os
from bisect import bisect_right
from collections import Counter, deque
from collections.abc import Collection, Iterable
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa

from harmonize.errors import HarmonizationError
from harmonize.fhir_blocks import (
    Block,
    BlockRead,
    numbered_lines,
    read_block,
    validate_block,
)
from harmonize.fhir_decisions import (
    NOT_USED,
    Decision,
    DeferredRows,
    decide,
    decide_lines,
)
from harmonize.fhir_json import parse_json
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
)
from harmonize.fhir_medications import (
    MedicationIndex,
    PatientIndex,
    Survey,
    bundle_entries,
    load_json_document,
    survey,
)
from harmonize.progress import Progress, ProgressCounter
from harmonize.records import OUTSIDE_CONCEPTS, RecordStore

__all__ = ["NOT_READ", "NOT_USED", "REQUEST_ONLY", "FhirReading", "read_fhir"]

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
_LINE = ":line "
DEFERRED_BATCH_ROWS = 250_000
"""Rows of unvalidated records (compact Arrow tables, about 100 bytes a row) buffered before
they are appended to the store: DuckDB appends large batches at about half the cost a row."""
PARALLEL_MIN_BYTES = 64 * 2**20
"""NDJSON files this large are read by several processes unless ``workers`` says."""
MAX_AUTO_WORKERS = 4
BLOCKS_IN_FLIGHT_PER_WORKER = 3


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
    """Read FHIR R4 Bundles and NDJSON files into ``store``, validating every record.

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
        Processes reading NDJSON lines. ``None``: when an NDJSON file has at
        least 64 MB, the machine's cores (at most 4) for every NDJSON file,
        else this process only; ``1``: this process only; more: that many
        for every NDJSON file.
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
    with FhirReading(
        paths,
        store,
        max_rejected_share=max_rejected_share,
        today=today,
        batch_size=batch_size,
        workers=workers,
        progress=progress,
        concepts=concepts,
    ) as reading:
        reading.read()


def _check_share(path: Path, tally: _Tally, max_rejected_share: float) -> None:
    """Stop the run when ``path`` has more rejected records than ``max_rejected_share``."""
    read = sum(tally.read.values())
    if read and tally.rejected / read > max_rejected_share:
        raise _share_error(path, tally.rejected, read, tally.reasons, max_rejected_share)


def _share_error(
    path: Path | str, rejected: int, read: int, reasons: list[str], max_rejected_share: float
) -> HarmonizationError:
    return HarmonizationError(
        f"{path}: {rejected} of {read} records rejected "
        f"({rejected / read:.1%}, more than max_rejected_share "
        f"{max_rejected_share:.1%}); first reasons: {'; '.join(reasons)}. "
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


class FhirReading:
    """One read of FHIR inputs into a store: row buffers, the ids seen, the workers.

    :meth:`read` reads every input (see :func:`read_fhir`, which is
    ``FhirReading(...).read()``). With ``defer=True`` the plain NDJSON
    Observations and Encounters whose ids occur once are stored unvalidated
    (see the module docstring); :meth:`validate` validates some of them in
    full afterwards, and :meth:`note_unvalidated` records how many never were.
    The worker processes live until the reading is closed (it is a context
    manager), so that validating afterwards does not start them again.
    """

    def __init__(
        self,
        paths: str | Path | Iterable[str | Path],
        store: RecordStore,
        *,
        max_rejected_share: float = 0.10,
        today: date | None = None,
        batch_size: int = 50_000,
        workers: int | None = None,
        progress: Progress | None = None,
        concepts: Iterable[Coding] | None = None,
        defer: bool = False,
    ) -> None:
        if not 0.0 <= max_rejected_share <= 1.0:
            raise ValueError(f"max_rejected_share must be within [0, 1], got {max_rejected_share}")
        if batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {batch_size}")
        if workers is not None and workers < 1:
            raise ValueError(f"workers must be at least 1, got {workers}")
        self.paths = paths
        self.store = store
        self.max_rejected_share = max_rejected_share
        self.today = today or date.today()
        self.batch_size = batch_size
        self.workers = workers
        self.progress = progress
        self.defer = defer
        self.pool: ProcessPoolExecutor | None = None
        self.buffers: dict[str, list[tuple[Any, ...]]] = {name: [] for name in _COLUMNS}
        self.deferred = DeferredRows()
        self.deferred_tables: list[pa.Table] = []
        # Medications are not checked for repeated ids: a Bundle per patient may repeat
        # the same Medication; the index flags one id given with different codes.
        self.seen: dict[str, set[str]] = {name: set() for name in USED_TYPES - {MEDICATION}}
        self.medications = MedicationIndex()
        self.patients = PatientIndex()
        self.concepts: frozenset[Coding] | None = (
            frozenset(concepts) if concepts is not None else None
        )
        self.counter = ProgressCounter(None)
        self.counts = _RunCounts()
        self.tally = _Tally()
        self.found = Survey({}, MedicationIndex())
        self.parallel: dict[Path, int] = {}
        self.by_name: dict[str, Path] = {}
        self.unvalidated: Counter[str] = Counter()
        """Records of each file read without validation and not validated since."""

    def __enter__(self) -> FhirReading:
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

    def _pool(self) -> ProcessPoolExecutor:
        if self.pool is None:
            # spawn: workers must not inherit the store's DuckDB threads and locks
            context = multiprocessing.get_context("spawn")
            workers = max(self.parallel.values())
            self.pool = ProcessPoolExecutor(max_workers=workers, mp_context=context)
        return self.pool

    # ------------------------------------------------------------ the run
    def read(self) -> None:
        """Read every input into the store (see :func:`read_fhir` for the rules and errors)."""
        files = _input_files(self.paths)
        self.by_name = {path.name: path for path in files}
        ndjson = [path for path in files if path.suffix == ".ndjson"]
        self.parallel = {
            path: workers for path in ndjson if (workers := self._workers_for(path)) > 1
        }
        if self.parallel and self.workers is None:  # the pool is started: every file uses it
            self.parallel = dict.fromkeys(ndjson, max(self.parallel.values()))
        block_map = self._guarded(self._pool().map) if self.parallel else map
        found = self.found = survey(
            files, keys=self.defer, in_blocks=self.parallel, block_map=block_map
        )
        self.medications, self.patients = found.medications, found.patients
        counter = self.counter = ProgressCounter(self.progress, found.total)
        counter.report()
        try:
            for number, path in enumerate(files):
                try:
                    _check_share(path, self.read_file(path), self.max_rejected_share)
                except HarmonizationError:
                    left = found.records[path] - sum(self.tally.read.values())
                    if left > 0:  # the file stopped part way (a process died, say)
                        self.store.count_unprocessed(path.name, NOT_READ, left)
                    for later in files[number + 1 :]:
                        if found.records[later]:
                            self.store.count_unprocessed(later.name, NOT_READ, found.records[later])
                    raise
        finally:
            self.write_notes()
        counter.report()

    def _guarded(self, block_map: Any) -> Any:
        """``block_map`` with a dead worker process turned into a HarmonizationError."""

        def guarded(*arguments: Any) -> list[Any]:
            try:
                return list(block_map(*arguments))
            except BrokenProcessPool as error:
                raise _died(error) from None

        return guarded

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

    def note_unvalidated(self) -> None:
        """Note, per file, the records never validated: the frame does not use them."""
        for source, n in sorted(self.unvalidated.items()):
            if n:
                self.store.note(
                    "fhir",
                    f"{source}: {n:,} records not validated with fhir.resources: the "
                    "analysis frame does not use them (each is counted as the frame counts "
                    "its rows)",
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
            raise _died(error) from None
        finally:
            self._flush_all()
            for record_type, n in sorted(tally.read.items()):
                self.store.count_read(source, record_type, n)
            self._write_excluded(source, tally)
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
        blocks = self.found.blocks[path]
        first = next((line for block in blocks for line in numbered_lines(block)), None)
        if first is None:
            return
        if _is_export_log(first[1]):
            n = self.found.records[path]
            tally.read[EXPORT_LOG] += n
            tally.excluded[(EXPORT_LOG, EXPORT_LOG_REASON)] += n
            self.counter.advance(n)
            return
        repeated = self.found.repeated if self.defer else None
        if path not in self.parallel:
            for block in blocks:
                lines = numbered_lines(block)
                for number, decision in decide_lines(
                    lines, source, self.today, repeated, self.deferred
                ):
                    self._apply(source, f"line {number}", decision, tally)
                # deferred records yield no decision: a block of them only is looked at here
                if len(self.deferred) >= self.batch_size:
                    self._take_deferred(source, tally)
            self._take_deferred(source, tally)
            return
        pool, workers = self._pool(), self.parallel[path]
        self.store.note("fhir", f"{source}: validated by {workers} worker processes")
        in_flight: deque[Future[BlockRead]] = deque()
        for block in blocks:
            in_flight.append(pool.submit(read_block, block, source, self.today, repeated))
            if len(in_flight) >= BLOCKS_IN_FLIGHT_PER_WORKER * workers:
                self._apply_block(source, in_flight.popleft().result(), tally)
        while in_flight:
            self._apply_block(source, in_flight.popleft().result(), tally)

    # ------------------------------------------------------------ records
    def _apply_block(self, source: str, result: BlockRead, tally: _Tally) -> None:
        for number, decision in result.decisions:
            self._apply(source, f"line {number}", decision, tally)
        if result.deferred is not None:
            self._store_deferred(source, result.deferred, result.deferred_records, tally)

    def _take_deferred(self, source: str, tally: _Tally) -> None:
        if len(self.deferred):
            table, records = self.deferred.take()
            self._store_deferred(source, table, records, tally)

    def _store_deferred(
        self, source: str, table: pa.Table, records: Counter[str], tally: _Tally
    ) -> None:
        """Count deferred records as read and buffer their (unvalidated) rows."""
        tally.read.update(records)
        n = sum(records.values())
        self.unvalidated[source] += n
        self.counter.advance(n)
        self.deferred_tables.append(table)
        if sum(t.num_rows for t in self.deferred_tables) >= DEFERRED_BATCH_ROWS:
            self._flush_deferred()

    def _apply(self, source: str, location: str, decision: Decision, tally: _Tally) -> None:
        """Count one record and carry out its decision."""
        tally.read[decision.record_type] += 1
        self.counter.advance()
        self._carry_out(source, location, decision, tally)

    def _carry_out(self, source: str, location: str, decision: Decision, tally: _Tally) -> None:
        """Carry out one record's decision, refusing duplicated ids."""
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
            tally.reasons.append(_reason_text(location, record_type, problem))
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

    def _flush_deferred(self) -> None:
        if self.deferred_tables:
            self.store.append("events", pa.concat_tables(self.deferred_tables))
            self.deferred_tables = []

    def _flush_all(self) -> None:
        for table in _COLUMNS:
            self._flush(table)
        self._flush_deferred()

    def _write_excluded(self, source: str, tally: _Tally) -> None:
        for (record_type, reason), n in sorted(tally.excluded.items()):
            self.store.exclude_at_read(source, record_type, reason, n)

    # ------------------------------------------------------------ validating later
    def validate(self, record_refs: Collection[str]) -> bool:
        """Validate in full the unvalidated records ``record_refs`` (``"<file>:line N"``).

        A record that validates to the rows it stood for keeps them (no
        longer ``unvalidated``); any other decision replaces its rows, as if
        it had been validated when read (rejected with the reason
        ``fhir.resources`` gives, say). Returns whether any record's rows
        changed (else the store holds the same rows as before, all validated).

        Raises
        ------
        HarmonizationError
            A file's rejected records now exceed ``max_rejected_share``, or a
            worker process died.
        """
        lines = self._lines_of(record_refs)
        tasks = [
            (path, block, numbers)
            for path, numbers in lines.items()
            for block, numbers in _by_block(self.found.blocks[path], numbers)
        ]
        kept: dict[str, list[int]] = {}
        changed: dict[str, list[tuple[int, Decision]]] = {}
        try:
            if any(path in self.parallel for path, _, _ in tasks):
                pool = self._pool()
                futures = [
                    (path.name, pool.submit(validate_block, block, numbers, path.name, self.today))
                    for path, block, numbers in tasks
                ]
                results = ((source, future.result()) for source, future in futures)
            else:
                results = (
                    (path.name, validate_block(block, numbers, path.name, self.today))
                    for path, block, numbers in tasks
                )
            for source, (same, other) in results:
                kept.setdefault(source, []).extend(same)
                changed.setdefault(source, []).extend(other)
        except BrokenProcessPool as error:
            raise _died(error) from None
        found = sum(len(kept[source]) + len(changed[source]) for source in kept)
        if found != sum(len(set(numbers)) for numbers in lines.values()):
            raise RuntimeError(
                f"validated {found} records of the {len(record_refs)} asked for: "
                "a record reference names no line"
            )
        for source in kept:
            self._apply_validated(source, kept[source], changed[source])
        for source in kept:
            self._check_share_now(source)
        return any(changed.values())

    def _lines_of(self, record_refs: Collection[str]) -> dict[Path, list[int]]:
        lines: dict[Path, list[int]] = {}
        for ref in record_refs:
            source, _, line = ref.rpartition(_LINE)
            path = self.by_name.get(source)
            if path is None or not line.isdigit():
                raise ValueError(f"not a record of this reading: {ref!r}")
            lines.setdefault(path, []).append(int(line))
        return lines

    def _apply_validated(
        self, source: str, kept: list[int], changed: list[tuple[int, Decision]]
    ) -> None:
        """Keep the rows of the records that validated to them; carry out the others' decisions."""
        connection = self.store.connection
        refs = pa.table({"record_ref": [f"{source}:line {n}" for n in kept]})
        connection.register("_validated", refs)
        try:
            connection.execute(
                "UPDATE events SET unvalidated = NULL "
                "WHERE unvalidated AND record_ref IN (SELECT record_ref FROM _validated)"
            )
        finally:
            connection.unregister("_validated")
        if changed:
            gone = pa.table({"record_ref": [f"{source}:line {n}" for n, _ in changed]})
            connection.register("_changed", gone)
            try:
                connection.execute(
                    "DELETE FROM events WHERE record_ref IN (SELECT record_ref FROM _changed)"
                )
            finally:
                connection.unregister("_changed")
        tally = _Tally()
        for number, decision in changed:
            self._carry_out(source, f"line {number}", decision, tally)
        self._flush_all()
        self._write_excluded(source, tally)
        self.unvalidated[source] -= len(kept) + len(changed)

    def _check_share_now(self, source: str) -> None:
        """Stop the run when ``source`` now has more rejected records than the share allows."""
        one = self.store.connection.execute
        counted = one("SELECT coalesce(sum(n), 0) FROM read_counts WHERE source = ?", [source])
        read = int(counted.fetchone()[0])
        rows = one(
            "SELECT location, record_type, field, reason, detail FROM rejected WHERE source = ?",
            [source],
        ).fetchall()
        if read and len(rows) / read > self.max_rejected_share:
            reasons = [
                _reason_text(location, record_type, Rejection(field_, reason, detail))
                for location, record_type, field_, reason, detail in rows[:_FIRST_REASONS]
            ]
            raise _share_error(
                self.by_name[source], len(rows), read, reasons, self.max_rejected_share
            )


def _by_block(blocks: list[Block], numbers: list[int]) -> list[tuple[Block, list[int]]]:
    """``numbers`` (line numbers) grouped by the block that holds each, in file order."""
    firsts = [block.first_line for block in blocks]
    grouped: dict[int, list[int]] = {}
    for line in sorted(set(numbers)):
        grouped.setdefault(bisect_right(firsts, line) - 1, []).append(line)
    return [(blocks[index], lines) for index, lines in sorted(grouped.items())]


def _reason_text(location: str, record_type: str, problem: Rejection) -> str:
    where = f"{location} ({record_type}{', ' + problem.field if problem.field else ''})"
    shown = f" ({problem.detail})" if problem.detail else ""
    return f"{where}: {problem.reason}{shown}"


def _died(error: BaseException) -> HarmonizationError:
    return HarmonizationError(
        f"a reading process died ({error}); rerun with workers=1 (--workers 1) or with more memory"
    )


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


def _is_export_log(line: bytes) -> bool:
    """A Bulk Data export log line (``log.ndjson``): ``exportId`` and ``eventId``, no type."""
    try:
        first = parse_json(line)
    except (ValueError, RecursionError):
        return False
    return (
        isinstance(first, dict)
        and "resourceType" not in first
        and {"exportId", "eventId"} <= first.keys()
    )
