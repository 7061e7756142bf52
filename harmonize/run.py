"""One site's harmonisation run: read the sources, build the frame, report everything.

:func:`harmonize` reads a FHIR or an OMOP source into a record store, builds
the analysis frame of the study specification, and returns the frame (with
its fingerprint in ``frame.attrs["fingerprint"]``), the report and the
quarantine. A failure still yields a report and the quarantine so far: both
are attached to the raised :class:`HarmonizationFailed`, and the report's
counts balance like a successful run's (checked by
:meth:`HarmonizationReport.check_balance` before either is returned).
:func:`write_outputs` writes the frame (Parquet), the report (JSON and
text) and the quarantine (CSV); :func:`write_failed_outputs` the report and
the quarantine of a failed run.
"""

from __future__ import annotations

from collections.abc import Iterable
from contextlib import ExitStack
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import TYPE_CHECKING

import pandas as pd

from harmonize.errors import HarmonizationError, HarmonizationFailed
from harmonize.fingerprint import FINGERPRINT_ATTR, fingerprint_frame, frame_data_digest
from harmonize.frame import HARMONIZE, FrameResult, build_frame, coding_coverage
from harmonize.identifiers import NO_NAMES, missing_counts
from harmonize.progress import Progress
from harmonize.records import RecordStore
from harmonize.report import HarmonizationReport, column_summary, counts_by
from harmonize.spec import StudySpec

if TYPE_CHECKING:
    from harmonize.fhir import FhirReading


@dataclass
class Harmonized:
    """A run's analysis frame, report and quarantine.

    ``identifiers``: the identifier table of the frame's patients (same
    index; see :mod:`harmonize.identifiers`) when the study has a
    ``[linkage]`` table, else None. It stays at the site: it is not written
    by :func:`write_outputs` and not shown in this object's ``repr``.
    """

    frame: pd.DataFrame
    report: HarmonizationReport
    quarantine: pd.DataFrame
    identifiers: pd.DataFrame | None = field(default=None, repr=False)


