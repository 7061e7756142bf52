"""Empirical privacy audit of federated DP-SGD training in one run, with input-space canaries.

The auditor audits the real training path — :meth:`FederatedTrainer.fit
<fedstats.deep.FederatedTrainer.fit>` through the silos, with their DP-SGD,
ledgers and disclosure control — by the one-run method of Steinke, Nasr &
Jagielski ("Privacy auditing with one (1) training run", NeurIPS 2023):

1. It makes ``m`` canaries: records in the site frame's own columns, placed
   where the real data does not lie (e.g. :func:`draw_canaries`: every
   numeric covariate near an end of its public bounds, which the trainer
   scales to ``[-1, 1]``) and each with a random 0/1 label, so that only
   training on a canary can teach the model its label.
2. Each canary goes into one site's frame independently with probability
   1/2 (:func:`fedstats.models.audit.draw_inclusion`, OS entropy by default). The
   inserted canaries are patients of that site like any other: they count
   for its disclosure control, and its ledger pays for them.
3. One normal fit runs, with record-level privacy (:class:`fedstats.RecordDP`)
   or, for the control, without.
4. The auditor scores every canary with the released model: the score is
   the log-likelihood of the canary's label,
   ``log p(y | x) = y s - log(1 + e^s)`` with ``s`` the model's logit
   (higher: more likely trained on). The canaries are the auditor's own
   synthetic records, not patient data, and the final weights are what every
   fit releases to the coordinator, so scoring them outside the silo
   releases nothing about patients.
5. :func:`fedstats.models.audit.audit` turns the scores into a lower bound on
   epsilon at the chosen confidence, reported beside the site's accounted
   epsilon for the fit (its RDP epsilon at the same ``delta``).

A DP run's lower bound must stay below its accounted epsilon (up to the
audit's confidence); the non-private control, with the same trainer
options, canaries and inclusion draw, shows that the audit could have
detected membership — without it a bound of zero says nothing. The bound
is at most about ``log(r)`` for ``r`` guesses: the audit detects missing
noise or wrongly claimed amplification, not small accounting errors, and
a black-box audit of the final model is usually far from the accounted
epsilon even when the accounting is tight.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import torch

import accounting
from fedstats.contract.design import parse_formula
from fedstats.deep.shared.losses import BINARY
from fedstats.deep.site.data import site_tensors
from fedstats.deep.training.results import DeepModelResults
from fedstats.deep.training.trainer import FederatedTrainer
from fedstats.errors import FedstatsError, StudyConfigurationError
from fedstats.in_process import Federation
from fedstats.models.agree import agree_design
from fedstats.models.audit import AuditResult, audit, draw_inclusion
from fedstats.models.privacy import RecordDP
from fedstats.site.disclosure import DisclosurePolicy
from fedstats.site.task import SiteContext

SCORE = "log-likelihood of the canary's label under the final model"
CANARY_KIND = "input-space canaries with random labels"


def draw_canaries(
    m: int,
    template: pd.DataFrame,
    *,
    bounds: Mapping[str, tuple[float, float]],
    outcome: str,
    levels: Mapping[str, Sequence[Any]] | None = None,
    inner: float = 0.6,
    rng: np.random.Generator | None = None,
) -> pd.DataFrame:
    """``m`` canaries in ``template``'s columns, far from data that lies inside the bounds.

    A numeric column with public bounds ``(low, high)`` gets
    ``centre +/- half_width * u`` with a random sign and ``u`` uniform on
    ``[inner, 1]`` (rounded for integer columns), so each canary sits near a
    corner of the bounds' box, where the trainer's inputs are close to
    ``+/-1``, while real covariates usually lie well inside. A column in
    ``levels`` gets a uniformly drawn level; ``outcome`` a fair 0/1 label.
    Any other column of ``template`` is refused: build such canaries yourself.
    """
    if type(m) is not int or m < 2:
        raise StudyConfigurationError(f"draw_canaries needs m >= 2 canaries, got {m!r}")
    if not (isinstance(inner, int | float) and 0 <= inner < 1):
        raise StudyConfigurationError(f"inner must be in [0, 1), got {inner!r}")
    if not isinstance(template, pd.DataFrame):
        raise StudyConfigurationError("template must be the site's DataFrame (for its columns)")
    if outcome not in template.columns:
        raise StudyConfigurationError(f"the outcome {outcome!r} is not a column of the template")
    levels = dict(levels or {})
    rng = rng if rng is not None else np.random.default_rng()
    columns: dict[str, Any] = {}
    for name in template.columns:
        column = template[name]
        if name == outcome:
            values: Any = rng.integers(0, 2, m)
        elif name in levels:
            choices = list(levels[name])
            if not choices:
                raise StudyConfigurationError(f"levels of {name!r} are empty")
            values = [choices[i] for i in rng.integers(0, len(choices), m)]
        elif name in bounds:
            low, high = (float(v) for v in bounds[name])
            if not (np.isfinite(low) and np.isfinite(high) and high > low):
                raise StudyConfigurationError(f"bounds of {name!r} must be finite, low < high")
            sign = rng.choice([-1.0, 1.0], m)
            values = (low + high) / 2 + sign * (high - low) / 2 * rng.uniform(inner, 1.0, m)
            if pd.api.types.is_integer_dtype(column):
                values = np.clip(np.rint(values), np.ceil(low), np.floor(high))
        else:
            raise StudyConfigurationError(
                f"column {name!r} of the site frame has no public bounds and no levels, so no "
                "canary value can be drawn for it: pass bounds or levels, or build the canaries"
            )
        columns[name] = values
    frame = pd.DataFrame(columns)
    return _as_frame_dtypes(frame, template, "the template")


@dataclass(frozen=True)
class CanaryRun:
    """One audited fit: its audit, the canaries' scores and inclusion, and the fit itself."""

    site: str
    inserted: int
    """Canaries inserted into the site's frame (counted as its patients)."""
    site_rows: int
    """Rows of the site's frame during the fit, canaries included."""
    scores: np.ndarray = field(repr=False)
    included: np.ndarray = field(repr=False)
    result: AuditResult
    fit: DeepModelResults = field(repr=False)

    @property
    def private(self) -> bool:
        return self.result.private

    @property
    def epsilon_lower(self) -> float:
        return self.result.epsilon_lower

    @property
    def accounted_epsilon(self) -> float | None:
        return self.result.accounted_epsilon

    def to_record(self) -> dict[str, Any]:
        """The audit's record (:meth:`AuditResult.to_record`) with the canaries' site and kind."""
        return {
            **self.result.to_record(),
            "site": self.site,
            "canaries_inserted": self.inserted,
            "site_rows": self.site_rows,
            "canary_kind": CANARY_KIND,
            "score": SCORE,
        }


