"""Exact federated logistic regression by Newton's method (IRLS).

Each round the coordinator sends the current coefficients; every site
returns its score ``g_s = X_s^T (y_s - mu_s)``, information
``H_s = X_s^T W_s X_s`` and log-likelihood; the coordinator sums them and
takes the Newton step ``beta <- beta + (sum_s H_s)^-1 sum_s g_s``. Because the
sums equal the pooled quantities, the iterates are those of pooled IRLS and
the estimate equals the pooled maximum-likelihood estimate (Wu et al.,
JAMIA 2012, "Grid Binary LOgistic REgression (GLORE)"; DataSHIELD ``ds.glm``,
Gaye et al., Int J Epidemiol 2014).

Convergence: on the Newton decrement ``g^T H^-1 g``, which does not depend
on the covariates' scales (:mod:`fedstats.contract.newton`). The reported
coefficients are ``beta + step``, within ``O(|step|^2)`` of the MLE; standard
errors use the information at the last evaluated point, and the
log-likelihood adds the quadratic model's predicted gain ``g^T step / 2``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime

from fedstats.contract.design import Level
from fedstats.contract.dp_request import DpRequest
from fedstats.contract.newton import (
    DECREMENT_TOL,
    inverse_information,
)
from fedstats.contract.tasks.logistic import SUMMARIES
from fedstats.errors import FormulaError, StudyConfigurationError
from fedstats.models.agree import Agreement, agree_design
from fedstats.models.exact_newton import exact_newton_rounds
from fedstats.models.federation import Federation
from fedstats.models.path_relay import fit_evidence
from fedstats.models.privacy import ClientDP, RecordDP, privacy_levels
from fedstats.models.results import LogisticRegressionResults, Provenance
from fedstats.models.secure_aggregation import SecureAggregation, secure_note


class LogisticRegression:
    """Federated logistic regression whose answer equals the pooled fit.

    Parameters
    ----------
    formula:
        Wilkinson formula read by formulaic, e.g. ``"disease ~ age + sex + C(cp)"``.
        The outcome must be coded 0/1 (or boolean) at every site.
    site_intercepts:
        One intercept per site (fixed site effects) with shared slopes.
    offset:
        Name of a numeric column added to the linear predictor.
    levels:
        Categorical levels fixed by the analyst, by variable; other categorical
        variables use the union of the levels the sites report.
    missing:
        ``"raise"`` refuses missing values; ``"drop"`` fits complete cases and
        reports the dropped count per site.
    maxiter, tol:
        Newton iterations allowed, and the Newton decrement ``g^T H^-1 g`` below
        which the fit has converged (:mod:`fedstats.contract.newton`).

    Examples
    --------
    >>> res = LogisticRegression("disease ~ age + sex + C(cp)").fit(fed)  # doctest: +SKIP
    >>> res.odds_ratios()                                                 # doctest: +SKIP
    """

    def __init__(
        self,
        formula: str,
        *,
        site_intercepts: bool = False,
        offset: str | None = None,
        levels: Mapping[str, Sequence[Level]] | None = None,
        missing: str = "raise",
        maxiter: int = 50,
        tol: float = DECREMENT_TOL,
    ) -> None:
        if not isinstance(formula, str):
            raise FormulaError(f"formula must be a string, got {type(formula).__name__}")
        if type(maxiter) is not int or maxiter < 1:
            raise StudyConfigurationError(f"maxiter must be a positive integer, got {maxiter!r}")
        if not 0 < tol < 1:
            raise StudyConfigurationError(f"tol must be in (0, 1), got {tol!r}")
        self.formula = formula
        self.site_intercepts = bool(site_intercepts)
        self.offset = offset
        self.levels = dict(levels or {})
        self.missing = missing
        self.maxiter = maxiter
        self.tol = tol

    @classmethod
    def from_columns(
        cls,
        outcome: str,
        covariates: Sequence[str],
        *,
        intercept: bool = True,
        site_intercepts: bool = False,
        offset: str | None = None,
        missing: str = "raise",
        maxiter: int = 50,
        tol: float = DECREMENT_TOL,
    ) -> LogisticRegression:
        """The array interface: an outcome column and numeric covariate columns, no formula."""
        if isinstance(covariates, str) or not covariates:
            raise FormulaError("covariates must be a non-empty list of column names")
        terms = " + ".join(_quote(c) for c in covariates)
        formula = f"{_quote(outcome)} ~ {terms}" + ("" if intercept else " - 1")
        return cls(
            formula,
            site_intercepts=site_intercepts,
            offset=offset,
            missing=missing,
            maxiter=maxiter,
            tol=tol,
        )

    def __repr__(self) -> str:
        return f"LogisticRegression({self.formula!r}, site_intercepts={self.site_intercepts})"

    def agree(
        self, federation: Federation, analysis: str, dp: DpRequest | None = None
    ) -> Agreement:
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
            dp=dp,
        )

    def fit(
        self,
        federation: Federation,
        privacy: RecordDP | ClientDP | tuple[RecordDP | ClientDP, ...] | None = None,
        secure_aggregation: SecureAggregation | None = None,
    ) -> LogisticRegressionResults:
        """Fit by federated Newton rounds; see the module docstring for the method.

        ``privacy``: :class:`~fedstats.RecordDP` (each site protects its
        patients and charges its own ledger), :class:`~fedstats.ClientDP`
        (the coordinator protects each site's participation), or both as a
        tuple; the fit then runs noisy Newton rounds
        (:mod:`fedstats.models.logistic_private`).

        ``secure_aggregation``: :class:`~fedstats.SecureAggregation`: the
        coordinator sees only the sums of the sites' statistics
        (:mod:`fedstats.models.secure_aggregation`); an exact fit needs every site every round.
        In a record-level private fit each site adds its share of one
        central noise level.
        """
        if not isinstance(federation, Federation):
            raise StudyConfigurationError(
                f"fit() needs a fedstats.Federation, got {type(federation).__name__}"
            )
        if privacy is not None:
            record, client = privacy_levels(
                privacy, ClientDP, "a RecordDP, a ClientDP, or one of each in a tuple"
            )
            from fedstats.models.logistic_private import fit_private

            return fit_private(self, federation, record, client, secure_aggregation)
        started = datetime.now(UTC)
        analysis = federation.new_analysis("logistic")
        agreement = self.agree(federation, analysis)
        spec, counts = agreement.spec, agreement.counts
        names = list(spec.columns)
        ended = exact_newton_rounds(
            federation,
            SUMMARIES.name,
            {"design": spec.to_wire()},
            names,
            analysis=analysis,
            maxiter=self.maxiter,
            tol=self.tol,
            secure=secure_aggregation,
        )
        notes = ended.notes
        cov = inverse_information(ended.hessian)
        provenance = Provenance.of_fit(federation, analysis, counts, ended.rounds, started)
        if note := counts.dropped_note():
            notes.append(note)
        if secure_aggregation is not None:
            notes.append(secure_note(secure_aggregation, len(federation.sites)))
        result = LogisticRegressionResults(
            names=names,
            params=ended.beta,
            cov=cov,
            llf=ended.llf,
            converged=ended.converged,
            iterations=ended.rounds,
            provenance=provenance,
            notes=notes,
            n_events=counts.n_events,
            model=self,
        )
        result.design = spec.to_wire()
        # sites that verify paths score it where the last relayed round leads to
        result.path_evidence = fit_evidence(ended.path, (SUMMARIES.name, {"design": result.design}))
        return result


def _quote(name: str) -> str:
    """Quote a column name for formulaic when it is not a plain identifier."""
    return name if name.isidentifier() else f"`{name}`"
