"""The fit record: what a fitted model's results write and a compliance report reads.

One definition for both ends. :meth:`fedstats.models.results.LikelihoodResults.to_record`
builds the record and checks it here before it is written
(:func:`checked_result_record`); ``reports`` reads ``fits/<name>.json`` as
:class:`FitRecord`. A record that does not match names every bad field
(:class:`~studyfiles.errors.FitRecordError`). Unknown fields are kept by the
writer and ignored by the reader, so a record written by a newer package
still loads.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from studyfiles.errors import FitRecordError

Number = float | int

NOISE_DOMINATES = 0.5
"""A coefficient's privacy noise dominates when its noise share (the share of its variance
that is privacy noise) exceeds this: the noise's variance exceeds the sampling variance."""


class _Record(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True, strict=True)


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
    events_used: Number | None = None
    """Events a survival fit used, when a safe horizon may have discarded some."""
    interval_method: str = ""
    """How the intervals were obtained, in words ("" in records that predate the field)."""
    noise_share: dict[str, Number | None] = {}
    """Per coefficient, the share of its variance that is privacy noise (private fits)."""
    utility_warnings: list[str] = []
    """What makes the result misleading, in plain words; empty when nothing does."""

    @property
    def noise_dominated(self) -> bool:
        return bool(self.utility_warnings)


class FitRecord(_Record):
    name: str
    description: str
    reference: str | None
    result: ResultRecord


def validation_problems(error: ValidationError, limit: int = 5) -> str:
    """The first ``limit`` problems of a validation error, each as ``field a.b: message``."""
    return "; ".join(
        f"field {'.'.join(str(p) for p in e['loc']) or '(document)'}: {e['msg']}"
        for e in error.errors()[:limit]
    )


def checked_result_record(record: Mapping[str, Any]) -> dict[str, Any]:
    """``record`` as written, after checking it reads back as a :class:`ResultRecord`.

    The check goes through JSON, as the reader will (times as ISO 8601 strings,
    ``None`` for numbers that are not finite).
    """
    try:
        ResultRecord.model_validate_json(json.dumps(record, allow_nan=False))
    except (ValidationError, ValueError, TypeError) as error:
        problems = validation_problems(error) if isinstance(error, ValidationError) else str(error)
        raise FitRecordError(f"a fit result is not a valid fit record: {problems}") from None
    return dict(record)
