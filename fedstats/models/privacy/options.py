"""The privacy options of a fit: record-level (RecordDP) and client-level (ClientDP).

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

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import dp_accounting

import accounting
from fedstats.errors import StudyConfigurationError


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

    def schedule(self, informed: set[int] | None = None) -> list[Release]:
        """Every Gaussian release a site makes for the fit, with its share of the budget.

        Round 0 releases the counts; every round the score; the rounds of
        :func:`information_rounds` also the information, which later rounds
        reuse. The final score carries the largest share: a Newton step from
        a nearby point lands at ``beta_hat + H^-1 xi_T`` whatever the earlier
        noise, so its noise ``xi_T`` dominates the error; the last
        information, which preconditions that step, comes next. ``informed``
        replaces :func:`information_rounds` (a Cox fit's information changes
        with the baseline hazard, so it is released every round).
        """
        plan = [Release(0, "n_obs", WEIGHTS["counts"])]
        informed = information_rounds(self.rounds) if informed is None else informed
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

    def noise_multipliers(self, informed: set[int] | None = None) -> dict[tuple[int, str], float]:
        """Noise multiplier of each release in :meth:`schedule`, by (round, group).

        For a target ``epsilon`` the multipliers are ``sigma_i = sigma_1 *
        sqrt(W / w_i)``, with ``sigma_1`` the single-Gaussian multiplier for
        ``(epsilon, delta)`` and ``W`` the sum of the weights: Gaussian RDP
        ``alpha / (2 sigma^2)`` is linear in ``1 / sigma^2``, so the
        composition equals that one Gaussian exactly (Mironov 2017, Prop. 7).
        An explicit ``noise_multiplier`` applies to every release.
        """
        plan = self.schedule(informed)
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


CLIENT_LEVEL_NAMES = {
    "ClientDP": "fedstats.ClientDP is client-level DP of the statistical models' Newton "
    "steps; a network's client-level DP is DP-FedAvg (McMahan et al., ICLR 2018): "
    "fedstats.DPFedAvg(...) or DPFedAvg.for_budget(epsilon, delta, rounds, ...)",
    "DPFedAvg": "fedstats.DPFedAvg is client-level DP of a network's averaged updates "
    "(FederatedTrainer); a statistical model's client-level DP clips each site's score and "
    "information: fedstats.ClientDP(epsilon=..., gradient_clip=..., hessian_clip=...)",
}
"""Said when one client-level option is given where the other belongs: both are client-level
DP at the coordinator, of different mechanisms (Newton steps, averaged network updates)."""


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
        others = [type(o).__name__ for o in options if not isinstance(o, (RecordDP, client_type))]
        raise StudyConfigurationError(
            f"privacy must be {expected}"
            + "".join(f"; {CLIENT_LEVEL_NAMES[n]}" for n in others if n in CLIENT_LEVEL_NAMES)
        )
    return (record[0] if record else None), (client[0] if client else None)
