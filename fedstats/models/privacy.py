"""Privacy options of a fit and what a private fit reports.

* :class:`RecordDP` — record-level differential privacy enforced by every
  site on its own patients (unit: patient; neighbouring relation: add or
  remove one patient). Each site clips, noises and charges its own ledger.
* :class:`ClientDP` — client-level differential privacy enforced by the
  coordinator (unit: site): each site's contribution is clipped, the sum
  noised, and the charge recorded in the coordinator's ledger. With few
  sites the noise this requires is of the size of a whole site's
  contribution; the guarantee protects a hospital's participation, not its
  patients (McMahan et al., ICLR 2018).

A private logistic fit runs ``rounds`` noisy Newton steps; each site makes
``1 + 2 * rounds`` Gaussian releases (the counts once; score and information
each round), so the noise multiplier for a target ``(epsilon, delta)`` is
calibrated over that many compositions with the RDP accountant.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import dp_accounting
import numpy as np

import accounting
from fedstats.errors import FormulaError, PlannedBudgetError, StudyConfigurationError
from fedstats.site.design import SITE_COLUMN, DesignLayout


def _check_common(
    epsilon: float | None, noise_multiplier: float | None, delta: float, rounds: int, name: str
) -> None:
    if (epsilon is None) == (noise_multiplier is None):
        raise StudyConfigurationError(f"{name}: give either epsilon or noise_multiplier")
    if epsilon is not None and not (math.isfinite(epsilon) and epsilon > 0):
        raise StudyConfigurationError(f"{name}: epsilon must be positive, got {epsilon!r}")
    if noise_multiplier is not None and not (
        math.isfinite(noise_multiplier) and noise_multiplier > 0
    ):
        raise StudyConfigurationError(f"{name}: noise_multiplier must be positive")
    if not 0 < delta < 1:
        raise StudyConfigurationError(f"{name}: delta must be in (0, 1), got {delta!r}")
    if type(rounds) is not int or rounds < 1:
        raise StudyConfigurationError(f"{name}: rounds must be a positive integer")


@dataclass(frozen=True)
class RecordDP:
    """Record-level DP at every site.

    Parameters
    ----------
    epsilon, delta:
        The fit's target guarantee per site (RDP accountant); or give
        ``noise_multiplier`` instead of ``epsilon``.
    rounds:
        Noisy Newton rounds (the budget is split over them).
    bounds:
        Public range ``(low, high)`` of every numeric design column (by design
        column name, e.g. ``{"age": (18, 100)}``), from the study
        specification, never from the data. Columns are mapped to
        ``[-1, 1]`` and values outside are clipped. 0/1 dummies of
        categorical terms need none.
    row_norm:
        Bound ``B`` on each patient's scaled design row (default: the square
        root of the number of formula terms, which the scaling guarantees).
    """

    epsilon: float | None = None
    delta: float = 1e-6
    rounds: int = 4
    noise_multiplier: float | None = None
    bounds: Mapping[str, tuple[float, float]] = field(default_factory=dict)
    row_norm: float | None = None

    def __post_init__(self) -> None:
        _check_common(self.epsilon, self.noise_multiplier, self.delta, self.rounds, "RecordDP")
        if self.row_norm is not None and not (math.isfinite(self.row_norm) and self.row_norm > 0):
            raise StudyConfigurationError("RecordDP: row_norm must be positive")

    def schedule(self) -> list[Release]:
        """Every Gaussian release a site makes for the fit, with its share of the budget.

        Round 0 releases the counts; every round the score; the rounds of
        :func:`information_rounds` also the information, which later rounds
        reuse. The final score carries the largest share: a Newton step from
        a nearby point lands at ``beta_hat + H^-1 xi_T`` whatever the earlier
        noise, so its noise ``xi_T`` dominates the error; the last
        information, which preconditions that step, comes next.
        """
        plan = [Release(0, "n_obs", WEIGHTS["counts"])]
        informed = information_rounds(self.rounds)
        for t in range(1, self.rounds + 1):
            if t == self.rounds:
                plan.append(Release(t, "gradient", WEIGHTS["final gradient"]))
            else:
                plan.append(
                    Release(t, "gradient", WEIGHTS["first gradient" if t == 1 else "gradient"])
                )
            if t in informed:
                last = t == max(informed)
                plan.append(
                    Release(
                        t, "hessian", WEIGHTS["second information" if last else "first information"]
                    )
                )
        return plan

    @property
    def releases(self) -> int:
        """Gaussian mechanisms per site over the whole fit."""
        return len(self.schedule())

    def noise_multipliers(self) -> dict[tuple[int, str], float]:
        """Noise multiplier of each release in :meth:`schedule`, by (round, group).

        For a target ``epsilon`` the multipliers are ``sigma_i = sigma_1 *
        sqrt(W / w_i)``, with ``sigma_1`` the single-Gaussian multiplier for
        ``(epsilon, delta)`` and ``W`` the sum of the weights: Gaussian RDP
        ``alpha / (2 sigma^2)`` is linear in ``1 / sigma^2``, so the
        composition equals that one Gaussian exactly (Mironov 2017, Prop. 7).
        An explicit ``noise_multiplier`` applies to every release.
        """
        plan = self.schedule()
        if self.noise_multiplier is not None:
            return {(r.round, r.group): self.noise_multiplier for r in plan}
        single = accounting.calibrate_gaussian(self.epsilon, self.delta, compositions=1)
        total = sum(r.weight for r in plan)
        return {(r.round, r.group): single * math.sqrt(total / r.weight) for r in plan}

    def planned_event(
        self, sigmas: dict[tuple[int, str], float] | None = None
    ) -> dp_accounting.DpEvent:
        """Every Gaussian mechanism a site will run for the fit, composed.

        ``sigmas``: the fit's :meth:`noise_multipliers`, when already computed.
        """
        sigmas = self.noise_multipliers() if sigmas is None else sigmas
        return dp_accounting.ComposedDpEvent(
            [dp_accounting.GaussianDpEvent(s) for s in sigmas.values()]
        )


def information_rounds(rounds: int) -> set[int]:
    """Rounds that release the information matrix; the others reuse the latest one.

    The first round, and the last but one: its information, at a point a few
    Newton steps from the start, preconditions the final step and gives the
    standard errors.
    """
    return {1} if rounds <= 2 else {1, rounds - 1}


@dataclass(frozen=True)
class Release:
    """One Gaussian release of a private fit: its round (0: counts), group and budget weight."""

    round: int
    group: str
    weight: float


WEIGHTS = {
    "counts": 0.25,
    "first gradient": 0.5,
    "first information": 2.0,
    "second information": 8.0,
    "gradient": 2.0,
    "final gradient": 8.0,
}
"""Shares of a fit's budget by release (relative; only their ratios matter). Chosen on
``benchmarks/dp_logistic.py``'s synthetic study (10 sites, 8 covariates), where the
information's noise, not the score's, limited accuracy most."""


@dataclass(frozen=True)
class ClientDP:
    """Client-level DP at the coordinator: clip each site's score and information, noise the sum.

    ``gradient_clip`` and ``hessian_clip`` bound one site's score (L2 norm)
    and information (Frobenius norm) in the scaled design coordinates; they
    must come from the study plan, not from the sites' data.
    """

    epsilon: float | None = None
    delta: float = 1e-6
    rounds: int = 4
    noise_multiplier: float | None = None
    gradient_clip: float = 0.0
    hessian_clip: float = 0.0
    bounds: Mapping[str, tuple[float, float]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        _check_common(self.epsilon, self.noise_multiplier, self.delta, self.rounds, "ClientDP")
        if not (self.gradient_clip > 0 and self.hessian_clip > 0):
            raise StudyConfigurationError(
                "ClientDP needs gradient_clip and hessian_clip > 0 (bounds on one site's score "
                "and information, fixed in the study plan)"
            )

    @property
    def releases(self) -> int:
        """The score every round, the information in :func:`information_rounds`."""
        return self.rounds + len(information_rounds(self.rounds))

    def sigma(self) -> float:
        if self.noise_multiplier is not None:
            return self.noise_multiplier
        return accounting.calibrate_gaussian(self.epsilon, self.delta, compositions=self.releases)


COORDINATOR = "coordinator"
"""The owner of the coordinator's client-level scope in its ledger."""