def harmonize(
    spec: StudySpec,
    *,
    site: str,
    fhir: str | Path | Iterable[str | Path] | None = None,
    omop: str | Path | None = None,
    store_path: str | Path | None = None,
    max_rejected_share: float = 0.10,
    latest_date: date | None = None,
    memory_limit: str | None = "1GB",
    workers: int | None = None,
    progress: Progress | None = None,
    validate_all: bool = False,
) -> Harmonized:
    """Harmonise one site's FHIR (``fhir=``) or OMOP (``omop=``) data under ``spec``.

    ``latest_date``: records dated after it are rejected as future dates
    (default: today). A de-identified source whose dates are shifted into the
    future (MIMIC-IV shifts them into 2100-2200) sets a later date.

    The record store lives in ``store_path`` (a DuckDB file kept afterwards)
    or else in a temporary file removed at the end; ``memory_limit`` caps
    what DuckDB holds in memory (it spills to disk beyond), so the memory a
    run needs does not grow with the site's data. ``workers``: processes
    reading large FHIR NDJSON files (see :func:`harmonize.fhir.read_fhir`).

    FHIR NDJSON Observations and Encounters of a plain shape are validated
    with ``fhir.resources`` when the frame relies on them (see
    :mod:`harmonize.fhir`): the frame is the one full validation gives, and
    such a record that is not valid FHIR but that the frame would not use
    even if it were valid is counted as the frame counts its rows instead
    of rejected. ``validate_all=True`` validates every record as it
    is read (slower: about 0.1 ms per resource).

    ``progress``: called as ``progress(done, total)`` while the source is
    read, with the input records processed so far and their total when it is
    known (FHIR: counted in a first pass, reported every 1,000 records; OMOP:
    the final count only, since DuckDB reads each table in one statement); see
    :class:`harmonize.progress.Progress`. Default: silent.

    A study with a ``[linkage]`` table also gets the identifier table of the
    frame's patients (``Harmonized.identifiers``, read back from their
    Patient or person records after the frame is built: see
    :mod:`harmonize.identifiers_fhir` and :mod:`harmonize.identifiers_omop`)
    and, in the report, the count of patients missing each identifier. A
    study without one reads and keeps no identifier.

    If the run stops (e.g. a file over ``max_rejected_share``), the report of
    the raised :class:`HarmonizationFailed` counts as ``unprocessed`` the
    records not read and those read but not classified, so that it balances.
    """
    if (fhir is None) == (omop is None):
        raise HarmonizationError("give exactly one source: fhir=PATH(S) or omop=PATH")
    kind = "fhir" if fhir is not None else "omop"
    sources = (
        [str(p) for p in ([fhir] if isinstance(fhir, str | Path) else fhir)]
        if fhir is not None
        else [str(omop)]
    )
    report = HarmonizationReport(
        site=site,
        source_kind=kind,
        sources=sources,
        study=spec.study.name,
        spec_digest=spec.digest,
        status="failed",
    )
    identifiers: pd.DataFrame | None = None
    with ExitStack() as stack:
        if store_path is None:
            folder = stack.enter_context(TemporaryDirectory(prefix="fedstats-store-"))
            store_path = Path(folder) / "records.duckdb"
        store = stack.enter_context(RecordStore(store_path, memory_limit=memory_limit))
        try:
            if fhir is not None:
                from harmonize.fhir import FhirReading

                reading = stack.enter_context(
                    FhirReading(
                        fhir,
                        store,
                        max_rejected_share=max_rejected_share,
                        today=latest_date,
                        workers=workers,
                        progress=progress,
                        concepts=_study_codings(spec),
                        defer=not validate_all,
                    )
                )
                reading.read()
                result = _build_validated_frame(store, spec, reading)
                if spec.linkage is not None:
                    from harmonize.identifiers_fhir import fhir_identifiers

                    identifiers = fhir_identifiers(store, result.frame.index, reading.by_name)
            else:
                from harmonize.omop import read_omop

                read_omop(omop, store, max_rejected_share=max_rejected_share, today=latest_date)
                if progress is not None:
                    read = store.totals()["read"]
                    progress(read, read)
                result = build_frame(store, spec)
                if spec.linkage is not None:
                    identifiers = _omop_identifiers(spec, omop, store, result.frame.index)
        except HarmonizationError as error:
            _fill_read_side(report, store)
            _count_unclassified(report, store)
            report.failure = str(error)
            quarantine = store.table("rejected")
            _fill_rejected(report, quarantine)
            report.check_balance()
            raise HarmonizationFailed(str(error), report, quarantine) from error
        _fill_read_side(report, store)
        status = result.record_status
        reader_rejected = report.rejected
        report.included = int(status.loc[status["status"] == "included", "n"].sum())
        excluded = status[status["status"] == "excluded"]
        report.excluded += int(excluded["n"].sum())
        for reason, n in counts_by(excluded, "reason").items():
            report.excluded_by_reason[reason] = report.excluded_by_reason.get(reason, 0) + n
        built_rejected = int(status.loc[status["status"] == "rejected", "n"].sum())
        report.rejected = reader_rejected + built_rejected
        quarantine = store.table("rejected")
        _fill_rejected(report, quarantine)
        report.cohort_exclusions = dict(result.cohort_exclusions)
        report.coding_coverage = coding_coverage(store)
        report.unit_conversions = result.conversions
        frame = result.frame
        report.patients = len(frame)
        report.columns = column_summary(frame)
        units = {c.name: c.unit for c in spec.covariates if c.unit}
        fingerprint = fingerprint_frame(frame, units=units, spec_digest=spec.digest)
        report.fingerprint = fingerprint.as_record()
        report.data_sha256 = frame_data_digest(frame)
        frame.attrs[FINGERPRINT_ATTR] = fingerprint.as_record()
        if identifiers is not None:
            report.identifiers_missing = missing_counts(identifiers)
            if kind == "omop" and not _omop_names(spec):
                report.notes.append(NO_NAMES)
        report.status = "ok" if len(frame) else "empty cohort"
        report.check_balance()
    return Harmonized(frame=frame, report=report, quarantine=quarantine, identifiers=identifiers)


def _omop_names(spec: StudySpec) -> bool:
    """Whether the study says OMOP ``person_source_value`` holds the patient's name."""
    return spec.identifiers is not None and spec.identifiers.omop_names == "person_source_value"


def _omop_identifiers(
    spec: StudySpec, omop: str | Path, store: RecordStore, patients: pd.Index
) -> pd.DataFrame:
    from harmonize.identifiers_omop import omop_identifiers

    return omop_identifiers(omop, store, patients, names_from_source_value=_omop_names(spec))


UNCLASSIFIED = "read and mapped to rows, not classified: the run stopped before the frame"
"""Why records a stopped run had already mapped are neither included nor excluded."""


