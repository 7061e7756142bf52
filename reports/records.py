"""The JSON records of a study directory, validated field by field (pydantic).

Each model mirrors what the recorder writes: :class:`Manifest` (``study.json``),
:class:`FitRecord` (``fits/<name>.json``, the result of
``LikelihoodResults.to_record``), :class:`AuditRecord` and
:class:`DiagnosticRecord`. Unknown fields are ignored, so records written by a
newer package still load; missing or mistyped fields are refused by
:func:`parse_record` with a :class:`~reports.errors.StudyRecordError` naming
the file and every field path.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

from reports.errors import StudyRecordError

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


class ScopeSpendingRecord(_Record):
    """One scope's spending for one fit (``fedstats.models.privacy.ScopeSpending``)."""

    unit: str
    owner: str
    epsilon: Number
    epsilon_pld: Number | None
    delta: Number
    cumulative_epsilon: Number | None
    budget_epsilon: Number | None
    noise_multipliers: list[Number]
    releases: int
    fixed_seed: bool


class PrivacyRecord(_Record):
    """A private fit's account (``fedstats.models.privacy.PrivacyAccount``)."""

    scopes: list[ScopeSpendingRecord]
    rounds: int
    row_norm: Number | None
    neighbouring: str
    secure_aggregation: dict[str, Any] | None = None


class ProvenanceRecord(_Record):
    study: str
    analysis: str
    sites: list[str]
    n_obs: dict[str, Number]
    n_dropped: dict[str, Number]
    rounds: int
    messages: int
    request_bytes: int
    reply_bytes: int
    started: datetime
    finished: datetime


class ResultRecord(_Record):
    model: str
    params: dict[str, Number]
    bse: dict[str, Number | None]
    conf_int: dict[Literal["lower", "upper"], dict[str, Number | None]]
    alpha: Number
    pvalues: dict[str, Number | None]
    llf: Number | None
    converged: bool
    iterations: int
    notes: list[str]
    provenance: ProvenanceRecord
    privacy: PrivacyRecord | None
    n_events: dict[str, Number] = {}


class FitRecord(_Record):
    name: str
    description: str
    reference: str | None
    result: ResultRecord


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


Model = TypeVar("Model", bound=_Record)


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
        problems = "; ".join(
            f"field {'.'.join(str(p) for p in e['loc']) or '(document)'}: {e['msg']}"
            for e in error.errors()[:5]
        )
        raise StudyRecordError(path, f"not a valid {model.__name__} ({problems})") from None
