"""The fit and curve records: what fitted results write and a compliance report reads.

One definition for both ends. :meth:`fedstats.models.results.LikelihoodResults.to_record`
builds the record of a coefficient fit and checks it here before it is written
(:func:`checked_result_record`); ``reports`` reads ``fits/<name>.json`` as
:class:`FitRecord`. Likewise a Kaplan–Meier fit's
``KaplanMeierResults.to_record`` is checked by :func:`checked_curve_record`
and ``curves/<name>.json`` read as :class:`CurveFitRecord`. A record that does
not match names every bad field (:class:`~studyfiles.errors.FitRecordError`).
Unknown fields are kept by the writer and ignored by the reader, so a record
written by a newer package still loads.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

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
    ledger_entries: int | None = None
    ledger_head: str | None = None


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
    terms: list[str] = []
    """The coefficients' names in the design's order (empty in records that predate it)."""
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

    @property
    def ordered_terms(self) -> list[str]:
        """The coefficients in the design's order; for records without it, the intercept
        first and the others as stored."""
        if sorted(self.terms) == sorted(self.params):
            return list(self.terms)
        return sorted(self.params, key=lambda term: term != "Intercept")


class FitRecord(_Record):
    name: str
    description: str
    reference: str | None
    result: ResultRecord
    analyses: list[str] = []
    """The analyses (message-inventory labels) whose answers made this fit; empty in records
    that predate the field, which the report reads as the provenance's one analysis."""

    @property
    def analysis_labels(self) -> list[str]:
        return self.analyses or [self.result.provenance.analysis]


Curve = dict[str, list[Number | None]]
"""Per group, one value per grid time (``None``: no value there)."""

CURVE_TABLES = ("survival", "lower", "upper", "greenwood", "at_risk", "events", "noise_share")
"""The fields of a :class:`CurveRecord` that hold one value per group and grid time."""


class CurveRecord(_Record):
    """A Kaplan–Meier fit's released curves (``KaplanMeierResults.to_record``).

    Per group (``groups``) and grid time (``grid``): the survival ``S(t)``,
    its interval at ``1 - alpha`` (``lower``, ``upper``), Greenwood's
    ``Var log S`` and the pooled counts (``at_risk``, ``events``; noisy under
    privacy); ``None`` where nobody is left at risk. Under record-level
    privacy also the noise share of each point (``noise_share``), the noise
    multiplier, the noise's standard deviation in each summed count, each
    site's cumulative epsilon for the study after the release and whether its
    noise came from a fixed seed; these are ``None`` for an exact fit.
    """

    model: Literal["KaplanMeier"]
    alpha: Number
    grid: list[Number]
    groups: list[str]
    survival: Curve
    lower: Curve
    upper: Curve
    greenwood: Curve
    """Greenwood's variance of ``log S``."""
    at_risk: Curve
    events: Curve
    median: dict[str, Number | None]
    """First grid time with ``S <= 0.5`` per group (``None``: not reached)."""
    n_obs: dict[str, int]
    """Patients per site (exact fits; empty under privacy, where sites release no count)."""
    truncated: dict[str, int]
    """Patients censored at their site's safe horizon, per site (exact fits)."""
    interval_method: str
    noise_share: Curve | None
    """Share of the variance of ``log(-log S)`` that is privacy noise (``None``: exact fit)."""
    utility_warnings: list[str]
    noise_multiplier: Number | None
    noise_sd_per_count: Number | None
    epsilon_spent: dict[str, Number] | None
    """Each site's cumulative RDP epsilon for the study after this release."""
    secure_aggregation: bool
    """Whether the counts were summed by secure aggregation (the coordinator saw totals only)."""
    fixed_seed: dict[str, bool] | None = None
    """Per site, whether its noise came from a fixed seed (private curves)."""
    ledger_heads: dict[str, dict[str, int | str]] | None = None
    """Per site, its ledger's entry count and chain head after this release (private curves)."""
    horizons: dict[str, dict[str, Number | None]] | None = None
    """Per site and group, the last grid time its counts reach (``None``: before the first;
    the grid's last time for a site that censored nobody at a horizon); empty for private
    curves; ``None`` when unknown (secure aggregation with patients censored at horizons, or
    a record written before horizons were recorded)."""
    not_released_from: dict[str, Number | None] | None = None
    """Per group, the first grid time some site's counts do not reach, from which the value is
    not a pooled estimate (``None``: they all reach the grid's end; the field itself ``None``
    in a record written before it existed)."""
    released: dict[str, list[bool]] | None = None
    """Per group and grid time, whether the value is released as a pooled estimate (not past
    :attr:`not_released_from`, nor, for a deferred curve, before its first released death);
    ``None`` in a record written before it existed."""
    horizon_warnings: list[str] = []
    """Each group whose pooled curve is not released to the grid's end, naming the sites and
    horizons that stop it."""

    @model_validator(mode="after")
    def _one_value_per_group_and_time(self) -> CurveRecord:
        problems = []
        for field in CURVE_TABLES:
            table = getattr(self, field)
            if table is None:
                continue
            if sorted(table) != sorted(self.groups):
                problems.append(f"{field} holds groups {sorted(table)}, expected {self.groups}")
            problems.extend(
                f"{field}.{group} holds {len(values)} values for {len(self.grid)} grid times"
                for group, values in table.items()
                if len(values) != len(self.grid)
            )
        if sorted(self.median) != sorted(self.groups):
            problems.append(f"median holds groups {sorted(self.median)}, expected {self.groups}")
        problems.extend(self._released_problems())
        if problems:
            raise ValueError("; ".join(problems))
        return self

    def _released_problems(self) -> list[str]:
        """A record says where each group's curve is released, and holds no value elsewhere."""
        if self.not_released_from is None:
            return []
        problems = []
        if self.released is not None and sorted(self.released) != sorted(self.groups):
            problems.append(f"released holds groups {sorted(self.released)}")
        problems.extend(
            f"released.{group} holds {len(rows)} values for {len(self.grid)} grid times"
            for group, rows in (self.released or {}).items()
            if len(rows) != len(self.grid)
        )
        if sorted(self.not_released_from) != sorted(self.groups):
            problems.append(
                f"not_released_from holds groups {sorted(self.not_released_from)}, expected "
                f"{self.groups}"
            )
        for site, by_group in (self.horizons or {}).items():
            if sorted(by_group) != sorted(self.groups):
                problems.append(f"horizons.{site} holds groups {sorted(by_group)}")
        for group in self.groups:
            values = self.survival.get(group, [])
            held = [
                t
                for t, v, released in zip(self.grid, values, self.released_at(group), strict=False)
                if not released and v is not None
            ]
            if held:
                problems.append(
                    f"survival.{group} holds values at {held[:3]}, where the pooled curve is "
                    "not released"
                )
        return problems

    def released_at(self, group: str) -> list[bool]:
        """Per grid time, whether the group's value is released as a pooled estimate (all
        ``True`` in a record written before this was recorded)."""
        if self.released is not None and group in self.released:
            return list(self.released[group])
        first = None if self.not_released_from is None else self.not_released_from.get(group)
        return [first is None or t < first for t in self.grid]

    @property
    def private(self) -> bool:
        """Whether the counts carry privacy noise."""
        return self.noise_multiplier is not None

    @property
    def noise_dominated(self) -> bool:
        return bool(self.utility_warnings)