def coordinator_scope(study: str) -> accounting.Scope:
    """The coordinator's client-level privacy scope of ``study`` (unit: one site)."""
    return accounting.Scope(unit="site", owner=COORDINATOR, study=study)


def privacy_levels(privacy: Any, client_type: type, expected: str) -> tuple[RecordDP | None, Any]:
    """Split a fit's ``privacy=`` into its record-level and client-level options.

    ``privacy`` is ``None``, one option, or a tuple of at most one
    :class:`RecordDP` and one ``client_type`` option; anything else raises
    :class:`~fedstats.errors.StudyConfigurationError` saying what is
    ``expected``.
    """
    if privacy is None:
        return None, None
    options = privacy if isinstance(privacy, tuple) else (privacy,)
    record = [o for o in options if isinstance(o, RecordDP)]
    client = [o for o in options if isinstance(o, client_type)]
    if len(record) + len(client) != len(options) or len(record) > 1 or len(client) > 1:
        raise StudyConfigurationError(f"privacy must be {expected}")
    return (record[0] if record else None), (client[0] if client else None)


def coordinator_ledger(federation: Any) -> accounting.Ledger:
    """The federation's coordinator ledger, which client-level privacy needs."""
    if federation.ledger is None:
        raise StudyConfigurationError(
            "client-level privacy needs a coordinator ledger: Federation(..., ledger=Ledger(path))"
        )
    return federation.ledger


