"""The JSON records of a study directory, validated field by field (pydantic).

Each model mirrors what the recorder writes: :class:`Manifest` (``study.json``),
:class:`FitRecord` (``fits/<name>.json``) and :class:`CurveFitRecord`
(``curves/<name>.json``; both defined with the records they hold in
:mod:`studyfiles.fit_records`, shared with the writer), :class:`AuditRecord`,
:class:`DiagnosticRecord` and :class:`LinkageRecord` (``linkages/<id>.json``, defined in
:mod:`studyfiles.linkage_records`, shared with the linkage unit that writes it). Unknown
fields are ignored, so records written by a newer package still load; missing or
mistyped fields are refused by :func:`parse_record` with a
:class:`~reports.errors.StudyRecordError` naming the file and every field path.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

from reports.errors import StudyRecordError
from studyfiles.fit_records import (
    CurveFitRecord,
    CurveRecord,
    FitRecord,
    PrivacyRecord,
    ProvenanceRecord,
    ReleaseRecord,
    ResultRecord,
    ScopeSpendingRecord,
    validation_problems,
)
from studyfiles.linkage_records import LinkageRecord

Number = float | int


class _Record(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True, strict=True)


class Manifest(_Record):
    format: Literal["fedstats-study/1"]  # reports.layout.FORMAT
    study: str
    created_at: datetime
    finished_at: datetime
    package_versions: dict[str, str]
    platform: str
    hashes: dict[str, str]
    fits: list[str]
    curves: list[str] = []
    """Recorded Kaplan–Meier fits in order (absent from manifests written before curves)."""
    releases: list[str] = []
    """Other recorded releases in order (trained networks, metrics, tables; absent from
    manifests written before releases were recorded)."""


class AuditRecord(_Record):
    """An empirical privacy audit (``fedstats.models.audit.AuditResult.to_record``)."""

    method: str
    epsilon_lower: Number
    confidence: Number
    delta: Number
    canaries: int
    included: int
    guesses: int
    correct: int
    accounted_epsilon: Number | None = None
    private: bool = True


class DiagnosticRecord(_Record):
    title: str
    columns: list[str]
    rows: list[list[Any]]
    analyses: list[str] = []
    """The analyses (message-inventory labels) whose answers made this table (empty in
    records that predate the field)."""


Model = TypeVar("Model", bound=BaseModel)

__all__ = [
    "AuditRecord",
    "CurveFitRecord",
    "CurveRecord",
    "DiagnosticRecord",
    "FitRecord",
    "LinkageRecord",
    "Manifest",
    "PrivacyRecord",
    "ProvenanceRecord",
    "ReleaseRecord",
    "ResultRecord",
    "ScopeSpendingRecord",
    "parse_record",
]


def parse_record(model: type[Model], path: Path) -> Model:
    """Read ``path`` as ``model``; :class:`StudyRecordError` names the file and each bad field."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise StudyRecordError(path, "file missing") from None
    except (OSError, UnicodeDecodeError) as error:
        raise StudyRecordError(path, f"cannot be read ({error})") from None
    try:
        return model.model_validate_json(text)
    except ValidationError as error:
        problems = validation_problems(error)
        raise StudyRecordError(path, f"not a valid {model.__name__} ({problems})") from None
