"""Reading a study directory (:mod:`reports.layout`) into plain, checked records.

:meth:`Study.load` reads every file once: the manifest, the specification
and configuration (checked against the SHA-256 the manifest recorded), each
ledger's scopes with their spending (``Ledger.spent``), entries and hash-chain
verification, the message inventory, the harmonisation reports, the fits,
survival curves, audits, diagnostics and record linkages (``linkages/<id>.json``).
Anything unreadable raises a :class:`~reports.errors.StudyRecordError` naming the file;
a folder that is not a study directory raises :class:`~reports.errors.StudyDirectoryError`.
Absent optional parts (no inventory, no audit, no ``curves/`` in a study
recorded before curves existed) load as empty.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from os import PathLike
from pathlib import Path
from typing import Any, TypeVar

import accounting
from harmonize.errors import HarmonizationError
from harmonize.report import HarmonizationReport
from reports.errors import StudyDirectoryError, StudyRecordError
from reports.layout import StudyLayout
from reports.records import (
    AuditRecord,
    CurveFitRecord,
    DiagnosticRecord,
    FitRecord,
    LinkageRecord,
    Manifest,
    ReleaseRecord,
    parse_record,
)
from studyfiles.durable import file_sha256
from studyfiles.errors import InventoryFileError
from studyfiles.inventory import MessageInventory

Named = TypeVar("Named", FitRecord, CurveFitRecord, ReleaseRecord)


@dataclass(frozen=True)
class ScopeRecord:
    """One scope of one ledger: its budget and spending, and every entry, oldest first."""

    ledger: Path
    scope: accounting.Scope
    spent: accounting.Spent
    entries: tuple[accounting.Entry, ...]


@dataclass(frozen=True)
class LedgerRecord:
    """One ledger file: its verification (hash chain, curves) and its scopes."""

    path: Path
    verification: accounting.VerifyReport
    scopes: tuple[ScopeRecord, ...]


@dataclass(frozen=True)
class Study:
    """Everything recorded about one study, as read from its directory."""

    directory: Path
    manifest: Manifest
    spec_text: str
    configuration: dict[str, Any]
    ledgers: tuple[LedgerRecord, ...]
    inventory: MessageInventory | None
    harmonization: dict[str, HarmonizationReport]
    fits: tuple[FitRecord, ...]
    audits: dict[str, AuditRecord]
    diagnostics: dict[str, DiagnosticRecord]
    curves: tuple[CurveFitRecord, ...] = ()
    """Recorded Kaplan–Meier fits, in the manifest's order."""
    releases: tuple[ReleaseRecord, ...] = ()
    """Other recorded releases (trained networks, metrics, tables), in the manifest's order."""
    recorded_heads: tuple[accounting.ChainHead, ...] = ()
    """The sites' ledger chain heads the coordinator recorded from their private replies
    (``ledger-heads.json``; empty for a study recorded without one)."""
    linkages: tuple[LinkageRecord, ...] = ()
    """The record linkages the linkage unit recorded (``linkages/<id>.json``), by file name."""

    @property
    def scopes(self) -> list[ScopeRecord]:
        """Every scope of every ledger, ledgers in file-name order."""
        return [scope for ledger in self.ledgers for scope in ledger.scopes]

    def fit(self, name: str) -> FitRecord:
        for fit in self.fits:
            if fit.name == name:
                return fit
        raise KeyError(name)

    def curve(self, name: str) -> CurveFitRecord:
        for curve in self.curves:
            if curve.name == name:
                return curve
        raise KeyError(name)

    @classmethod
    def load(cls, directory: str | PathLike[str]) -> Study:
        """Read the study directory ``directory``."""
        layout = StudyLayout(Path(directory))
        if not layout.root.is_dir():
            raise StudyDirectoryError(layout.root, "no such folder")
        if not layout.manifest.is_file():
            raise StudyDirectoryError(layout.root, "it holds no study.json")
        manifest = parse_record(Manifest, layout.manifest)
        for name, path in (
            ("spec.toml", layout.spec),
            ("configuration.json", layout.configuration),
        ):
            _check_hash(path, manifest.hashes.get(name), layout.manifest)
        spec_text = _read_text(layout.spec)
        configuration = _read_json_object(layout.configuration)
        fits = _read_named(FitRecord, layout.fits, manifest.fits)
        curves = _read_named(CurveFitRecord, layout.curves, manifest.curves)
        return cls(
            directory=layout.root,
            manifest=manifest,
            spec_text=spec_text,
            configuration=configuration,
            ledgers=tuple(_read_ledger(p) for p in sorted(layout.ledgers.glob("*.ledger"))),
            inventory=_read_inventory(layout.inventory),
            harmonization=_read_harmonization(layout.harmonization),
            fits=fits,
            audits={
                p.stem: parse_record(AuditRecord, p) for p in sorted(layout.audits.glob("*.json"))
            },
            diagnostics={
                p.stem: parse_record(DiagnosticRecord, p)
                for p in sorted(layout.diagnostics.glob("*.json"))
            },
            curves=curves,
            releases=_read_named(ReleaseRecord, layout.releases, manifest.releases),
            recorded_heads=_read_heads(
                layout.ledger_heads, manifest.hashes.get("ledger-heads.json")
            ),
            linkages=_read_linkages(layout.linkages),
        )


