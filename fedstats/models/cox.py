"""Federated Cox proportional hazards regression, stratified by site (exact).

The stratified Cox model (Kalbfleisch & Prentice, *The Statistical Analysis
of Failure Time Data*, 2nd ed., 2002, section 4.4) gives each stratum its own
baseline hazard and shares the coefficients. Its log partial likelihood is a
sum over strata, so with every stratum inside one site it is a sum over sites:
each round the coordinator sends ``beta``, every site returns its log partial
likelihood, score and information (:mod:`fedstats.site.handlers.cox`, ties by Breslow
or Efron) and the coordinator takes the Newton step on the sums. The iterates
are those of the pooled stratified fit; the estimate equals it (as in Lu et
al., "WebDISCO", JAMIA 2015, whose sites return the same aggregates).

Pooled baseline (``strata=None``): one baseline hazard across sites. The
partial likelihood then needs risk sets spanning sites, so sites return
risk-set and tied-event sums on a shared time grid
(:mod:`fedstats.site.handlers.cox`, times coarsened up to the next grid point, each
site's follow-up ending at its safe horizon) and the coordinator evaluates
the Breslow or Efron partial likelihood from their totals
(:func:`fedstats.cox_math.grid_partial_likelihood`); on a grid holding every
distinct time it is the pooled fit. Breslow's baseline cumulative hazard
comes with it.

Strata rule: ``strata="site"`` makes each site one stratum; ``strata=[...]``
names columns whose combined values stratify *within* each site, so the
strata are (site, values) pairs — two sites never share a stratum, since a
stratum shared across sites would need risk sets spanning sites.

Ridge penalty (``penalizer=lam``): maximise ``l(beta) - n lam / 2 ||beta||^2``
with ``n`` patients, the objective of statsmodels'
``PHReg.fit_regularized(alpha=lam, L1_wt=0)`` (lifelines penalises the
coefficients of standardised covariates instead); the reported covariance is
the inverse penalised information.

Convergence: on the Newton decrement ``g^T H^-1 g`` of the penalised
objective, which does not depend on the covariates' scales
(:mod:`fedstats.contract.newton`); the partial likelihood is concave, and a step
that lowers it is halved (at most 20 times). The estimate is the last
evaluated point, so its information and log partial likelihood are its own.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import numpy as np
import pandas as pd

from fedstats.contract.design import Level, counting_outcome
from fedstats.contract.dp_request import DpRequest
from fedstats.contract.newton import (
    DECREMENT_TOL,
    check_rank,
    damped_newton,
    inverse_information,
)
from fedstats.contract.paths import PATH_KEY
from fedstats.contract.tasks.cox import CONCORDANCE_TASK, GRID_TASK, ROBUST_TASK
from fedstats.cox_math import TIES, GridSums, WeightedGridSums, grid_partial_likelihood
from fedstats.errors import ConvergenceWarning, FormulaError, StudyConfigurationError
from fedstats.models.agree import Agreement, agree_design
from fedstats.models.federation import Federation
from fedstats.models.kaplan_meier import time_grid
from fedstats.models.path_relay import PathRelay, fit_evidence
from fedstats.models.privacy import RecordDP
from fedstats.models.results import CoxPHResults, Provenance
from fedstats.models.secure_aggregation import SecureAggregation, secure_note, summed_replies
from fedstats.models.utility import discarded_events_warning, warn

SITE = "site"


class CoxPH:
    """Federated Cox proportional hazards regression whose answer equals the pooled fit.

    Parameters
    ----------
    formula:
        ``"Surv(time, event) ~ age + sex + C(stage)"``: follow-up time (not
        negative) and event indicator (0/1) columns, then covariates as for
        :class:`fedstats.LogisticRegression`. No intercept is estimated.
        ``"Surv(start, stop, event) ~ ..."``: the counting-process form
        (Andersen & Gill, Ann Stat 1982), one row per interval
        ``(start, stop]`` of a patient's follow-up with the covariates it had
        then; a patient with time-varying covariates has several rows (the
        sites' frames index each row by its patient), and ``start > 0`` is
        delayed entry. A row is at risk at ``t`` when ``start < t <= stop``.
        Not with ``robust``, ``cluster``, ``privacy`` or
        :func:`concordance_index`, which read one row as one patient.
    strata:
        ``"site"`` (default): one baseline hazard per site. A list of
        columns: one per combination of their values within each site
        (``"site"`` may be listed too; it always applies). ``None``: one
        baseline across sites, on the time grid below.
    grid, width, horizon:
        The pooled model's time grid: points, or steps of ``width`` up to
        ``horizon`` (as for :class:`fedstats.KaplanMeier`).
    ties:
        ``"efron"`` (default, as lifelines and R) or ``"breslow"``.
    penalizer:
        Ridge penalty ``lam >= 0`` (see the module docstring).
    robust, cluster:
        Robust (sandwich) standard errors ``I^-1 (sum_c U_c U_c') I^-1`` from
        Breslow-type score residuals ``U`` summed over clusters (Lin & Wei,
        JASA 1989): each patient (``robust=True``) or each value of the
        ``cluster`` column, within sites. Stratified models only.
    weights:
        A column of frequency weights (finite, ``>= 0``): row ``i`` counts as
        ``w_i`` patients in every risk set and event, Breslow's and Efron's
        partial likelihoods as R's ``coxph(weights=)`` and lifelines'
        ``weights_col`` define them (Efron's ``d`` tied events take their mean
        weight, so with Efron ties a weighted event row is one event, not
        ``w_i`` tied ones). Not with ``robust``, ``cluster`` or ``privacy``.
    levels, missing, maxiter, tol:
        As for :class:`fedstats.LogisticRegression`.

    Examples
    --------
    >>> res = CoxPH("Surv(time, event) ~ age + C(stage)", strata="site").fit(fed)  # doctest: +SKIP
    >>> res.hazard_ratios()                                                      # doctest: +SKIP
    """

    def __init__(
        self,
        formula: str,
        *,
        strata: str | Sequence[str] | None = SITE,
        ties: str = "efron",
        penalizer: float = 0.0,
        levels: Mapping[str, Sequence[Level]] | None = None,
        missing: str = "raise",
        maxiter: int = 50,
        tol: float = DECREMENT_TOL,
        grid: Sequence[float] | np.ndarray | None = None,
        width: float | None = None,
        horizon: float | None = None,
        robust: bool = False,
        cluster: str | None = None,
        weights: str | None = None,
    ) -> None:
        if not isinstance(formula, str):
            raise FormulaError(f"formula must be a string, got {type(formula).__name__}")
        if ties not in TIES:
            raise StudyConfigurationError(f"ties must be one of {TIES}, got {ties!r}")
        self.grid: np.ndarray | None = None
        if strata is None or grid is not None or width is not None or horizon is not None:
            try:
                self.grid = time_grid(grid, width, horizon)
            except StudyConfigurationError as error:
                raise StudyConfigurationError(
                    "the pooled-baseline Cox model (strata=None) and private Cox fits work on a "
                    f"shared time grid: {error}"
                ) from None
        names = [] if strata is None else [strata] if isinstance(strata, str) else list(strata)
        if not all(isinstance(n, str) and n for n in names):
            raise StudyConfigurationError("strata must be 'site' or a list of column names")
        if not (isinstance(penalizer, int | float) and np.isfinite(penalizer) and penalizer >= 0):
            raise StudyConfigurationError(f"penalizer must be a number >= 0, got {penalizer!r}")
        if type(maxiter) is not int or maxiter < 1:
            raise StudyConfigurationError(f"maxiter must be a positive integer, got {maxiter!r}")
        if not 0 < tol < 1:
            raise StudyConfigurationError(f"tol must be in (0, 1), got {tol!r}")
        if (robust or cluster is not None) and strata is None:
            raise StudyConfigurationError(
                "robust standard errors are offered for stratified models (strata='site' or "
                "columns), not yet for the pooled-baseline model"
            )
        if cluster is not None and not (isinstance(cluster, str) and cluster):
            raise StudyConfigurationError("cluster must name a column")
        self.counting = counting_outcome(_outcome_of(formula)) is not None
        if self.counting and (robust or cluster is not None):
            raise StudyConfigurationError(
                "robust standard errors are not offered for Surv(start, stop, event) yet: they "
                "would sum score residuals per patient across rows"
            )
        if weights is not None and (robust or cluster is not None):
            raise StudyConfigurationError(
                "robust standard errors are not offered with frequency weights yet: the score "
                "residuals would need the weights too"
            )
        if weights is not None and not (isinstance(weights, str) and weights):
            raise StudyConfigurationError("weights must name a column of frequency weights")
        self.weights = weights
        self.robust = bool(robust) or cluster is not None
        self.cluster = cluster
        self.formula = formula
        self.pooled = strata is None
        self.strata = tuple(n for n in names if n != SITE)
        self.ties = ties
        self.penalizer = float(penalizer)
        self.levels = dict(levels or {})
        self.missing = missing
        self.maxiter = maxiter
        self.tol = tol

    def __repr__(self) -> str:
        strata = None if self.pooled else ["site", *self.strata]
        return f"CoxPH({self.formula!r}, strata={strata}, ties={self.ties!r})"

    def agree(
        self, federation: Federation, analysis: str, dp: DpRequest | None = None
    ) -> Agreement:
        """Agree on this model's survival design with every site (counts noisy with ``dp``)."""
        return agree_design(
            federation,
            self.formula,
            analysis=analysis,
            levels=self.levels,
            missing=self.missing,
            outcome_kind="survival",
            strata=self.strata,
            dp=dp,
            weights=self.weights,
        )

    def fit(
        self,
        federation: Federation,
        secure_aggregation: SecureAggregation | None = None,
        *,
        privacy: RecordDP | None = None,
    ) -> CoxPHResults:
        """Fit by federated Newton rounds on the stratified partial likelihood.

        ``secure_aggregation``: :class:`~fedstats.SecureAggregation`: the
        coordinator sees only the sums of the sites' statistics (and of the
        pooled model's grid sums), never one site's; every site must answer
        every round.

        ``privacy``: :class:`~fedstats.RecordDP` (each site protects its patients
        and charges its own ledger): noisy Newton rounds on the Cox model with a
        baseline hazard constant between the points of the model's time grid
        (:mod:`fedstats.models.cox_private`); ``bounds`` must cover every numeric
        design column.
        """
        if not isinstance(federation, Federation):
            raise StudyConfigurationError(
                f"fit() needs a fedstats.Federation, got {type(federation).__name__}"
            )
        if privacy is not None:
            if self.weights is not None:
                raise StudyConfigurationError(
                    "a private Cox fit takes no frequency weights: its noise is calibrated to one "
                    "patient per row"
                )
            if self.counting:
                raise StudyConfigurationError(
                    "the private Cox fit clips each row as one patient's contribution, which "
                    "does not hold for Surv(start, stop, event) (several rows per patient); fit "
                    "it exactly, or privately with one row per patient"
                )
            if not isinstance(privacy, RecordDP):
                raise StudyConfigurationError(
                    "Cox fits take privacy=fedstats.RecordDP(...) (record-level DP at every site)"
                )
            from fedstats.models.cox_private import fit_private_cox

            return fit_private_cox(self, federation, privacy, secure_aggregation)
        if self.grid is not None and not self.pooled:
            raise StudyConfigurationError(
                "a time grid is for the pooled model (strata=None) and for private fits; the "
                "exact stratified fit uses every event time within the site"
            )
        started = datetime.now(UTC)
        analysis = federation.new_analysis("cox")
        agreement = self.agree(federation, analysis)
        spec, counts = agreement.spec, agreement.counts
        names = list(spec.columns)
        p = len(names)
        ridge = self.penalizer * sum(counts.n_obs.values())
        design = spec.to_wire()
        last: dict[str, Any] = {}  # the pooled model's latest sums, and patients censored early

        evaluate = self._evaluator(federation, design, analysis, secure_aggregation, ridge, last)
        beta = np.zeros(p)
        objective, score, information, loglik = evaluate(beta, beta)
        if sum(counts.n_events.values()) == 0:
            raise StudyConfigurationError("no site has an event: the Cox model cannot be fitted")
        if self.pooled and not last["sums"].d.any():
            raise StudyConfigurationError(
                "no site could release an event on this time grid: each site's follow-up ends "
                "before its first interval with fewer than k events or leavers (patients "
                f"censored early: {last['truncated']}); use a coarser grid"
            )
        check_rank(information, names)
        beta, (objective, score, information, loglik), converged, rounds, notes = damped_newton(
            evaluate,
            beta,
            (objective, score, information, loglik),
            names,
            tol=self.tol,
            maxiter=self.maxiter,
        )
        if not converged and not notes:
            message = f"Newton's method did not converge in {self.maxiter} rounds"
            warnings.warn(message, ConvergenceWarning, stacklevel=2)
            notes.append(message)
        if self.weights:
            notes.append(f"frequency weights {self.weights!r}")
        if self.penalizer:
            notes.append(
                f"ridge penalty {self.penalizer:g} x n / 2 x ||beta||^2 on the coefficients; "
                "standard errors from the penalised information"
            )
        if note := counts.dropped_note():
            notes.append(note)
        cov = inverse_information(information)
        if self.robust:
            cov = self._robust(federation, design, beta, cov, analysis, secure_aggregation, notes)
        baseline, events_used, problems = None, None, []
        if self.pooled:
            baseline = self._baseline(last["sums"], last["truncated"], notes)
            events_used = float(last["sums"].d.sum())
            problems = discarded_events_warning(events_used, sum(counts.n_events.values()))
            warn(problems)
        else:
            strata = ", ".join(["site", *self.strata])
            notes.append(f"stratified by {strata} (strata never span sites); ties: {self.ties}")
        if secure_aggregation is not None:
            notes.append(secure_note(secure_aggregation, len(federation.sites)))
        provenance = Provenance.of_fit(federation, analysis, counts, rounds, started)
        result = CoxPHResults(
            names=names,
            params=beta,
            cov=cov,
            llf=loglik,
            converged=converged,
            iterations=rounds,
            provenance=provenance,
            notes=notes,
            n_events=counts.n_events,
            ties=self.ties,
            strata=() if self.pooled else ("site", *self.strata),
            baseline=baseline,
            design=design,
            events_used=events_used,
            utility_warnings=problems,
        )
        result.path_evidence = fit_evidence(last.get("path"), last.get("request"), beta)
        return result

    def _evaluator(
        self,
        federation: Federation,
        design: dict[str, Any],
        analysis: str,
        secure_aggregation: SecureAggregation | None,
        ridge: float,
        last: dict[str, Any],
    ) -> Callable[[np.ndarray, np.ndarray], tuple[float, np.ndarray, np.ndarray, float]]:
        """One round's evaluation at ``beta`` (stepped from ``base``), from the sites' summed
        statistics: the pooled model's grid sums (kept in ``last``) or the stratified sites'
        own sums. Each request carries its path (:mod:`fedstats.contract.paths`) and the
        ridge, which the sites' path rule applies as this fit does."""
        p = len(design["columns"])
        path = PathRelay(federation)
        last["path"] = path

        def evaluate(
            beta: np.ndarray, base: np.ndarray
        ) -> tuple[float, np.ndarray, np.ndarray, float]:
            """Penalised objective, its score and information, and the log partial likelihood."""
            if self.pooled:
                sums, last["truncated"] = self._grid_sums(
                    federation, design, beta, analysis, secure_aggregation, path, base, ridge,
                    last,
                )  # fmt: skip
                last["sums"] = sums
                result = grid_partial_likelihood(sums, beta, self.ties)
                loglik, score, information = result.loglik, result.score, result.information
            else:
                args = {"design": design, "beta": beta, "ties": self.ties, "ridge": ridge}
                last["request"] = ("cox.summaries", args)
                sums = summed_replies(
                    federation,
                    "cox.summaries",
                    path.arguments(args, beta, base),
                    analysis=analysis,
                    secure=secure_aggregation,
                )
                path.answered(beta, base)
                loglik = float(sums["loglik"])
                score, information = sums["gradient"], sums["hessian"]
            penalised = loglik - ridge / 2 * float(beta @ beta)
            return penalised, score - ridge * beta, information + ridge * np.eye(p), loglik

        return evaluate

    def _robust(
        self,
        federation: Federation,
        design: dict[str, Any],
        beta: np.ndarray,
        cov: np.ndarray,
        analysis: str,
        secure_aggregation: SecureAggregation | None,
        notes: list[str],
    ) -> np.ndarray:
        """Lin & Wei's (1989) sandwich ``V M V`` from the sites' summed score cross-products."""
        meat = summed_replies(
            federation,
            ROBUST_TASK,
            {"design": design, "beta": beta, "cluster": self.cluster},
            analysis=analysis,
            secure=secure_aggregation,
        )["meat"]
        who = f"clusters of {self.cluster!r}" if self.cluster else "patients"
        notes.append(
            f"robust (sandwich) covariance, Lin & Wei (1989), over {who}; clusters never span sites"
        )
        return cov @ meat @ cov

    def _baseline(
        self, sums: GridSums, truncated: Mapping[str, int], notes: list[str]
    ) -> pd.DataFrame:
        """Breslow's cumulative baseline hazard ``sum_{j<=k} d_j / S0_j`` on the grid (NaN where
        no one is at risk) and its survival ``exp(-H0)``."""
        notes.append(
            f"one baseline hazard across sites, on a grid of {len(self.grid)} points "
            f"(times coarsened up to the next point); ties: {self.ties}"
        )
        if any(truncated.values()):
            notes.append(
                "follow-up censored at each site's safe horizon (fewer than k patients "
                "would stand behind later sums); patients censored there: "
                + ", ".join(f"{s}={n}" for s, n in truncated.items())
            )
        with np.errstate(divide="ignore", invalid="ignore"):
            hazard = np.where(sums.S0 > 0, sums.weighted_events / sums.S0, 0.0)
        cumulative = np.cumsum(hazard)
        cumulative[sums.S0 <= 0] = np.nan
        return pd.DataFrame(
            {"cumulative_hazard": cumulative, "survival": np.exp(-cumulative)},
            index=pd.Index(self.grid, name="time"),
        )

    def _grid_sums(
        self,
        federation: Federation,
        design: dict,
        beta: np.ndarray,
        analysis: str,
        secure: SecureAggregation | None,
        path: PathRelay,
        base: np.ndarray,
        ridge: float,
        last: dict[str, Any],
    ) -> tuple[GridSums, dict[str, int]]:
        """The sites' grid sums, totalled, and how many patients each censored early.

        Under secure aggregation only the total of patients censored early is
        known (reported as ``"all sites"``).
        """
        args = {"design": design, "beta": beta, "grid": self.grid, "ties": self.ties,
                "ridge": ridge}  # fmt: skip
        last["request"] = (GRID_TASK, args)
        fields = WeightedGridSums.__dataclass_fields__
        if secure is not None:
            total = summed_replies(federation, GRID_TASK, path.arguments(args, beta, base),
                                   analysis=analysis, secure=secure)  # fmt: skip
            path.answered(beta, base)
            sums = WeightedGridSums(**{f: total[f] for f in fields})
            return sums, {"all sites": round(total["truncated"])}
        replies = federation.request(GRID_TASK, path.arguments(args, beta, base), analysis=analysis)
        path.answered(beta, base)
        sums = WeightedGridSums(**{f: sum(r[f] for r in replies.values()) for f in fields})
        return sums, {s: int(r["truncated"]) for s, r in replies.items()}


def concordance_index(result: CoxPHResults, federation: Federation) -> float:
    """Harrell's C of a fitted Cox model's risk scores at the sites of ``federation``.

    Each site counts concordant, tied-score and comparable pairs among its
    own patients (:func:`fedstats.cox_math.concordance_counts`); the index
    is ``(concordant + tied / 2) / comparable`` over all sites' pairs
    (Harrell, Califf, Pryor, Lee & Rosati, JAMA 1982). Pairs of patients at
    different sites are not compared: that would need their times and scores
    in one place. Pass a federation of held-out frames (same columns) to
    validate out of sample.
    """
    if result.design is None:
        raise ValueError("this result carries no design to evaluate")
    if counting_outcome(result.design["outcome"]) is not None:
        raise StudyConfigurationError(
            "Harrell's C compares patients' follow-up times, one row each; it is not offered for "
            f"{result.design['outcome']}, whose patients may have several rows"
        )
    args = {"design": result.design, "beta": result.params.to_numpy()}
    if getattr(result, "path_evidence", None) is not None:
        args[PATH_KEY] = result.path_evidence  # held-out sites check the fit's last point
    replies = federation.request(
        CONCORDANCE_TASK, args, analysis=federation.new_analysis("concordance")
    )
    concordant = sum(r["concordant"] for r in replies.values())
    tied = sum(r["tied"] for r in replies.values())
    comparable = sum(r["comparable"] for r in replies.values())
    if comparable == 0:
        raise ValueError("no comparable pair at any site (no events?)")
    return float((concordant + tied / 2) / comparable)


def _outcome_of(formula: str) -> str:
    """The left-hand side of ``formula`` as written (the grammar reads it again at ``fit``)."""
    return formula.split("~", 1)[0].strip()