def preview_coordinator_budget(
    federation: Any, planned: dp_accounting.DpEvent, what: str, remedy: str
) -> None:
    """Refuse, before anything is sent or charged, a ``planned`` client-level release sequence
    the coordinator's budget cannot pay for (:class:`~fedstats.errors.PlannedBudgetError`,
    naming the budget, what is spent and what the plan would bring it to)."""
    preview = coordinator_ledger(federation).preview(coordinator_scope(federation.study), planned)
    if not preview.fits:
        raise PlannedBudgetError(
            f"the planned {what} (epsilon {preview.epsilon_event:.4g} on its own) would take the "
            f"coordinator's client-level budget for study {federation.study!r} from epsilon "
            f"{preview.epsilon_before:.4g} to {preview.epsilon_after:.4g}, over its budget of "
            f"{preview.budget_epsilon:.4g} at delta {preview.delta:g}; nothing was charged or "
            f"released. {remedy}"
        )


@dataclass(frozen=True)
class ScopeSpending:
    """What one privacy scope paid for a fit, and where it stands."""

    unit: str  # "patient" or "site"
    owner: str
    epsilon: float  # this fit's events, RDP
    epsilon_pld: float | None  # this fit's events, PLD
    delta: float
    cumulative_epsilon: float | None  # the scope's ledger after the fit (RDP)
    budget_epsilon: float | None
    noise_multipliers: tuple[float, ...]
    releases: int
    fixed_seed: bool


def site_spending(
    site: str,
    event: dp_accounting.DpEvent,
    delta: float,
    reply: Mapping[str, Any],
    noise_multipliers: tuple[float, ...],
    releases: int,
) -> ScopeSpending:
    """What one site's record-level scope paid for a fit's ``event``, and where it now stands.

    The cumulative figures are the public facts the site added to its last
    private reply (:data:`fedstats.site.private_release.DP_REPLY_FIELDS`).
    """
    rdp, pld = fit_epsilon(event, delta)
    return ScopeSpending(
        unit="patient",
        owner=site,
        epsilon=rdp,
        epsilon_pld=pld,
        delta=delta,
        cumulative_epsilon=reply.get("dp_epsilon_spent"),
        budget_epsilon=reply.get("dp_budget_epsilon"),
        noise_multipliers=noise_multipliers,
        releases=releases,
        fixed_seed=bool(reply.get("dp_fixed_seed", False)),
    )


def coordinator_spending(
    federation: Any,
    event: dp_accounting.DpEvent,
    noise_multipliers: tuple[float, ...],
    releases: int,
    delta: float | None = None,
) -> ScopeSpending:
    """What the coordinator's client-level scope paid for a fit's ``event``, and where it now
    stands (its ledger's RDP figures). ``delta`` defaults to the delta of the coordinator's
    budget, the one its ledger enforces."""
    spent = coordinator_ledger(federation).spent(coordinator_scope(federation.study), pld=False)
    delta = spent.delta if delta is None else delta
    rdp, pld = fit_epsilon(event, delta)
    return ScopeSpending(
        unit="site",
        owner=COORDINATOR,
        epsilon=rdp,
        epsilon_pld=pld,
        delta=delta,
        cumulative_epsilon=spent.epsilon,
        budget_epsilon=spent.budget_epsilon,
        noise_multipliers=noise_multipliers,
        releases=releases,
        fixed_seed=federation.noise_seed is not None,
    )


def preview_site_budgets(
    federation: Any,
    planned: dp_accounting.DpEvent,
    analysis: str,
    *,
    what: str = "fit",
    sites: list[str] | None = None,
) -> None:
    """Ask every site whether the whole planned ``what`` fits its budget, before any charge.

    Raises :class:`~fedstats.errors.PlannedBudgetError` naming each site that
    could not pay, with its spent and budgeted epsilon; the only messages
    exchanged are the ``privacy.status`` requests, which release nothing
    about patients.
    """
    replies = federation.request(
        "privacy.status",
        {"study": federation.study, "planned": accounting.event_to_json(planned)},
        analysis=analysis,
        sites=sites,
    )
    short = {s: r for s, r in replies.items() if not r["fits"]}
    if short:
        detail = "; ".join(
            f"{s}: spent {r['epsilon_spent']:.4g} of {r['budget_epsilon']:.4g}"
            for s, r in short.items()
        )
        raise PlannedBudgetError(
            f"the planned {what} would exceed the privacy budget of {sorted(short)} ({detail}); "
            "nothing was charged or released. Lower the rounds or epsilon, or ask the sites."
        )


