"""TPR-parity penalty for federated logistic regression, and the smallest penalty that suffices.

The penalised fit minimises

    F(w) = -sum_s l_s(w) + gamma * sum_{g < h} (TPR_g(w) - TPR_h(w))^2,

with the smooth true-positive rate ``TPR_g(w) = soft_g / positives_g`` of
group ``g`` (:mod:`fedstats.site.handlers.fairness`; sigmoid of the linear predictor
over a temperature ``T``). With two groups the penalty is
``(TPR_A - TPR_B)^2``, the equal-opportunity gap of Hardt, Price & Srebro
(NeurIPS 2016) made differentiable. Groups are the sites (``groups="site"``)
or the levels of a column (e.g. ``"sex"``) across all sites.

Each round the coordinator gets the log-likelihood's score and information
(``logistic.summaries``) and the groups' sums (``fairness.summaries``), and
takes a Newton step with the Gauss–Newton information of the penalty,
``H + 2 gamma sum_{g<h} d_gh d_gh'`` with ``d_gh = grad TPR_g - grad TPR_h``,
backtracking until ``F`` decreases (Armijo). ``disparity`` is
``max_g TPR_g - min_g TPR_g`` of the smooth rates (what is penalised; counts
of true positives at a threshold are not released, as they may be small
cells). The AUC counts positive-negative pairs within sites.

:func:`minimal_penalty` finds the smallest ``gamma`` whose fit has
``disparity <= delta_max``: doubling from 1 until it holds, then bisection,
refitting from the previous solution each time. It returns the path of
every ``gamma`` tried with its loss, AUC and disparity.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from fedstats.contract.design import Level, normalise_level
from fedstats.contract.fairness import PARITY_FIELDS, penalised
from fedstats.contract.path_rules import FAIR_PATH
from fedstats.contract.paths import summed
from fedstats.contract.tasks.fairness import SITE_GROUPS, TASK
from fedstats.errors import StudyConfigurationError
from fedstats.models.agree import Agreement, agreed_levels
from fedstats.models.federation import Federation
from fedstats.models.path_relay import PathRelay


@dataclass(frozen=True)
class FairFit:
    """One penalised fit: coefficients and what they cost and achieve."""

    gamma: float
    params: pd.Series
    loss: float  # -loglik / N
    disparity: float
    tpr: pd.Series  # smooth TPR by group
    auc: float
    iterations: int
    converged: bool


@dataclass(frozen=True)
class MinimalPenalty:
    """The smallest sufficient ``gamma``, its fit, and every ``gamma`` tried."""

    gamma: float
    fit: FairFit
    path: pd.DataFrame  # gamma, loss, auc, disparity (sorted by gamma)
    delta_max: float

    @property
    def auc_cost(self) -> float:
        """AUC lost against the unpenalised fit."""
        return float(self.path.loc[self.path["gamma"] == 0.0, "auc"].iloc[0] - self.fit.auc)


class _Problem:
    """The penalised objective at given coefficients, from the sites' replies."""

    def __init__(
        self,
        model,
        federation: Federation,
        groups: str,
        levels: Sequence[Level] | None,
        temperature: float,
    ) -> None:
        self.federation = federation
        self.analysis = federation.new_analysis("fairness")
        agreement: Agreement = model.agree(federation, self.analysis)
        self.spec = agreement.spec
        self.design = agreement.spec.to_wire()
        self.names = list(self.spec.columns)
        self.n = float(sum(agreement.counts.n_obs.values()))
        if groups == SITE_GROUPS:
            self.levels: list = list(federation.sites)
        elif levels is not None:
            self.levels = [normalise_level(v) for v in levels]
        else:
            self.levels = list(agreed_levels(federation, groups, self.analysis))
        if len(self.levels) < 2:
            raise StudyConfigurationError(f"{groups!r} has fewer than two groups")
        self.groups = groups
        self.temperature = temperature

    def evaluate(self, beta: np.ndarray, gamma: float, base: np.ndarray, path: PathRelay) -> dict:
        """The penalised objective at ``beta`` (stepped from ``base``), from one request per
        point: the groups' sums with the likelihood's (:mod:`fedstats.contract.fairness`)."""
        args = {**self._group_args(beta, auc=False), "likelihood": True, "gamma": float(gamma)}
        replies = self.federation.request(
            TASK, path.arguments(args, beta, base), analysis=self.analysis
        )
        path.answered(beta, base)
        try:
            state = penalised({f: summed(replies, f) for f in PARITY_FIELDS}, float(gamma))
        except ValueError:
            positives = sum(r["positives"] for r in replies.values())
            empty = [str(self.levels[g]) for g in np.flatnonzero(positives == 0)]
            raise StudyConfigurationError(
                f"group(s) {empty} have no patient with the outcome"
            ) from None
        return {
            "state": (state.objective, state.descent, state.curvature),
            "loglik": state.loglik,
            "tpr": state.tpr,
            "replies": replies,
        }

    def _group_args(self, beta: np.ndarray, auc: bool) -> dict:
        return {"design": self.design, "beta": beta, "group": self.groups,
                "levels": self.levels, "temperature": self.temperature, "auc": auc}  # fmt: skip

    def auc(self, beta: np.ndarray) -> float:
        """The within-site AUC at ``beta`` (pair counts summed over sites)."""
        replies = self.federation.request(
            TASK, self._group_args(beta, auc=True), analysis=self.analysis
        )
        correct = sum(r["auc_concordant"] + r["auc_tied"] / 2 for r in replies.values())
        return float(correct / max(sum(r["auc_pairs"] for r in replies.values()), 1))

    def fit(
        self, gamma: float, start: np.ndarray, maxiter: int = 100, tol: float = 1e-9
    ) -> tuple[FairFit, np.ndarray]:
        """Newton steps on the penalised objective with Armijo backtracking
        (:data:`FAIR_PATH`, the rule every site re-derives), from ``start``: zeros, or the
        end of the previous fit along the penalty."""
        path = PathRelay(self.federation)
        beta = start.copy()
        state = self.evaluate(beta, gamma, beta, path)
        converged = polished = False
        iterations = 0
        while iterations < maxiter:
            iterations += 1
            objective, descent, curvature = state["state"]
            found = FAIR_PATH.step(state["replies"], beta, {"gamma": gamma})
            if found is None:
                break  # the curvature became singular: the fit stops where it is
            step = found[0]
            for halving in range(FAIR_PATH.max_trials):
                trial = self.evaluate(beta + step / 2**halving, gamma, beta, path)
                if halving == FAIR_PATH.max_trials - 1 or FAIR_PATH.improves(
                    trial["state"][0], objective, descent, curvature, halving
                ):
                    break
            change = trial["state"][0] - objective
            beta, state = beta + step / 2**halving, trial
            if abs(change) <= tol * (1 + abs(state["state"][0])):
                # one more Newton step after the first small change: the objective's change
                # is quadratic in the remaining error, so stopping at it leaves the
                # coefficients only ~sqrt(tol) from the optimum
                if polished:
                    converged = True
                    break
                polished = True
        tpr = pd.Series(state["tpr"], index=self.levels, name="tpr")
        fit = FairFit(
            gamma=float(gamma),
            params=pd.Series(beta, index=self.names, name="coef"),
            loss=-state["loglik"] / self.n,
            disparity=float(tpr.max() - tpr.min()),
            tpr=tpr,
            auc=self.auc(beta),
            iterations=iterations,
            converged=converged,
        )
        return fit, beta


