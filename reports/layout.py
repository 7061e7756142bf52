"""The study directory: where the recorded facts of one study live, file by file.

A study directory is what ``fedstats report --study DIR`` reads and what
:class:`reports.recorder.StudyRecorder` writes::

    DIR/
      study.json              manifest: study name, format, time, package versions,
                              SHA-256 of spec.toml and configuration.json, fits and
                              curves in order
      spec.toml               the study specification every site received (a copy)
      configuration.json      the coordinator's run configuration: formulas, privacy
                              options (epsilon, delta, rounds, bounds), disclosure policy,
                              noise seed (null when OS entropy was used)
      ledgers/<owner>.ledger  each site's and the coordinator's privacy ledger (SQLite)
      ledger-heads.json       each site's ledger chain head after its last private reply
                              (entry count and hash, from the replies), if any; its
                              SHA-256 is in the manifest
      inventory.jsonl         every message of the federation (MessageInventory.save)
      harmonization/<site>.json   each site's HarmonizationReport (to_dict)
      fits/<name>.json        one fit: description, the non-private fit it is compared
                              with (if any), and LikelihoodResults.to_record()
      curves/<name>.json      one Kaplan-Meier fit: description and
                              KaplanMeierResults.to_record() (curves, intervals, counts,
                              noise shares and privacy facts), if any
      audits/<name>.json      empirical privacy audits (AuditResult.to_record), if any
      diagnostics/<name>.json heterogeneity, calibration or fairness tables, if any
      releases/<name>.json    every other released result (a trained network and its
                              evaluation, classification metrics, a cumulative incidence
                              table...): what it is, its table, the analyses that made it
      linkages/<id>.json      each record linkage as the linkage unit ran it
                              (studyfiles.linkage_records.LinkageRecord): the encoding,
                              threshold, blocking, counts per site and the score
                              histogram, counts from 1 to k - 1 suppressed; never a value

Fits, curves, diagnostics and releases each name the analyses (message-inventory
labels) whose answers made them, so the report ties every analysis in the
inventory to what it released.

Ledgers are read as they are now (they keep growing, and carry their own hash
chain); the spec and configuration must still match the hashes in the
manifest. Names of sites, fits, curves, audits and diagnostics become file
names, so they are limited to letters, digits, ``.``, ``_`` and ``-``. Study
directories recorded before curves existed have no ``curves/`` folder and no
``curves`` in the manifest; they read as having no curve.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from reports.errors import RecordingError
from studyfiles.names import name_problem

FORMAT = "fedstats-study/1"
"""Value of ``format`` in ``study.json``; a reader refuses any other."""


def checked_name(kind: str, name: str) -> str:
    """``name`` if it can be a file name in the study directory, else :class:`RecordingError`
    (the rule: :func:`studyfiles.names.name_problem`)."""
    problem = name_problem(name)
    if problem is not None:
        raise RecordingError(f"{kind} name cannot be recorded: {problem}")
    return name


@dataclass(frozen=True)
class StudyLayout:
    """Paths of a study directory's files."""

    root: Path

    @property
    def manifest(self) -> Path:
        return self.root / "study.json"

    @property
    def spec(self) -> Path:
        return self.root / "spec.toml"

    @property
    def configuration(self) -> Path:
        return self.root / "configuration.json"

    @property
    def inventory(self) -> Path:
        return self.root / "inventory.jsonl"

    @property
    def ledgers(self) -> Path:
        return self.root / "ledgers"

    @property
    def ledger_heads(self) -> Path:
        return self.root / "ledger-heads.json"

    @property
    def harmonization(self) -> Path:
        return self.root / "harmonization"

    @property
    def fits(self) -> Path:
        return self.root / "fits"

    @property
    def curves(self) -> Path:
        return self.root / "curves"

    @property
    def audits(self) -> Path:
        return self.root / "audits"

    @property
    def diagnostics(self) -> Path:
        return self.root / "diagnostics"

    @property
    def releases(self) -> Path:
        return self.root / "releases"

    @property
    def linkages(self) -> Path:
        return self.root / "linkages"

    def ledger(self, owner: str) -> Path:
        return self.ledgers / f"{checked_name('ledger owner', owner)}.ledger"