@dataclass(frozen=True)
class AuditReport:
    """A private run and its non-private control, with the same canaries and inclusion draw."""

    private: CanaryRun
    control: CanaryRun

    def to_frame(self) -> pd.DataFrame:
        rows = []
        for name, run in (("DP-SGD", self.private), ("non-private control", self.control)):
            rows.append(
                {
                    "run": name,
                    "accounted epsilon": run.accounted_epsilon,
                    "epsilon lower bound": run.epsilon_lower,
                    "confidence": run.result.confidence,
                    "delta": run.result.delta,
                    "canaries": run.result.canaries,
                    "inserted": run.inserted,
                    "guesses": run.result.guesses,
                    "correct": run.result.correct,
                }
            )
        return pd.DataFrame(rows).set_index("run")

    def records(self) -> list[dict[str, Any]]:
        return [self.private.to_record(), self.control.to_record()]

    def summary(self) -> str:
        return (
            f"One-run canary audit at site {self.private.site!r} "
            f"({self.private.result.canaries} canaries, {self.private.inserted} inserted)\n"
            + self.to_frame().to_string(float_format=lambda v: f"{v:.3g}")
        )

    def __str__(self) -> str:
        return self.summary()

    __repr__ = __str__

    def _repr_html_(self) -> str:
        head = (
            f"<p><b>One-run canary audit</b> at site <code>{self.private.site}</code>: "
            f"{self.private.result.canaries} canaries, {self.private.inserted} inserted; "
            f"lower bounds at {self.private.result.confidence:.0%} confidence</p>"
        )
        return head + self.to_frame().to_html(float_format=lambda v: f"{v:.3g}")