def _build_validated_frame(
    store: RecordStore, spec: StudySpec, reading: FhirReading
) -> FrameResult:
    """Build the frame, validating the unvalidated records it relies on, until it relies on none.

    Each round validates every record the frame relies on; a record that
    fails is rejected and its rows removed, and the frame is built again
    (see :mod:`harmonize.frame` for why the result is the frame of the
    valid records). Each round validates records never validated before, so
    the rounds end. When every record validates to the rows that stood for
    it, the store holds the rows it held and the frame stands as built.
    """
    result = build_frame(store, spec)
    while result.unvalidated_relied_on:
        try:
            changed = reading.validate(result.unvalidated_relied_on)
        except HarmonizationError:
            # no frame comes of this run: its records are unclassified, none rejected here
            store.connection.execute(f"DELETE FROM rejected WHERE source = '{HARMONIZE}'")
            raise
        if changed:
            result = build_frame(store, spec)
        else:
            result.unvalidated_relied_on = []
    reading.note_unvalidated()
    return result


def _study_codings(spec: StudySpec) -> frozenset[tuple[str, str]]:
    """Every ``(system, code)`` of the study's concept sets: what a FHIR record may match."""
    return frozenset().union(*(s.codings() for s in spec.concept_sets.values()))


def _fill_rejected(report: HarmonizationReport, quarantine: pd.DataFrame) -> None:
    """Rejected records by reason, and the first record of each reason (``source:location``)."""
    report.rejected_by_reason = {}
    report.rejected_examples = {}
    records = quarantine.drop_duplicates(["source", "location"])  # one reason per record
    for reason, source, location in zip(
        records["reason"], records["source"], records["location"], strict=True
    ):
        key = str(reason)
        report.rejected_by_reason[key] = report.rejected_by_reason.get(key, 0) + 1
        report.rejected_examples.setdefault(key, f"{source}:{location}")


def _fill_read_side(report: HarmonizationReport, store: RecordStore) -> None:
    read = store.table("read_counts")
    not_read = store.table("unprocessed")
    report.unprocessed = int(not_read["n"].sum()) if not not_read.empty else 0
    report.not_read = report.unprocessed
    report.unprocessed_by_reason = counts_by(not_read, "reason") if not not_read.empty else {}
    report.read = (int(read["n"].sum()) if not read.empty else 0) + report.unprocessed
    report.read_by_type = counts_by(read, "record_type") if not read.empty else {}
    at_read = store.table("excluded_at_read")
    report.excluded = int(at_read["n"].sum()) if not at_read.empty else 0
    report.excluded_by_reason = counts_by(at_read, "reason") if not at_read.empty else {}
    report.notes = store.notes()
    report.not_validated = store.unvalidated()
    rejected = store.table("rejected")
    report.rejected = int((rejected["source"] != HARMONIZE).sum()) if not rejected.empty else 0


def _count_unclassified(report: HarmonizationReport, store: RecordStore) -> None:
    """Count as unprocessed the records a stopped run mapped to rows but never classified."""
    represented = store.represented()
    if represented:
        report.unprocessed += represented
        report.unprocessed_by_reason[UNCLASSIFIED] = represented


def write_outputs(result: Harmonized, out_dir: str | Path) -> dict[str, Path]:
    """Write ``frame.parquet``, ``report.json``, ``report.txt`` and ``quarantine.csv``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {
        "frame": out / "frame.parquet",
        "report_json": out / "report.json",
        "report_text": out / "report.txt",
        "quarantine": out / "quarantine.csv",
    }
    result.frame.to_parquet(paths["frame"])
    write_report(result.report, out)
    result.quarantine.to_csv(paths["quarantine"], index=False)
    return paths


def write_failed_outputs(failed: HarmonizationFailed, out_dir: str | Path) -> dict[str, Path]:
    """Write a failed run's ``report.json``, ``report.txt`` and ``quarantine.csv`` (no frame)."""
    out = Path(out_dir)
    write_report(failed.report, out)
    paths = {
        "report_json": out / "report.json",
        "report_text": out / "report.txt",
        "quarantine": out / "quarantine.csv",
    }
    quarantine = failed.quarantine if failed.quarantine is not None else _empty_quarantine()
    quarantine.to_csv(paths["quarantine"], index=False)
    return paths


def _empty_quarantine() -> pd.DataFrame:
    with RecordStore() as store:
        return store.table("rejected")


def write_report(report: HarmonizationReport, out_dir: str | Path) -> None:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    report.write_json(out / "report.json")
    (out / "report.txt").write_text(report.to_text() + "\n", encoding="utf-8")