class CurveFitRecord(_Record):
    """One recorded Kaplan–Meier fit (``curves/<name>.json``)."""

    name: str
    description: str
    result: CurveRecord
    analyses: list[str] = []
    """The analyses (message-inventory labels) whose answers made these curves."""


class ReleaseRecord(_Record):
    """Any other result that left the sites (``releases/<name>.json``).

    A trained network, its evaluation, classification metrics, a cumulative
    incidence or log-rank table, a fairness penalty: what it is (``kind``), the
    table it released (``columns``, ``rows``), the analyses (message-inventory
    labels) whose answers made it, the sites that answered, whether it is private
    and, if so, its privacy account. The compliance report names each one and ties
    every analysis in the inventory to the result it produced.
    """

    name: str
    kind: str
    description: str
    private: bool
    analyses: list[str]
    sites: list[str]
    columns: list[str]
    rows: list[list[Any]]
    notes: list[str] = []
    privacy: PrivacyRecord | None = None

    @model_validator(mode="after")
    def _rows_fit_the_columns(self) -> ReleaseRecord:
        wrong = [i for i, row in enumerate(self.rows) if len(row) != len(self.columns)]
        if wrong:
            raise ValueError(
                f"rows {wrong[:5]} do not hold one value per column ({len(self.columns)})"
            )
        if not self.analyses:
            raise ValueError("a release names the analyses whose answers made it")
        return self


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
    _check(ResultRecord, record, "a fit result is not a valid fit record")
    return dict(record)


def checked_curve_record(record: Mapping[str, Any]) -> dict[str, Any]:
    """``record`` as written, after checking it reads back as a :class:`CurveRecord`.

    The check goes through JSON, as the reader will (``None`` for numbers that
    are not finite).
    """
    _check(
        CurveRecord,
        record,
        "a Kaplan–Meier result is not a valid curve record (make it with "
        "KaplanMeierResults.to_record())",
    )
    return dict(record)


def checked_release_record(record: Mapping[str, Any]) -> dict[str, Any]:
    """``record`` as written, after checking it reads back as a :class:`ReleaseRecord`."""
    _check(ReleaseRecord, record, "a release is not a valid release record")
    return dict(record)


def _check(model: type[BaseModel], record: Mapping[str, Any], what: str) -> None:
    """Validate ``record`` through JSON as ``model``; :class:`FitRecordError` names the fields."""
    try:
        model.model_validate_json(json.dumps(record, allow_nan=False))
    except (ValidationError, ValueError, TypeError) as error:
        problems = validation_problems(error) if isinstance(error, ValidationError) else str(error)
        raise FitRecordError(f"{what}: {problems}") from None