def audit_training(
    trainer: FederatedTrainer,
    frames: Mapping[str, pd.DataFrame],
    canaries: pd.DataFrame,
    *,
    site: str,
    privacy: RecordDP | None,
    guess_grid: Sequence[int],
    delta: float | None = None,
    confidence: float = 0.95,
    included: np.ndarray | None = None,
    ledgers: Mapping[str, accounting.Ledger] | None = None,
    disclosure: DisclosurePolicy | None = None,
    study: str = "study",
    noise_seed: int | None = None,
    rng: np.random.Generator | None = None,
) -> CanaryRun:
    """Audit one fit of ``trainer`` on ``frames`` with ``canaries`` put into ``site``'s frame.

    Parameters
    ----------
    trainer:
        The trainer to audit, with a 0/1 outcome; its options are used as given.
    frames, site:
        The sites' frames (as for :meth:`fedstats.Federation.in_process`) and the
        site that receives the canaries.
    canaries:
        The auditor's canary records, with exactly the site frame's columns and
        no missing values (:func:`draw_canaries` makes them).
    privacy:
        :class:`fedstats.RecordDP` for the audited private fit (charged to the
        sites' ``ledgers``), or ``None`` for the non-private control.
    guess_grid, delta, confidence:
        Guess counts tried (each at most the number of canaries), the ``delta``
        of the guarantee tested (default ``privacy.delta``; required for the
        control) and the bound's confidence (:func:`fedstats.models.audit.audit`).
    included:
        Which canaries to insert; default :func:`fedstats.models.audit.draw_inclusion`
        with ``rng`` (OS entropy when ``rng`` is ``None``).
    ledgers, disclosure, study, noise_seed:
        The federation's options (:meth:`fedstats.Federation.in_process`).

    The whole check of the inputs happens before any message is sent.
    """
    if not isinstance(trainer, FederatedTrainer):
        raise StudyConfigurationError("trainer must be a fedstats.deep.FederatedTrainer")
    if trainer.kind != BINARY:
        raise StudyConfigurationError(
            "the canary audit scores the log-likelihood of a 0/1 label; "
            f"{trainer.formula!r} is not a binary outcome"
        )
    if privacy is not None and not isinstance(privacy, RecordDP):
        raise StudyConfigurationError(
            "privacy must be fedstats.RecordDP(...) (canaries are records) or None (the control)"
        )
    if privacy is not None and not ledgers:
        raise StudyConfigurationError(
            "a private audit run charges each site's ledger: pass ledgers={site: Ledger}"
        )
    if not isinstance(frames, Mapping) or site not in frames:
        known = sorted(frames) if isinstance(frames, Mapping) else []
        raise StudyConfigurationError(f"canary site {site!r} is not one of the sites {known}")
    delta = _checked_delta(delta, privacy)
    if not 0 < confidence < 1:
        raise StudyConfigurationError(f"confidence must be in (0, 1), got {confidence!r}")
    canaries = _checked_canaries(canaries, frames[site], site)
    m = len(canaries)
    grid = _checked_grid(guess_grid, m)
    if included is None:
        included = draw_inclusion(m, rng)
    included = np.asarray(included)
    if included.shape != (m,) or included.dtype != bool:
        raise StudyConfigurationError(f"included must hold one boolean per canary ({m})")
    _check_canary_design(trainer, canaries, site)

    inserted = int(included.sum())
    site_frame = pd.concat([frames[site], canaries[included]], ignore_index=True)
    site_frame.attrs = dict(frames[site].attrs)
    audited = {name: site_frame if name == site else frame for name, frame in frames.items()}
    federation = Federation.in_process(
        audited,
        disclosure=disclosure,
        study=study,
        ledgers=ledgers if privacy is not None else None,
        noise_seed=noise_seed,
    )
    fit = trainer.fit(federation, privacy=privacy, evaluation=False)
    scores = _scores(fit, canaries, site)
    result = audit(
        scores,
        included,
        delta=delta,
        guess_grid=grid,
        confidence=confidence,
        accounted_epsilon=_accounted_epsilon(fit, site) if privacy is not None else None,
        private=privacy is not None,
    )
    return CanaryRun(
        site=site,
        inserted=inserted,
        site_rows=len(site_frame),
        scores=scores,
        included=included.copy(),
        result=result,
        fit=fit,
    )


