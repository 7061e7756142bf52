"""Federated Fine–Gray regression: proportional subdistribution hazards of one cause.

Fine & Gray (JASA 1999, 94:496–509) model the hazard of the subdistribution of a
cause ``k``, ``lambda_k(t) = -d log(1 - F_k(t)) / dt``, as ``lambda_0(t) exp(x' beta)``:
``exp(beta)`` are subdistribution hazard ratios, and ``F_k`` is the cumulative
incidence of :class:`fedstats.CumulativeIncidence`. The estimate maximises a
weighted Cox partial likelihood whose risk sets keep the patients who failed from
a competing cause, with weight ``G(t-) / G(T_i-)`` (``G`` the Kaplan–Meier curve of
the censoring distribution).

Two conventions, each equal to one R call (``convention=``,
:mod:`fedstats.contract.fine_gray`):

* ``"crr"`` (default) — ``cmprsk::crr(ftime, fstatus, cov1, failcode = k, cencode = 0)``,
  what most published Fine–Gray analyses report: ``G`` is the ordinary Kaplan–Meier
  of the censorings (a patient failing at a time is still at risk of censoring
  then), Breslow's ties, and ``crr``'s standard errors: the sandwich
  ``V (sum_i (eta_i + psi_i)(eta_i + psi_i)') V`` whose score residual adds to each
  patient's Lin–Wei residual ``eta_i`` the term ``psi_i`` of the estimated censoring
  curve (Fine & Gray 1999, section 4);
* ``"finegray"`` — R's ``survival::finegray()`` rows fitted by ``coxph(Surv(fgstart,
  fgstop, fgstatus) ~ ..., weights = fgwt, cluster = id)``: censorings at a time
  counted after the events at it, Efron's ties by default (``ties="breslow"`` too),
  and robust errors ``V (sum_i eta_i eta_i') V`` (Lin & Wei, JASA 1989) that take the
  censoring weights as known. The residuals are Breslow-type, so with Efron's ties
  and tied event times they are about 1e-4 relative from R's Efron-type ones.

With tied times the two conventions give different estimates (the censoring
curve and the ties differ); without tied times the same estimate, and standard
errors that differ by the censoring term.

Federated, on a shared time grid (times coarsened up to the next point, as
for the pooled-baseline :class:`fedstats.CoxPH`):

1. the design is agreed with every site (levels of categorical covariates);
2. a first round at ``beta = 0`` returns each site's counts per grid point
   (at risk, events of the cause, competing events, censorings; every one
   0 or at least ``k`` patients, :mod:`fedstats.site.handlers.competing`);
   the coordinator computes ``G`` from their sums and sends it to the
   sites as numbers on the grid;
3. Newton rounds: each site returns the weighted risk-set and tied-event
   sums at ``beta`` (:mod:`fedstats.site.handlers.fine_gray`; under ``"crr"`` also
   the competing events' sums per grid point) and the coordinator evaluates the
   Breslow or Efron partial likelihood from their totals
   (:func:`fedstats.cox_math.grid_partial_likelihood`), steps, and halves a step
   that lowers it;
4. the robust variance: the coordinator sends the pooled increments, means and
   (``"crr"``) censoring terms derived from the last round's sums
   (:func:`fedstats.contract.fine_gray.relayed_inputs`); each site returns
   ``sum_i U_i U_i'`` over its patients.

With a grid holding every distinct time (allowed when the disclosure
threshold is 1) the estimate and standard errors are those of the R call of
the convention on the pooled rows. ``robust=False`` reports the model-based
``V`` (the inverse weighted information) instead.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import numpy as np

from fedstats.contract.design import DesignSpec, Level, counting_outcome, parse_formula
from fedstats.contract.fine_gray import (
    CONVENTIONS,
    COUNT_FIELDS,
    censoring_from_counts,
    relayed_inputs,
)
from fedstats.contract.newton import (
    DECREMENT_TOL,
    check_rank,
    damped_newton,
    inverse_information,
)
from fedstats.contract.paths import PATH_KEY, PathRequest, summed
from fedstats.contract.tasks.fine_gray import ROBUST_TASK, SUM_FIELDS, TASK
from fedstats.cox_math import TIES, GridSums, grid_partial_likelihood
from fedstats.errors import ConvergenceWarning, FormulaError, StudyConfigurationError
from fedstats.models.agree import SiteCounts, agreed_design
from fedstats.models.cumulative_incidence import checked_cause
from fedstats.models.federation import Federation
from fedstats.models.kaplan_meier import time_grid
from fedstats.models.path_relay import PathRelay
from fedstats.models.results import WALD_INFORMATION, CoxPHResults, Provenance
from fedstats.models.secure_aggregation import SecureAggregation, secure_note, summed_replies

ROBUST_WALD = "Wald, from the robust (sandwich) covariance over patients (Lin & Wei, JASA 1989)"
"""The interval method of a robust Fine–Gray fit of the ``"finegray"`` convention."""

CRR_WALD = (
    "Wald, from cmprsk::crr's sandwich covariance with the censoring-estimation term "
    "(Fine & Gray, JASA 1999)"
)
"""The interval method of a robust Fine–Gray fit of the ``"crr"`` convention."""


class FineGray:
    """Federated Fine–Gray subdistribution hazards regression on a shared time grid.

    Parameters
    ----------
    formula:
        ``"Surv(time, status) ~ age + C(stage)"``: follow-up time and a status
        column coded 0 = censored, 1, 2, ... = the cause that ended follow-up.
    cause:
        The cause whose subdistribution hazard is modelled; every other
        positive code is a competing event.
    grid, width, horizon:
        The shared time grid (as for :class:`fedstats.KaplanMeier`).
    convention:
        ``"crr"`` (default): R's ``cmprsk::crr`` (its censoring curve at tied times,
        Breslow's ties, its variance with the censoring-estimation term);
        ``"finegray"``: R's ``coxph(..., weights = fgwt, cluster = id)`` on
        ``survival::finegray()`` rows (module docstring).
    ties:
        ``"crr"``: ``"breslow"`` only (the default). ``"finegray"``: ``"efron"``
        (default, as R's ``coxph``) or ``"breslow"``.
    robust:
        ``True`` (default): the sandwich standard errors of the convention's R call;
        ``False``: model-based (module docstring).
    levels, missing, maxiter, tol:
        As for :class:`fedstats.CoxPH`.
    """

    def __init__(
        self,
        formula: str,
        *,
        cause: int,
        grid: Sequence[float] | np.ndarray | None = None,
        width: float | None = None,
        horizon: float | None = None,
        convention: str = "crr",
        ties: str | None = None,
        levels: Mapping[str, Sequence[Level]] | None = None,
        missing: str = "raise",
        maxiter: int = 50,
        tol: float = DECREMENT_TOL,
        robust: bool = True,
    ) -> None:
        if not isinstance(formula, str):
            raise FormulaError(f"formula must be a string, got {type(formula).__name__}")
        if not (isinstance(convention, str) and convention in CONVENTIONS):
            raise StudyConfigurationError(
                f"convention must be one of {CONVENTIONS} ('crr': cmprsk::crr; 'finegray': "
                f"coxph on survival::finegray() rows), got {convention!r}"
            )
        if ties is None:
            ties = "breslow" if convention == "crr" else "efron"
        if ties not in TIES:
            raise StudyConfigurationError(f"ties must be one of {TIES}, got {ties!r}")
        if convention == "crr" and ties != "breslow":
            raise StudyConfigurationError(
                "cmprsk::crr has Breslow's ties only; for Efron's use convention='finegray' "
                "(coxph on survival::finegray() rows)"
            )
        if missing not in ("raise", "drop"):
            raise StudyConfigurationError(f"missing must be 'raise' or 'drop', got {missing!r}")
        if type(maxiter) is not int or maxiter < 1:
            raise StudyConfigurationError(f"maxiter must be a positive integer, got {maxiter!r}")
        if not 0 < tol < 1:
            raise StudyConfigurationError(f"tol must be in (0, 1), got {tol!r}")
        self.formula = formula
        self.cause = checked_cause(cause)
        self.grid = time_grid(grid, width, horizon)
        self.convention = convention
        self.ties = ties
        self.levels = dict(levels or {})
        self.missing = missing
        self.maxiter = maxiter
        self.tol = tol
        if not isinstance(robust, bool):
            raise StudyConfigurationError(f"robust must be True or False, got {robust!r}")
        self.robust = robust

    def __repr__(self) -> str:
        return (
            f"FineGray({self.formula!r}, cause={self.cause}, convention={self.convention!r}, "
            f"ties={self.ties!r})"
        )

    def agree(self, federation: Federation, analysis: str) -> DesignSpec:
        """The survival design agreed with every site (levels of categorical covariates)."""
        if counting_outcome(parse_formula(self.formula).outcome) is not None:
            raise FormulaError(
                "Fine-Gray takes Surv(time, status): one row per patient, status 0 for censored "
                "or the cause; the counting-process form Surv(start, stop, event) is not offered"
            )
        spec, _ = agreed_design(
            federation,
            self.formula,
            analysis=analysis,
            levels=self.levels,
            missing=self.missing,
            outcome_kind="survival",
        )
        return spec

    def fit(
        self, federation: Federation, secure_aggregation: SecureAggregation | None = None
    ) -> FineGrayResults:
        """Agree the design, compute the censoring weights, then Newton rounds (see the module).

        ``secure_aggregation``: the coordinator sees only the sums over sites of every
        round's reply (counts, weighted sums, the robust variance's cross-products); every
        site must answer every round.
        """
        if not isinstance(federation, Federation):
            raise StudyConfigurationError(
                f"fit() needs a fedstats.Federation, got {type(federation).__name__}"
            )
        started = datetime.now(UTC)
        analysis = federation.new_analysis("fine_gray")
        spec = self.agree(federation, analysis)
        names, design = list(spec.columns), spec.to_wire()
        p = len(names)

        path = PathRelay(federation)
        fixed = {
            "design": design,
            "cause": self.cause,
            "grid": self.grid,
            "ties": self.ties,
            "convention": self.convention,
        }

        def request(
            beta: np.ndarray, G: np.ndarray, base: np.ndarray, task: str = TASK, **extra: Any
        ) -> dict[str, Any]:
            """Every field of the sites' replies, summed over sites; a point of the fit's
            path (:data:`fedstats.contract.path_rules.FINE_GRAY_PATH`) relays the last."""
            args = {**fixed, "beta": beta, "censoring": G, **extra}
            if task == TASK:
                args = path.arguments(args, beta, base)
            summed = summed_replies(
                federation, task, args, analysis=analysis, secure=secure_aggregation
            )
            if task == TASK:
                path.answered(beta, base)
            return summed

        start = np.zeros(p)
        if secure_aggregation is None:
            args = {**fixed, "beta": start, "censoring": np.ones(len(self.grid))}
            first = federation.request(TASK, path.arguments(args, start, start), analysis=analysis)
            path.answered(start, start)
            per_site = {
                f: {s: round(float(np.sum(r[f]))) for s, r in first.items()}
                for f in ("n_obs", "n_dropped", "d", "truncated")
            }
            totals = {f: summed(first, f) for f in COUNT_FIELDS}
        else:
            totals = request(start, np.ones(len(self.grid)), start)
            per_site = {
                f: {"all sites": round(float(np.sum(totals[f])))}
                for f in ("n_obs", "n_dropped", "d", "truncated")
            }
        if not np.rint(totals["d"]).any():
            raise StudyConfigurationError(
                f"no site could release an event of cause {self.cause} on this time grid (each "
                "site's follow-up ends before its first interval with fewer than k patients in "
                "a cell); use a coarser grid"
            )
        G = censoring_from_counts(totals, self.convention)

        last: dict[str, Any] = {}

        def evaluate(
            beta: np.ndarray, base: np.ndarray | None = None
        ) -> tuple[float, np.ndarray, np.ndarray]:
            """The weighted partial likelihood at ``beta``, stepped from ``base``."""
            replies = last["total"] = request(beta, G, beta if base is None else base)
            sums = GridSums(**{f: replies[f] for f in SUM_FIELDS})
            result = grid_partial_likelihood(sums, beta, self.ties)
            return result.loglik, result.score, result.information

        beta = start
        state = evaluate(beta)
        check_rank(state[2], names)
        beta, state, converged, rounds, notes = damped_newton(
            evaluate, beta, state, names, tol=self.tol, maxiter=self.maxiter
        )
        if not converged and not notes:
            message = f"Newton's method did not converge in {self.maxiter} rounds"
            warnings.warn(message, ConvergenceWarning, stacklevel=2)
            notes.append(message)
        site_counts = SiteCounts(
            n_obs=per_site["n_obs"], n_dropped=per_site["n_dropped"], n_events=per_site["d"]
        )
        if note := site_counts.dropped_note():
            notes.append(note)
        truncated = per_site["truncated"]
        notes += [
            f"subdistribution hazards of cause {self.cause} (Fine & Gray 1999); patients with "
            "a competing event stay at risk with censoring weights G(t-)/G(T-)",
            "conventions of cmprsk::crr (censoring curve with the failures at a time still "
            "at risk of censoring, Breslow's ties)"
            if self.convention == "crr"
            else "conventions of survival::finegray() and coxph (censorings after the events "
            "at a time)",
            f"one baseline across sites, on a grid of {len(self.grid)} points (times coarsened "
            f"up to the next point); ties: {self.ties}",
        ]
        cov = inverse_information(state[2])
        if self.robust:
            inputs = relayed_inputs(last["total"], {"convention": self.convention, "censoring": G})
            if path.enabled and path.last is not None:  # the fit's last point, with its sums
                inputs[PATH_KEY] = PathRequest(
                    path.sites, path.round + 1, None, previous=path.last
                ).to_wire()
            meat = request(beta, G, beta, ROBUST_TASK, **inputs)["meat"]
            cov = cov @ meat @ cov
            rounds += 1
            notes.append(
                "robust (sandwich) standard errors over patients with the censoring-estimation "
                "term of Fine & Gray (1999), as cmprsk::crr"
                if self.convention == "crr"
                else "robust (sandwich) standard errors over patients (Lin & Wei 1989), "
                "censoring weights taken as known, as R's coxph on finegray() rows"
            )
        else:
            notes.append("standard errors are model-based (inverse weighted information)")
        if secure_aggregation is not None:
            notes.append(secure_note(secure_aggregation, len(federation.sites)))
        if any(truncated.values()):
            notes.append(
                "follow-up censored at each site's safe horizon; patients censored there: "
                + ", ".join(f"{s}={n}" for s, n in truncated.items())
            )
        return FineGrayResults(
            cause=self.cause,
            convention=self.convention,
            censoring=G,
            grid=self.grid,
            names=names,
            params=beta,
            cov=cov,
            interval_method=(
                WALD_INFORMATION
                if not self.robust
                else CRR_WALD
                if self.convention == "crr"
                else ROBUST_WALD
            ),
            llf=state[0],
            converged=converged,
            iterations=rounds,
            provenance=Provenance.of_fit(federation, analysis, site_counts, rounds + 1, started),
            notes=notes,
            n_events=site_counts.n_events,
            ties=self.ties,
            strata=(),
            design=design,
        )


class FineGrayResults(CoxPHResults):
    """Results of :class:`fedstats.FineGray`: log subdistribution hazard ratios.

    ``llf`` is the weighted log partial likelihood; standard errors are those of
    the fit's ``convention`` (``"crr"``: ``cmprsk::crr``'s; ``"finegray"``: R's
    ``coxph(..., cluster = id)`` on ``finegray()`` rows), or model-based with
    ``robust=False`` (see :mod:`fedstats.models.fine_gray`). ``censoring_survival_``
    is the pooled censoring curve ``G`` the weights came from.
    """

    model_name = "Federated Fine-Gray subdistribution hazards regression"

    def __init__(
        self,
        *,
        cause: int,
        censoring: np.ndarray,
        grid: np.ndarray,
        convention: str = "crr",
        **kwargs: Any,
    ):
        super().__init__(**kwargs)
        self.cause = cause
        self.convention = convention
        self.grid = grid
        self.censoring_survival_ = censoring

    def subdistribution_hazard_ratios(self, alpha: float = 0.05):  # type: ignore[no-untyped-def]
        """``exp(coef)`` with its Wald interval: columns ``hazard_ratio``, ``lower``, ``upper``."""
        return self.hazard_ratios(alpha)

    def _info(self) -> list[tuple[str, str]]:
        info = super()._info()
        info.insert(2, ("Cause", str(self.cause)))
        info.insert(3, ("Convention", self.convention))
        return info

    def _record_fields(self) -> dict[str, Any]:
        return {**super()._record_fields(), "cause": self.cause, "convention": self.convention}