def _read_named(model: type[Named], folder: Path, names: list[str]) -> tuple[Named, ...]:
    """``folder/<name>.json`` for each name the manifest lists, in its order, each checked to
    hold its own name."""
    records = []
    for name in names:
        path = folder / f"{name}.json"
        record = parse_record(model, path)
        if record.name != name:
            raise StudyRecordError(path, f"field name: {record.name!r}, expected {name!r}")
        records.append(record)
    return tuple(records)


def _read_linkages(folder: Path) -> tuple[LinkageRecord, ...]:
    """Every ``folder/<linkage_id>.json``, in file-name order, each checked to hold its own id."""
    records = []
    for path in sorted(folder.glob("*.json")):
        record = parse_record(LinkageRecord, path)
        if record.linkage_id != path.stem:
            raise StudyRecordError(
                path, f"field linkage_id: {record.linkage_id!r}, expected {path.stem!r}"
            )
        records.append(record)
    return tuple(records)


def _check_hash(path: Path, recorded: str | None, manifest: Path) -> None:
    if recorded is None:
        raise StudyRecordError(manifest, f"field hashes.{path.name}: missing")
    if not path.is_file():
        raise StudyRecordError(path, "file missing")
    actual = file_sha256(path)
    if actual != recorded:
        raise StudyRecordError(
            path,
            f"SHA-256 {actual[:16]}... differs from the {recorded[:16]}... recorded in "
            f"{manifest.name}: the file changed after the study was recorded",
        )


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise StudyRecordError(path, f"cannot be read ({error})") from None


def _read_json_object(path: Path) -> dict[str, Any]:
    try:
        value = json.loads(_read_text(path))
    except (json.JSONDecodeError, RecursionError) as error:
        raise StudyRecordError(path, f"not JSON ({error})") from None
    if not isinstance(value, dict):
        raise StudyRecordError(path, f"expected a JSON object, got {type(value).__name__}")
    return value


def _read_ledger(path: Path) -> LedgerRecord:
    try:
        with accounting.Ledger(path) as ledger:
            verification = ledger.verify()
            scopes = tuple(
                ScopeRecord(path, scope, ledger.spent(scope), tuple(ledger.entries(scope)))
                for scope in ledger.scopes()
            )
    except accounting.AccountingError as error:
        raise StudyRecordError(path, f"not a readable ledger ({error})") from None
    return LedgerRecord(path, verification, scopes)


def _read_heads(path: Path, recorded: str | None) -> tuple[accounting.ChainHead, ...]:
    """The chain heads in ``ledger-heads.json``, checked against the manifest's SHA-256."""
    if recorded is None:
        return ()
    _check_hash(path, recorded, path.parent / "study.json")
    try:
        values = json.loads(_read_text(path))
        if not isinstance(values, list):
            raise ValueError(f"expected a JSON list, got {type(values).__name__}")
        return tuple(accounting.ChainHead.from_record(value) for value in values)
    except (ValueError, RecursionError) as error:
        raise StudyRecordError(path, f"not a list of chain heads ({error})") from None


def _read_inventory(path: Path) -> MessageInventory | None:
    if not path.exists():
        return None
    try:
        return MessageInventory.load(path)
    except InventoryFileError as error:
        raise StudyRecordError(path, str(error)) from None


def _read_harmonization(folder: Path) -> dict[str, HarmonizationReport]:
    reports = {}
    for path in sorted(folder.glob("*.json")):
        try:
            reports[path.stem] = HarmonizationReport.read_json(path)
        except HarmonizationError as error:
            raise StudyRecordError(path, str(error)) from None
    return reports