def audit_with_control(
    trainer: FederatedTrainer,
    frames: Mapping[str, pd.DataFrame],
    canaries: pd.DataFrame,
    *,
    site: str,
    privacy: RecordDP,
    guess_grid: Sequence[int],
    ledgers: Mapping[str, accounting.Ledger],
    confidence: float = 0.95,
    disclosure: DisclosurePolicy | None = None,
    study: str = "study",
    noise_seed: int | None = None,
    rng: np.random.Generator | None = None,
) -> AuditReport:
    """The private fit's audit and the non-private control's, from one inclusion draw.

    Both runs use the same trainer, canaries, inclusion and ``delta``
    (``privacy.delta``); only ``privacy`` differs. See :func:`audit_training`.
    """
    if not isinstance(privacy, RecordDP):
        raise StudyConfigurationError("the audited run needs privacy=fedstats.RecordDP(...)")
    if not isinstance(canaries, pd.DataFrame):
        raise StudyConfigurationError("canaries must be a DataFrame of the auditor's records")
    included = draw_inclusion(len(canaries), rng)
    options = dict(site=site, guess_grid=guess_grid, delta=privacy.delta, confidence=confidence,
                   included=included, disclosure=disclosure, study=study)  # fmt: skip
    private = audit_training(trainer, frames, canaries, privacy=privacy, ledgers=ledgers,
                             noise_seed=noise_seed, **options)  # fmt: skip
    control = audit_training(trainer, frames, canaries, privacy=None, **options)
    return AuditReport(private=private, control=control)


# ------------------------------------------------------------------ internals


def _checked_delta(delta: float | None, privacy: RecordDP | None) -> float:
    if delta is None:
        if privacy is None:
            raise StudyConfigurationError(
                "the control run tests (epsilon, delta)-DP at the private run's delta: pass delta"
            )
        delta = privacy.delta
    if not (isinstance(delta, int | float) and 0 <= delta < 1):
        raise StudyConfigurationError(f"delta must be in [0, 1), got {delta!r}")
    return float(delta)


def _checked_grid(guess_grid: Sequence[int], m: int) -> tuple[int, ...]:
    try:
        grid = tuple(guess_grid)
    except TypeError:
        grid = ()
    if not grid or any(type(r) is not int or not 1 <= r <= m for r in grid):
        raise StudyConfigurationError(
            f"guess_grid must list guess counts between 1 and the {m} canaries, got {guess_grid!r}"
        )
    return grid


def _checked_canaries(canaries: Any, frame: pd.DataFrame, site: str) -> pd.DataFrame:
    """The canaries in the site frame's column order and dtypes; typed errors otherwise."""
    if not isinstance(canaries, pd.DataFrame) or len(canaries) < 2:
        raise StudyConfigurationError("canaries must be a DataFrame of at least 2 records")
    missing = [c for c in frame.columns if c not in canaries.columns]
    extra = [c for c in canaries.columns if c not in frame.columns]
    if missing or extra:
        raise StudyConfigurationError(
            f"the canaries must have exactly the columns of site {site!r}'s frame; "
            f"missing {missing}, unknown {extra}"
        )
    if canaries.isna().to_numpy().any():
        raise StudyConfigurationError("the canaries have missing values; give complete records")
    ordered = canaries[list(frame.columns)].reset_index(drop=True)
    return _as_frame_dtypes(ordered, frame, f"site {site!r}")


