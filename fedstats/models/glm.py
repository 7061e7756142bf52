"""Exact federated generalised linear models: binomial, Poisson and Gaussian, by Newton's method.

Each round the coordinator sends the coefficients; every site returns its
score, information, log-likelihood and fit sums for the family
(:mod:`fedstats.site.handlers.glm`); the coordinator adds them and takes the
Newton step ``beta <- beta + (sum_s H_s)^-1 sum_s g_s``. With the canonical
link this is IRLS (Nelder & Wedderburn, JRSS A 1972), and because the sums
are the pooled sums the estimate equals the pooled fit (DataSHIELD
``ds.glm``, Gaye et al., Int J Epidemiol 2014; vantage6's GLM).

* **Poisson rates.** ``exposure="person_years"`` adds ``log(person_years)``
  to the linear predictor (``offset=`` adds a column as it is), so
  ``exp(coef)`` are rate ratios and the intercept a baseline rate per unit of
  exposure. The fit starts at the intercept-only rate
  ``log(sum y / sum mu_0)`` (R's ``glm`` starts from ``y + 0.1`` instead;
  both are starting points, not estimates, and reach the same maximum).
* **Weights.** ``weights="n"`` are frequency weights
  (:mod:`fedstats.site.weights`): the fit equals the unweighted fit on rows
  repeated ``n`` times (statsmodels' ``freq_weights``).
* **Dispersion.** Gaussian fits estimate ``phi`` by Pearson's statistic over
  ``sum w - p``; ``scale="X2"`` does the same for a binomial or Poisson fit
  (quasi-likelihood; McCullagh & Nelder 1989, §9.2).
* **Steps.** A step that lowers the log-likelihood, or that a site refuses
  because one row would dominate the fitted count
  (:func:`fedstats.site.handlers.glm.check_fitted_dominance`), is halved (at
  most 20 times); the fit stops on the Newton decrement
  (:mod:`fedstats.contract.newton`).

Privacy: a binomial fit without weights runs the private logistic
regression (:class:`fedstats.LogisticRegression`); a Poisson or Gaussian
outcome has no bound, so no private release of it is offered.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import numpy as np

from fedstats.contract.design import Level
from fedstats.contract.newton import (
    DECREMENT_TOL,
    MAX_HALVINGS,
    decrement_converged,
    inverse_information,
    newton_decrement,
    newton_step,
)
from fedstats.contract.paths import rate_start
from fedstats.contract.tasks.glm import FAMILY_OUTCOMES, TASK
from fedstats.errors import (
    ConvergenceWarning,
    DisclosureError,
    FormulaError,
    StudyConfigurationError,
)
from fedstats.models.agree import Agreement, agree_design
from fedstats.models.federation import Federation
from fedstats.models.glm_results import GLMResults
from fedstats.models.path_relay import PathRelay
from fedstats.models.privacy import ClientDP, RecordDP
from fedstats.models.results import Provenance
from fedstats.models.secure_aggregation import SecureAggregation, secure_note, summed_replies
from fedstats.models.separation import QuasiSeparation, check_perfect_separation

FAMILIES = tuple(FAMILY_OUTCOMES)
Evaluation = dict[str, Any]


class GLM:
    """A federated generalised linear model whose answer equals the pooled fit.

    Parameters
    ----------
    formula:
        Wilkinson formula, e.g. ``"cases ~ age_group + C(region)"``.
    family:
        ``"binomial"`` (0/1 outcome, logit link), ``"poisson"`` (count
        ``>= 0``, log link) or ``"gaussian"`` (any finite number, identity link).
    offset:
        A numeric column added to the linear predictor.
    exposure:
        A column of positive exposures (e.g. person-years); its log joins the offset.
    weights:
        A column of frequency weights (finite, ``>= 0``).
    scale:
        ``None``: the family's dispersion (1 for binomial and Poisson,
        Pearson's estimate for Gaussian); ``"X2"``: Pearson's estimate for any
        family (quasi-binomial / quasi-Poisson standard errors).
    site_intercepts, levels, missing, maxiter, tol:
        As for :class:`fedstats.LogisticRegression`.

    Examples
    --------
    >>> res = GLM("cases ~ C(age_group) + smoker", family="poisson",
    ...           exposure="person_years").fit(fed)                 # doctest: +SKIP
    >>> res.rate_ratios()                                           # doctest: +SKIP
    """

    def __init__(
        self,
        formula: str,
        family: str = "gaussian",
        *,
        offset: str | None = None,
        exposure: str | None = None,
        weights: str | None = None,
        scale: str | None = None,
        site_intercepts: bool = False,
        levels: Mapping[str, Sequence[Level]] | None = None,
        missing: str = "raise",
        maxiter: int = 50,
        tol: float = DECREMENT_TOL,
    ) -> None:
        if not isinstance(formula, str):
            raise FormulaError(f"formula must be a string, got {type(formula).__name__}")
        if family not in FAMILIES:
            raise StudyConfigurationError(f"family must be one of {FAMILIES}, got {family!r}")
        if scale not in (None, "X2"):
            raise StudyConfigurationError(f"scale must be None or 'X2', got {scale!r}")
        if type(maxiter) is not int or maxiter < 1:
            raise StudyConfigurationError(f"maxiter must be a positive integer, got {maxiter!r}")
        if not 0 < tol < 1:
            raise StudyConfigurationError(f"tol must be in (0, 1), got {tol!r}")
        if exposure is not None and family != "poisson":
            raise StudyConfigurationError("exposure belongs to a Poisson model (a rate)")
        self.formula = formula
        self.family = family
        self.offset = offset
        self.exposure = exposure
        self.weights = weights
        self.scale = scale
        self.site_intercepts = bool(site_intercepts)
        self.levels = dict(levels or {})
        self.missing = missing
        self.maxiter = maxiter
        self.tol = tol

    def __repr__(self) -> str:
        return f"GLM({self.formula!r}, family={self.family!r})"

    def agree(self, federation: Federation, analysis: str) -> Agreement:
        """Agree on this model's design with every site
        (:func:`fedstats.models.agree.agree_design`)."""
        return agree_design(
            federation,
            self.formula,
            analysis=analysis,
            levels=self.levels,
            site_intercepts=self.site_intercepts,
            offset=self.offset,
            missing=self.missing,
            outcome_kind=FAMILY_OUTCOMES[self.family],
            weights=self.weights,
            exposure=self.exposure,
        )

    def fit(
        self,
        federation: Federation,
        privacy: RecordDP | ClientDP | tuple[RecordDP | ClientDP, ...] | None = None,
        secure_aggregation: SecureAggregation | None = None,
    ) -> Any:
        """Fit by federated Newton rounds (see the module docstring).

        ``privacy`` is offered for the binomial family without weights and
        returns :class:`fedstats.LogisticRegression`'s private result.
        """
        if not isinstance(federation, Federation):
            raise StudyConfigurationError(
                f"fit() needs a fedstats.Federation, got {type(federation).__name__}"
            )
        if privacy is not None:
            return self._fit_private(federation, privacy, secure_aggregation)
        started = datetime.now(UTC)
        analysis = federation.new_analysis("glm")
        agreement = self.agree(federation, analysis)
        spec, counts = agreement.spec, agreement.counts
        names = list(spec.columns)
        design = spec.to_wire()

        path = PathRelay(federation)

        def evaluate(beta: np.ndarray, base: np.ndarray) -> Evaluation:
            """The sums at ``beta``, a point stepped from ``base`` (contract.paths)."""
            args = path.arguments({"design": design, "beta": beta, "family": self.family},
                                  beta, base)  # fmt: skip
            state = summed_replies(
                federation, TASK, args, analysis=analysis, secure=secure_aggregation
            )
            path.answered(beta, base)
            return state

        beta = np.zeros(len(names))
        state = evaluate(beta, beta)
        rounds = 1
        if self.family == "poisson":
            beta, state = self._rate_start(evaluate, beta, state, names)
            rounds += int(beta.any())
        beta, state, converged, rounds, notes = self._newton(
            evaluate, beta, state, names, rounds, len(federation.sites)
        )
        if not converged and not notes:
            message = f"Newton's method did not converge in {self.maxiter} rounds"
            warnings.warn(message, ConvergenceWarning, stacklevel=2)
            notes.append(message)
        nobs = float(state["weight_total"])
        scale = self._dispersion(state, nobs, len(names))
        llf = self._loglik(state, nobs)
        provenance = Provenance.of_fit(federation, analysis, counts, rounds, started)
        if note := counts.dropped_note():
            notes.append(note)
        if self.weights:
            notes.append(f"frequency weights {self.weights!r}: {nobs:g} weighted observations")
        if secure_aggregation is not None:
            notes.append(secure_note(secure_aggregation, len(federation.sites)))
        result = GLMResults(
            family=self.family,
            scale=scale,
            deviance=float(state["deviance"]),
            pearson_chi2=float(state["pearson"]),
            nobs=nobs,
            n_events=counts.n_events,
            model=self,
            names=names,
            params=beta,
            cov=scale * inverse_information(state["hessian"]),
            llf=llf,
            converged=converged,
            iterations=rounds,
            provenance=provenance,
            notes=notes,
        )
        result.design = design
        return result

    # ---------------------------------------------------------------- internals

    def _newton(
        self,
        evaluate: Callable[[np.ndarray, np.ndarray], Evaluation],
        beta: np.ndarray,
        state: Evaluation,
        names: list[str],
        rounds: int,
        n_sites: int,
    ) -> tuple[np.ndarray, Evaluation, bool, int, list[str]]:
        """Newton rounds from ``beta`` with step halving: ``(beta, its evaluation, converged,
        rounds, notes)``. On convergence the reported ``beta`` takes the last (tiny) step and
        the evaluation's deviance and log-likelihood the quadratic model's gain."""
        notes: list[str] = []
        separation = QuasiSeparation()
        previous = np.inf
        first = True
        while rounds <= self.maxiter:
            if self.family == "binomial":
                check_perfect_separation(state["all_extreme"], n_sites)
            step = newton_step(state["hessian"], state["gradient"], names, first=first)
            first = False
            if step is None:
                notes.append("the information matrix became singular; the fit stopped early")
                return beta, state, False, rounds, notes
            dispersion = self._dispersion(state, float(state["weight_total"]), len(names))
            decrement = newton_decrement(state["gradient"], step, dispersion)
            if decrement_converged(decrement, previous, self.tol):
                gain = float(state["gradient"] @ step)
                state = {
                    **state,
                    "loglik": state["loglik"] + gain / 2,
                    "deviance": state["deviance"] - gain,
                }
                if self.family == "gaussian":  # Pearson's statistic is the deviance
                    state["pearson"] = state["deviance"]
                return beta + step, state, True, rounds, notes
            previous = decrement
            if rounds == self.maxiter:
                break
            candidate, trial, refusal = beta + step, None, None
            for _ in range(MAX_HALVINGS):
                rounds += 1
                try:
                    trial = evaluate(candidate, beta)
                except DisclosureError as error:  # one row would dominate: the step overshot
                    if error.rule != "dominance":
                        raise
                    trial, refusal = None, error
                if trial is not None and trial["loglik"] >= state["loglik"] - 1e-12 * (
                    1 + abs(state["loglik"])
                ):
                    break
                step = step / 2
                candidate = beta + step
                if rounds >= self.maxiter:
                    break
            if trial is None:
                raise refusal  # type: ignore[misc]  # every shorter step was refused too
            beta, state = candidate, trial
            if self.family == "binomial" and separation.separated(
                state["loglik"], state["any_extreme"]
            ):
                notes.append(QuasiSeparation.warn(step, names, stacklevel=4))
                return beta, state, False, rounds, notes
        return beta, state, False, rounds, notes

    def _rate_start(
        self,
        evaluate: Callable[[np.ndarray, np.ndarray], Evaluation],
        beta: np.ndarray,
        state: Evaluation,
        names: list[str],
    ) -> tuple[np.ndarray, Evaluation]:
        """Start a Poisson fit at the intercept-only rates
        (:func:`fedstats.contract.paths.rate_start`), a base of its own."""
        start = rate_start(names, beta, {"all": state})
        if not start.any():
            return beta, state
        return start, evaluate(start, start)

    def _dispersion(self, state: Evaluation, nobs: float, p: int) -> float:
        """``phi``: 1, or Pearson's ``X^2 / (sum w - p)`` (Gaussian; ``scale="X2"``)."""
        if self.family != "gaussian" and self.scale is None:
            return 1.0
        df = nobs - p
        if df <= 0:
            raise FormulaError(
                f"the model has {p} parameters and {nobs:g} observations: no residual degrees "
                "of freedom to estimate the dispersion"
            )
        return float(state["pearson"]) / df

    def _loglik(self, state: Evaluation, nobs: float) -> float:
        """The log-likelihood; for the Gaussian family the profile one at ``deviance / sum w``:
        ``-(sum w / 2) (log(2 pi deviance / sum w) + 1)`` (statsmodels' ``llf``)."""
        if self.family != "gaussian":
            return float(state["loglik"])
        deviance = float(state["deviance"])
        return -nobs / 2 * (np.log(2 * np.pi * deviance / nobs) + 1)

    def _fit_private(
        self,
        federation: Federation,
        privacy: RecordDP | ClientDP | tuple[RecordDP | ClientDP, ...],
        secure_aggregation: SecureAggregation | None,
    ) -> Any:
        if self.family != "binomial":
            raise StudyConfigurationError(
                f"no differentially private {self.family} model is offered: its outcome has no "
                "bound, so one patient's influence on the sums has none either"
            )
        if self.weights or self.exposure or self.scale:
            raise StudyConfigurationError(
                "a private binomial fit takes no weights, exposure or scale option"
            )
        from fedstats.models.logistic import LogisticRegression

        model = LogisticRegression(
            self.formula,
            site_intercepts=self.site_intercepts,
            offset=self.offset,
            levels=self.levels,
            missing=self.missing,
            maxiter=self.maxiter,
            tol=self.tol,
        )
        return model.fit(federation, privacy=privacy, secure_aggregation=secure_aggregation)
