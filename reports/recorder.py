"""Writing a study directory: the recorded facts a compliance report is built from.

A coordinator (or a notebook) creates a :class:`StudyRecorder`, opens each
owner's ledger through it (so the ledgers live in the study directory),
records the specification, the run configuration, each site's harmonisation
report, each fit and survival curve, the message inventory and any audits or
diagnostics, and
calls :meth:`StudyRecorder.finish`, which writes the manifest
``study.json`` with the package versions and the SHA-256 of the
specification and the configuration. The layout is described in
:mod:`reports.layout`.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import platform
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from os import PathLike
from pathlib import Path
from typing import Any, Protocol

import pandas as pd

import accounting
from harmonize.report import HarmonizationReport
from reports.errors import RecordingError
from reports.layout import FORMAT, StudyLayout, checked_name
from studyfiles.durable import file_sha256
from studyfiles.fit_records import (
    checked_curve_record,
    checked_release_record,
    checked_result_record,
)
from studyfiles.inventory import MessageInventory


class RecordableResult(Protocol):
    """A fitted model's results that can be written as a fit or curve record."""

    def to_record(self) -> dict[str, Any]: ...


PACKAGES = (
    "fedstats",
    "numpy",
    "scipy",
    "pandas",
    "statsmodels",
    "dp-accounting",
    "duckdb",
    "fhir.resources",
    "cryptography",
    "jinja2",
    "weasyprint",
    "matplotlib",
)
"""Packages whose installed versions the manifest records."""


def package_versions() -> dict[str, str]:
    """Installed versions of :data:`PACKAGES` (``"not installed"`` if absent) and Python."""
    versions = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = "not installed"
    return versions


def _own_analysis(result: object) -> list[str]:
    """The analysis a fitted result names itself (a Kaplan–Meier fit's ``analysis``)."""
    label = getattr(result, "analysis", None)
    return [label] if isinstance(label, str) else []


def _labels(analyses: Sequence[str]) -> list[str]:
    """Analysis labels as recorded: strings, in order, each once."""
    if isinstance(analyses, str):
        raise RecordingError(f"analyses must be a list of labels, got the string {analyses!r}")
    return list(dict.fromkeys(str(label) for label in analyses))


def _table(table: pd.DataFrame) -> tuple[list[str], list[list[Any]]]:
    """A table's columns (its index first) and rows as JSON values (non-finite as null)."""
    frame = table.reset_index()
    frame.columns = [str(c) for c in frame.columns]
    return list(frame.columns), json.loads(frame.to_json(orient="values", double_precision=15))


def _write_json(path: Path, value: Any) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        text = json.dumps(value, indent=2, sort_keys=True, allow_nan=False, default=str)
    except ValueError as error:
        raise RecordingError(f"cannot record {path.name}: {error}") from None
    path.write_text(text + "\n", encoding="utf-8")
    return path


