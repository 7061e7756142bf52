"""The harmonisation report: what became of every input record, and the site fingerprint.

Totals satisfy ``read = included + excluded + rejected + unprocessed``: a
record is rejected (invalid, quarantined with its reason), excluded (valid
but not used, with the reason: outside the concept sets of the study, a
resource type the study does not use, a patient not in the frame, ...),
included (used in the analysis frame), or unprocessed: a run that stopped (a
file over ``max_rejected_share``) did not read it (``not_read``: the files
after the stop, counted by the reader's first pass) or did not classify it
(records already mapped to rows when the run stopped before building the
frame). ``read`` counts every input record of the sources, read or not
(``read - not_read`` were read). :meth:`HarmonizationReport.check_balance`
raises :class:`UnbalancedReport` when the totals or the per-reason tables do
not add up; the run calls it before it returns or raises any report.
Rejections are counted by the kind of problem (``rejected_by_reason``; the
reason never holds a file name or a value), with the first record of each
kind in ``rejected_examples`` and every record in the quarantine. The report
also gives the cohort's exclusions, the coding coverage, the unit
conversions applied, the readers' notes, missingness and value ranges per
column, and the site fingerprint the coordinator compares across sites.
``not_validated`` counts the records read without validation that the frame
never relied on (FHIR NDJSON Observations and Encounters, see
:mod:`harmonize.fhir`): they are among the excluded, counted as the frame
counts their rows (or unprocessed, when a run stops).
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import MISSING, asdict, dataclass, field, fields
from datetime import UTC, datetime
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import pandas as pd

from harmonize.errors import HarmonizationError
from harmonize.fingerprint import SiteFingerprint

_FIELD_TYPES: dict[str, tuple[type, ...]] = {
    "site": (str,),
    "source_kind": (str,),
    "sources": (list,),
    "study": (str,),
    "spec_digest": (str,),
    "status": (str,),
    "read": (int,),
    "included": (int,),
    "excluded": (int,),
    "rejected": (int,),
    "unprocessed": (int,),
    "not_read": (int,),
    "not_validated": (int,),
    "read_by_type": (dict,),
    "excluded_by_reason": (dict,),
    "rejected_by_reason": (dict,),
    "rejected_examples": (dict,),
    "unprocessed_by_reason": (dict,),
    "cohort_exclusions": (dict,),
    "patients": (int,),
    "coding_coverage": (int, float, type(None)),
    "unit_conversions": (list,),
    "notes": (list,),
    "columns": (dict,),
    "fingerprint": (dict,),
    "data_sha256": (str,),
    "identifiers_missing": (dict,),
    "failure": (str, type(None)),
    "created_at": (str,),
    "package_version": (str,),
}
"""JSON types of each field as :meth:`HarmonizationReport.to_dict` writes them."""


class UnbalancedReport(AssertionError):
    """A report whose counts do not add up: a record disappeared (a defect of the reader)."""


@dataclass
class HarmonizationReport:
    site: str
    source_kind: str  # "fhir" or "omop"
    sources: list[str]
    study: str
    spec_digest: str
    status: str  # "ok", "empty cohort" or "failed"
    read: int = 0
    included: int = 0
    excluded: int = 0
    rejected: int = 0
    unprocessed: int = 0
    not_read: int = 0
    not_validated: int = 0
    read_by_type: dict[str, int] = field(default_factory=dict)
    excluded_by_reason: dict[str, int] = field(default_factory=dict)
    rejected_by_reason: dict[str, int] = field(default_factory=dict)
    rejected_examples: dict[str, str] = field(default_factory=dict)
    unprocessed_by_reason: dict[str, int] = field(default_factory=dict)
    cohort_exclusions: dict[str, int] = field(default_factory=dict)
    patients: int = 0
    coding_coverage: float | None = None
    unit_conversions: list[dict] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    columns: dict[str, dict[str, Any]] = field(default_factory=dict)
    fingerprint: dict[str, Any] = field(default_factory=dict)
    data_sha256: str = ""
    """SHA-256 of the frame's rows (:func:`harmonize.fingerprint.frame_data_digest`): unlike
    the fingerprint, which describes the schema and is the same at every site, it identifies
    this site's data ("" in reports that predate it or of a run that built no frame)."""
    identifiers_missing: dict[str, int] = field(default_factory=dict)
    """Per identifier column, how many of the frame's patients lack it (counts only; empty
    when the study has no ``[linkage]`` table): see :mod:`harmonize.identifiers`."""
    failure: str | None = None
    created_at: str = field(default_factory=lambda: datetime.now(UTC).isoformat())
    package_version: str = field(default_factory=lambda: _package_version())

    @property
    def balanced(self) -> bool:
        """``read == included + excluded + rejected + unprocessed``: no record disappeared."""
        return self.read == self.included + self.excluded + self.rejected + self.unprocessed

    def check_balance(self) -> None:
        """Raise :class:`UnbalancedReport` unless every count adds up.

        ``read = included + excluded + rejected + unprocessed``; the reason
        tables sum to their totals (``excluded_by_reason`` to ``excluded``,
        ``rejected_by_reason`` to ``rejected``, ``unprocessed_by_reason`` to
        ``unprocessed``); ``not_read`` is part of ``unprocessed``; and the
        records read by type are the records read, ``read - not_read``.
        """
        problems = []
        if not self.balanced:
            problems.append(
                f"read {self.read} != included {self.included} + excluded {self.excluded} "
                f"+ rejected {self.rejected} + unprocessed {self.unprocessed}"
            )
        for name, table, total in (
            ("excluded_by_reason", self.excluded_by_reason, self.excluded),
            ("rejected_by_reason", self.rejected_by_reason, self.rejected),
            ("unprocessed_by_reason", self.unprocessed_by_reason, self.unprocessed),
            ("read_by_type", self.read_by_type, self.read - self.not_read),
        ):
            if sum(table.values()) != total:
                problems.append(f"{name} sums to {sum(table.values())}, not {total}")
        if not 0 <= self.not_read <= self.unprocessed:
            problems.append(f"not_read {self.not_read} is not within [0, {self.unprocessed}]")
        if not 0 <= self.not_validated <= self.excluded + self.unprocessed:
            problems.append(
                f"not_validated {self.not_validated} is not within "
                f"[0, excluded {self.excluded} + unprocessed {self.unprocessed}]"
            )
        if problems:
            raise UnbalancedReport(
                f"harmonisation report of site {self.site!r} does not balance: "
                + "; ".join(problems)
            )

    def site_fingerprint(self) -> SiteFingerprint:
        return SiteFingerprint.from_record(self.fingerprint)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "balanced": self.balanced}

    @classmethod
    def from_dict(cls, record: Any) -> HarmonizationReport:
        """The report :meth:`to_dict` wrote; ``HarmonizationError`` names a wrong or missing field.

        ``balanced`` is recomputed, never read.
        """
        if not isinstance(record, dict):
            raise HarmonizationError(
                f"a harmonisation report is a JSON object, got {type(record).__name__}"
            )
        names = {f.name for f in fields(cls)}
        required = {
            f.name for f in fields(cls) if f.default is MISSING and f.default_factory is MISSING
        }
        missing = sorted(required - set(record))
        if missing:
            raise HarmonizationError(f"harmonisation report: missing fields {missing}")
        unknown = sorted(set(record) - names - {"balanced"})
        if unknown:
            raise HarmonizationError(f"harmonisation report: unknown fields {unknown}")
        for name, value in record.items():
            if name == "balanced":
                continue
            allowed = _FIELD_TYPES[name]
            if (isinstance(value, bool) and bool not in allowed) or not isinstance(value, allowed):
                kinds = " or ".join(t.__name__ for t in allowed)
                raise HarmonizationError(
                    f"harmonisation report: field {name!r} must be {kinds}, "
                    f"got {type(value).__name__}"
                )
        return cls(**{k: v for k, v in record.items() if k != "balanced"})

    @classmethod
    def read_json(cls, path: str | Path) -> HarmonizationReport:
        """Read a report written by :meth:`write_json`; errors name the file."""
        path = Path(path)
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as error:
            raise HarmonizationError(
                f"cannot read the harmonisation report {path}: {error}"
            ) from None
        try:
            return cls.from_dict(record)
        except HarmonizationError as error:
            raise HarmonizationError(f"{path}: {error}") from None

    def write_json(self, path: str | Path) -> None:
        Path(path).write_text(
            json.dumps(self.to_dict(), indent=2, default=str) + "\n", encoding="utf-8"
        )

    def to_text(self) -> str:
        """A readable summary for site data engineers."""
        total = (
            f"  records {self.read:,}, of which read {self.read - self.not_read:,} and not read "
            f"{self.not_read:,} (the run stopped before their files)"
            if self.not_read
            else f"  records read {self.read:,}"
        )
        lines = [
            f"Harmonisation of site {self.site!r} ({self.source_kind}) for study "
            f"{self.study!r} [{self.spec_digest[:12]}]: {self.status}",
            f"{total} = included {self.included:,} + excluded "
            f"{self.excluded:,} + rejected {self.rejected:,}"
            + (f" + unprocessed {self.unprocessed:,}" if self.unprocessed else "")
            + ("" if self.balanced else "   (NOT BALANCED)"),
            f"  patients in the analysis frame: {self.patients:,}",
        ]
        if self.not_validated:
            lines.append(
                f"  not validated with fhir.resources: {self.not_validated:,} of the excluded "
                "records (the frame does not use them)"
            )
        if self.failure:
            lines.append(f"  failure: {self.failure}")
        if self.identifiers_missing:
            missing = ", ".join(f"{k} {n:,}" for k, n in self.identifiers_missing.items())
            lines.append(f"  identifiers missing (patients): {missing}")
        for title, counts in (
            ("read by type", self.read_by_type),
            ("excluded by reason", self.excluded_by_reason),
            ("rejected by reason", self.rejected_by_reason),
            ("unprocessed by reason", self.unprocessed_by_reason),
            ("cohort exclusions (patients)", self.cohort_exclusions),
        ):
            if counts:
                lines.append(f"  {title}:")
                lines += [
                    f"    {n:>10,}  {k}" + self._example(title, k)
                    for k, n in sorted(counts.items(), key=lambda kv: -kv[1])
                ]
        if self.coding_coverage is not None:
            lines.append(
                f"  coding coverage: {self.coding_coverage:.1%} of clinical records "
                "carry a known terminology code or an OMOP concept"
            )
        for conversion in self.unit_conversions:
            lines.append(
                f"  unit conversion for {conversion['covariate']}: "
                f"{conversion['from']} -> {conversion['to']} "
                f"({conversion['records']} records)"
            )
        if self.notes:
            lines.append("  notes:")
            lines += [f"    {note}" for note in self.notes]
        if self.columns:
            lines.append("  columns:")
            for name, stats in self.columns.items():
                described = ", ".join(f"{k} {v}" for k, v in stats.items())
                lines.append(f"    {name}: {described}")
        return "\n".join(lines)

    def _example(self, title: str, reason: str) -> str:
        example = self.rejected_examples.get(reason) if title == "rejected by reason" else None
        return f"  (first: {example}; all in quarantine.csv)" if example else ""


def column_summary(frame: pd.DataFrame) -> dict[str, dict[str, Any]]:
    """Missing values and range (numeric) or level counts (categorical) per column."""
    out: dict[str, dict[str, Any]] = {}
    for name in frame.columns:
        column = frame[name]
        stats: dict[str, Any] = {"missing": int(column.isna().sum())}
        if isinstance(column.dtype, pd.CategoricalDtype):
            stats["levels"] = {str(k): int(v) for k, v in column.value_counts().items()}
        elif pd.api.types.is_numeric_dtype(column) and column.notna().any():
            values = column.dropna().astype(float)
            stats.update(
                min=round(float(values.min()), 4),
                max=round(float(values.max()), 4),
                mean=round(float(values.mean()), 4),
            )
        out[str(name)] = stats
    return out


def counts_by(frame: pd.DataFrame, key: str, weight: str = "n") -> dict[str, int]:
    counter: Counter = Counter()
    for value, n in zip(frame[key], frame[weight], strict=True):
        counter[str(value)] += int(n)
    return dict(counter)


def _package_version() -> str:
    try:
        return version("fedstats")
    except PackageNotFoundError:
        return "unknown"