def _as_frame_dtypes(canaries: pd.DataFrame, frame: pd.DataFrame, where: str) -> pd.DataFrame:
    out = canaries.copy()
    for name in frame.columns:
        target = frame[name].dtype
        numeric = pd.api.types.is_numeric_dtype(target) and not pd.api.types.is_bool_dtype(target)
        column = out[name]
        if numeric != (
            pd.api.types.is_numeric_dtype(column) and not pd.api.types.is_bool_dtype(column)
        ):
            raise StudyConfigurationError(
                f"canary column {name!r} must be {'numeric' if numeric else 'categorical'}, "
                f"as in the frame of {where}"
            )
        try:
            converted = column.astype(target)
        except (TypeError, ValueError) as error:
            raise StudyConfigurationError(
                f"canary column {name!r} cannot take the frame's type {target}: {error}"
            ) from None
        if numeric and not np.allclose(converted.to_numpy(float), column.to_numpy(float)):
            raise StudyConfigurationError(
                f"canary column {name!r} has values its frame's type {target} cannot hold"
            )
        out[name] = converted
    return out


def _check_canary_design(trainer: FederatedTrainer, canaries: pd.DataFrame, site: str) -> None:
    """Before any training (and any charge): the trainer's design agreement, run on the
    canaries alone — the auditor's own records, without a ledger — accepts them."""
    parsed = parse_formula(trainer.formula)
    undeclared = sorted(
        v
        for v in parsed.covariates
        if v not in (trainer.levels or {})
        and (v in parsed.wrapped or not pd.api.types.is_numeric_dtype(canaries[v]))
    )
    if undeclared:
        raise StudyConfigurationError(
            f"the audit scores canaries on the trained design: declare the levels of "
            f"{undeclared} with the trainer's levels={{...}}"
        )
    auditor = Federation.in_process({site: canaries}, disclosure=DisclosurePolicy(min_count=1))
    try:
        agree_design(auditor, trainer.formula, analysis="canary-design", levels=trainer.levels,
                     missing=trainer.missing, outcome_kind=BINARY)  # fmt: skip
    except FedstatsError as error:
        raise StudyConfigurationError(
            f"the canaries do not fit the trained design: {error}"
        ) from None


def _scores(fit: DeepModelResults, canaries: pd.DataFrame, site: str) -> np.ndarray:
    """``log p(y | x) = y s - log(1 + e^s)`` of every canary under the final model, its inputs
    built by the sites' own design code from the design they agreed on."""
    context = SiteContext(  # the auditor's own canaries: nothing is released
        name=site, frame=canaries, policy=DisclosurePolicy(min_count=1), exact=False
    )
    request = {"design": fit.design.to_wire(), "scaling": np.asarray(fit.scaling)}
    try:
        data = site_tensors(context, request, evaluation=True)
    except FedstatsError as error:
        raise StudyConfigurationError(
            f"the canaries do not fit the trained design: {error}"
        ) from None
    with torch.no_grad():
        logits = fit.module()(data.X).reshape(-1).double().numpy()
    labels = data.y.double().numpy()
    return labels * logits - np.logaddexp(0.0, logits)


def _accounted_epsilon(fit: DeepModelResults, site: str) -> float:
    """The site's record-level epsilon for this fit (RDP, at the fit's delta)."""
    scopes = [] if fit.privacy is None else fit.privacy.scopes
    for scope in scopes:
        if scope.unit == "patient" and scope.owner == site:
            return float(scope.epsilon)
    raise StudyConfigurationError(
        f"the fit's privacy account has no record-level scope of {site!r}"
    )