def fit_penalized(
    model,
    federation: Federation,
    *,
    groups: str,
    gamma: float,
    levels: Sequence[Level] | None = None,
    temperature: float = 0.25,
) -> FairFit:
    """One fit of ``model`` with the TPR-parity penalty of weight ``gamma``."""
    if not (gamma >= 0 and np.isfinite(gamma)):
        raise StudyConfigurationError(f"gamma must be >= 0, got {gamma!r}")
    problem = _Problem(model, federation, groups, levels, temperature)
    fit, _ = problem.fit(gamma, np.zeros(len(problem.names)))
    return fit


def minimal_penalty(
    model,
    federation: Federation,
    *,
    groups: str,
    delta_max: float,
    levels: Sequence[Level] | None = None,
    temperature: float = 0.25,
    gamma_max: float = 1e6,
    bisections: int = 12,
) -> MinimalPenalty:
    """The smallest ``gamma`` whose fit has ``disparity <= delta_max``, and the path of fits."""
    if not 0 < delta_max < 1:
        raise StudyConfigurationError(f"delta_max must be in (0, 1), got {delta_max!r}")
    problem = _Problem(model, federation, groups, levels, temperature)
    fits: dict[float, FairFit] = {}
    fit, beta = problem.fit(0.0, np.zeros(len(problem.names)))
    fits[0.0] = fit
    if fit.disparity <= delta_max:
        return MinimalPenalty(0.0, fit, _path(fits), delta_max)
    low, high = 0.0, 1.0
    while True:
        fit, beta = problem.fit(high, beta)
        fits[high] = fit
        if fit.disparity <= delta_max:
            break
        low, high = high, high * 2
        if high > gamma_max:
            raise StudyConfigurationError(
                f"no gamma up to {gamma_max:g} brings the disparity to {delta_max}; the last "
                f"fit's is {fit.disparity:.4f}"
            )
    best = fits[high]
    for _ in range(bisections):
        middle = (low + high) / 2
        fit, beta = problem.fit(middle, beta)
        fits[middle] = fit
        if fit.disparity <= delta_max:
            high, best = middle, fit
        else:
            low = middle
    return MinimalPenalty(high, best, _path(fits), delta_max)


def _path(fits: dict[float, FairFit]) -> pd.DataFrame:
    rows = [
        {"gamma": f.gamma, "loss": f.loss, "auc": f.auc, "disparity": f.disparity}
        for f in fits.values()
    ]
    return pd.DataFrame(rows).sort_values("gamma", ignore_index=True)