class StudyRecorder:
    """Writes one study's recorded facts into ``directory`` (see :mod:`reports.layout`).

    Parameters
    ----------
    directory:
        The study directory; created if absent. Files of an earlier recording
        with the same names are replaced.
    study:
        The study's name, as in the ledgers' scopes.
    """

    def __init__(self, directory: str | PathLike[str], *, study: str) -> None:
        self.layout = StudyLayout(Path(directory))
        self.layout.root.mkdir(parents=True, exist_ok=True)
        self.study = study
        self._ledgers: dict[str, accounting.Ledger] = {}
        self._fits: list[str] = []
        self._curves: list[str] = []
        self._releases: list[str] = []
        self._spec_sha: str | None = None
        self._configuration_sha: str | None = None
        self._heads: dict[tuple[str, str], dict[str, Any]] = {}
        self._created = datetime.now(UTC)

    # -- ledgers -----------------------------------------------------------

    def ledger(self, owner: str) -> accounting.Ledger:
        """``owner``'s ledger in ``ledgers/`` (opened once; closed by :meth:`finish`)."""
        if owner not in self._ledgers:
            path = self.layout.ledger(owner)
            path.parent.mkdir(parents=True, exist_ok=True)
            self._ledgers[owner] = accounting.Ledger(path)
        return self._ledgers[owner]

    # -- facts -------------------------------------------------------------

    def record_spec(self, path: str | PathLike[str]) -> str:
        """Copy the study specification; returns its SHA-256."""
        data = Path(path).read_bytes()
        self.layout.spec.write_bytes(data)
        self._spec_sha = hashlib.sha256(data).hexdigest()
        return self._spec_sha

    def record_configuration(self, configuration: Mapping[str, Any]) -> str:
        """Write the run configuration (JSON values only); returns its SHA-256."""
        _write_json(self.layout.configuration, dict(configuration))
        self._configuration_sha = file_sha256(self.layout.configuration)
        return self._configuration_sha

    def record_harmonization(self, report: HarmonizationReport) -> Path:
        """One site's harmonisation report."""
        name = checked_name("site", report.site)
        return _write_json(self.layout.harmonization / f"{name}.json", report.to_dict())

    def record_fit(
        self,
        name: str,
        result: RecordableResult | Mapping[str, Any],
        *,
        description: str,
        reference: str | None = None,
        analyses: Sequence[str] = (),
    ) -> Path:
        """One fit's released results; ``reference`` names the non-private fit it is compared with.

        ``result`` is a fitted model's results (its ``to_record()`` is written) or a record
        already made (:class:`studyfiles.fit_records.ResultRecord`, e.g. read back from a
        Flower run's results), checked before it is written. The reference must have been
        recorded first. ``analyses`` are the message-inventory labels whose answers made the
        fit (``Federation.analyses_started``); by default its provenance's one analysis.
        """
        name = checked_name("fit", name)
        if reference is not None and reference not in self._fits:
            raise RecordingError(
                f"fit {name!r}: its reference {reference!r} is not recorded yet; record the "
                "non-private fit first"
            )
        record = {
            "name": name,
            "description": description,
            "reference": reference,
            "result": checked_result_record(
                result if isinstance(result, Mapping) else result.to_record()
            ),
            "analyses": _labels(analyses),
        }
        path = _write_json(self.layout.fits / f"{name}.json", record)
        if name not in self._fits:
            self._fits.append(name)
        self._note_ledger_heads(name, record["result"])
        return path

    def record_curves(
        self,
        name: str,
        result: RecordableResult | Mapping[str, Any],
        *,
        description: str,
        analyses: Sequence[str] = (),
    ) -> Path:
        """One Kaplan–Meier fit's released curves, as ``curves/<name>.json``.

        ``result`` is a fitted ``KaplanMeierResults`` (its ``to_record()`` is written) or
        a record already made (:class:`studyfiles.fit_records.CurveRecord`), checked before
        it is written. Curves keep the order in which they are first recorded. ``analyses``
        are the message-inventory labels whose answers made them
        (``Federation.analyses_started``); by default a fitted result's own ``analysis``.
        """
        name = checked_name("curve", name)
        record = {
            "name": name,
            "description": description,
            "result": checked_curve_record(
                result if isinstance(result, Mapping) else result.to_record()
            ),
            "analyses": _labels(analyses or _own_analysis(result)),
        }
        path = _write_json(self.layout.curves / f"{name}.json", record)
        if name not in self._curves:
            self._curves.append(name)
        self._note_ledger_heads(name, record["result"])
        return path

    def record_inventory(self, inventory: MessageInventory) -> Path:
        """The federation's message inventory (JSON Lines)."""
        return inventory.save(self.layout.inventory)

    def record_audit(self, name: str, audit: Mapping[str, Any]) -> Path:
        """An empirical privacy audit, e.g. ``fedstats.models.audit.AuditResult.to_record()``."""
        return _write_json(self.layout.audits / f"{checked_name('audit', name)}.json", dict(audit))

    def record_diagnostic(
        self, name: str, title: str, table: pd.DataFrame, *, analyses: Sequence[str] = ()
    ) -> Path:
        """A diagnostic table (heterogeneity, calibration, fairness) with its title, and the
        analyses (message-inventory labels) whose answers made it."""
        columns, rows = _table(table)
        record = {"title": title, "columns": columns, "rows": rows, "analyses": _labels(analyses)}
        return _write_json(
            self.layout.diagnostics / f"{checked_name('diagnostic', name)}.json", record
        )

    def record_release(
        self,
        name: str,
        table: pd.DataFrame,
        *,
        kind: str,
        description: str,
        analyses: Sequence[str],
        sites: Sequence[str],
        private: bool = False,
        privacy: Mapping[str, Any] | None = None,
        notes: Sequence[str] = (),
    ) -> Path:
        """Any other result that left the sites, as ``releases/<name>.json``.

        A trained network (its evaluation or training history as ``table``),
        classification metrics, a cumulative incidence or log-rank table: ``kind`` says
        what it is in words ("trained network"), ``analyses`` are the message-inventory
        labels whose answers made it (``Federation.analyses_started``), ``sites`` the sites
        that answered; a private release gives its privacy account (the ``privacy`` record
        of a private fit). The compliance report names every release in its verdict.
        """
        name = checked_name("release", name)
        columns, rows = _table(table)
        record = checked_release_record(
            {
                "name": name,
                "kind": kind,
                "description": description,
                "private": bool(private),
                "analyses": _labels(analyses),
                "sites": [str(site) for site in sites],
                "columns": columns,
                "rows": rows,
                "notes": [str(note) for note in notes],
                "privacy": None if privacy is None else dict(privacy),
            }
        )
        path = _write_json(self.layout.releases / f"{name}.json", record)
        if name not in self._releases:
            self._releases.append(name)
        if privacy is not None:
            self._note_ledger_heads(name, record)
        return path

    # -- ledger chain heads ------------------------------------------------

    def _note_ledger_heads(self, fit: str, result: Mapping[str, Any]) -> None:
        """Keep, per site scope, the latest ledger chain head the replies of a private fit
        (its privacy account) or private curve (its ``ledger_heads``) carried."""
        privacy = result.get("privacy") or {}
        heads = [
            (str(s.get("unit")), str(s.get("owner")), s.get("ledger_entries"), s.get("ledger_head"))
            for s in privacy.get("scopes") or ()
        ]
        heads += [
            ("patient", site, h.get("entries"), h.get("head"))
            for site, h in (result.get("ledger_heads") or {}).items()
        ]
        for unit, owner, entries, head in heads:
            record = {"unit": unit, "owner": owner, "study": self.study, "entries": entries}
            try:  # a site's claim, checked as Study.load reads it: a malformed one is not kept
                chain = accounting.ChainHead.from_record({**record, "head": head})
            except ValueError:
                continue
            kept = self._heads.get((unit, owner))
            if kept is None or chain.entries >= kept["entries"]:
                self._heads[(unit, owner)] = {**chain.to_record(), "fit": fit}

    def record_ledger_heads(self) -> Path | None:
        """Write ``ledger-heads.json``: each site's ledger chain head after its last release.

        The heads come from the sites' private replies (recorded with each
        fit's privacy account). They are the coordinator's record, outside
        every site's ledger, of the history each site released under: the
        compliance report checks that each ledger it reads extends them, and
        a site's ledger rewritten after the study no longer does. Returns the
        path, or None when no reply carried a head.
        """
        if not self._heads:
            return None
        return _write_json(self.layout.ledger_heads, list(self._heads.values()))

    # -- manifest ----------------------------------------------------------

    def _ledger_heads_hash(self) -> dict[str, str]:
        path = self.record_ledger_heads()
        return {} if path is None else {path.name: file_sha256(path)}

    def finish(self) -> Path:
        """Write ``study.json`` and close the ledgers; returns the study directory."""
        if self._spec_sha is None or self._configuration_sha is None:
            raise RecordingError(
                "record the study specification (record_spec) and the run configuration "
                "(record_configuration) before finishing"
            )
        manifest = {
            "format": FORMAT,
            "study": self.study,
            "created_at": self._created.isoformat(),
            "finished_at": datetime.now(UTC).isoformat(),
            "package_versions": package_versions(),
            "platform": platform.platform(),
            "hashes": {
                "spec.toml": self._spec_sha,
                "configuration.json": self._configuration_sha,
                **self._ledger_heads_hash(),
            },
            "fits": list(self._fits),
            "curves": list(self._curves),
            "releases": list(self._releases),
        }
        _write_json(self.layout.manifest, manifest)
        for ledger in self._ledgers.values():
            ledger.close()
        self._ledgers.clear()
        return self.layout.root