@dataclass(frozen=True)
class PrivacyAccount:
    """The privacy a fit spent, per scope, with the mechanisms it used."""

    scopes: tuple[ScopeSpending, ...]
    rounds: int
    row_norm: float | None
    neighbouring: str = "add or remove one"
    secure_aggregation: Mapping[str, Any] | None = None
    """How the sums were aggregated when secure aggregation was used: protocol,
    threshold ``t``, sites, fixed-point bits, sessions, and each dropout."""

    def with_secure_aggregation(self, record: Mapping[str, Any]) -> PrivacyAccount:
        return dataclasses.replace(self, secure_aggregation=dict(record))

    def to_frame(self):
        import pandas as pd

        return pd.DataFrame([s.__dict__ for s in self.scopes])

    def notes(self) -> list[str]:
        out = []
        for s in self.scopes:
            level = "record-level" if s.unit == "patient" else "client-level"
            pld = f", PLD {s.epsilon_pld:.3f}" if s.epsilon_pld is not None else ""
            total = (
                f"; ledger now {s.cumulative_epsilon:.3f} of {s.budget_epsilon:.3f}"
                if s.cumulative_epsilon is not None
                else ""
            )
            out.append(
                f"{level} DP at {s.owner}: this fit epsilon {s.epsilon:.3f} (RDP{pld}) at delta "
                f"{s.delta:g}, {s.releases} Gaussian releases, noise multipliers "
                f"{min(s.noise_multipliers):.3f}-{max(s.noise_multipliers):.3f}{total}"
                + ("; FIXED NOISE SEED" if s.fixed_seed else "")
            )
        if self.secure_aggregation:
            sa = self.secure_aggregation
            out.append(
                f"secure aggregation: the coordinator saw only sums of {sa['sites']} sites "
                f"(threshold {sa['threshold']}, {sa['sessions']} sessions, "
                f"{len(sa['dropouts'])} dropouts); each site added 1/sqrt({sa['threshold']}) of "
                "the noise"
            )
        return out


def fit_epsilon(event: dp_accounting.DpEvent, delta: float) -> tuple[float, float | None]:
    """RDP and PLD epsilon of one fit's events at ``delta`` (PLD ``None`` if unsupported)."""
    rdp = accounting.rdp_epsilon([event], delta)
    try:
        pld = accounting.pld_epsilon([event], delta)
    except accounting.UnsupportedMechanism:
        pld = None
    return rdp, pld


def feature_scaling(
    layout: DesignLayout,
    columns: tuple[str, ...],
    bounds: Mapping[str, tuple[float, float]],
    sites: tuple[str, ...],
) -> np.ndarray:
    """Per-column ``(centre, half-width)`` mapping public bounds to ``[-1, 1]``.

    Intercepts and dummies of categorical terms keep ``(0, 1)``. Without an
    intercept column numeric columns are only scaled (centre 0), since a
    shift could not be absorbed.
    """
    intercepts = {"Intercept"} | {SITE_COLUMN.format(s) for s in sites}
    has_intercept = bool(intercepts & set(columns))
    unknown = sorted(set(bounds) - set(columns))
    if unknown:
        raise FormulaError(
            f"bounds were given for {unknown}, which are not design columns "
            f"(the design has {list(columns)})"
        )
    missing = [
        c
        for c in columns
        if c not in intercepts and c not in layout.categorical and c not in bounds
    ]
    if missing:
        raise FormulaError(
            f"a private fit needs public bounds for the numeric design columns {missing}: "
            "pass bounds={'column': (low, high), ...} from the study specification"
        )
    scaling = np.tile([0.0, 1.0], (len(columns), 1))
    for j, name in enumerate(columns):
        if name in bounds:
            low, high = (float(v) for v in bounds[name])
            if not (math.isfinite(low) and math.isfinite(high) and high > low):
                raise FormulaError(f"bounds for {name!r} must be finite with low < high")
            if has_intercept:
                scaling[j] = ((low + high) / 2, (high - low) / 2)
            else:
                scaling[j] = (0.0, max(abs(low), abs(high)))
    return scaling


def unscale(columns: tuple[str, ...], scaling: np.ndarray, sites: tuple[str, ...]) -> np.ndarray:
    """Matrix ``A`` with ``beta = A beta'`` from scaled to original design coordinates.

    ``x'_j = (x_j - c_j) / h_j`` gives ``beta_j = beta'_j / h_j`` and each
    intercept absorbs ``- sum_j beta'_j c_j / h_j``.
    """
    intercepts = {"Intercept"} | {SITE_COLUMN.format(s) for s in sites}
    A = np.diag(1.0 / scaling[:, 1])
    for k, name in enumerate(columns):
        if name in intercepts:  # intercepts have centre 0, so their own entries stay 0 here
            A[k, :] = -scaling[:, 0] / scaling[:, 1]
            A[k, k] = 1.0
    return A
