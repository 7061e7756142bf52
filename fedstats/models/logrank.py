"""The federated log-rank test, from the Kaplan–Meier counts on a shared time grid.

The log-rank test (Mantel, 1966; Peto & Peto, 1972) of ``G`` groups, from the
pooled numbers at risk ``n_gk`` and events ``d_gk`` at grid point ``k``
(:func:`fedstats.models.kaplan_meier.grid_counts`): ``O_g = sum_k d_gk``,
``E_g = sum_k n_gk d_k / n_k``,
``V_gh = sum_k d_k (n_k - d_k) / (n_k - 1) (n_gk / n_k) (delta_gh - n_hk / n_k)``,
statistic ``(O - E)' V^- (O - E)`` on ``G - 1`` degrees of freedom (the first
``G - 1`` groups).

Weighted tests (Wilcoxon, Tarone–Ware, Fleming–Harrington) put a weight
``w_k`` on each grid point: ``sum_k w_k (d_gk - n_gk d_k / n_k)`` and
``w_k^2`` in ``V`` (:mod:`fedstats.models.logrank_weights`). A stratified
test computes ``O - E`` and ``V`` within each stratum (the weights too:
Fleming–Harrington's ``S`` is the stratum's) and sums them over strata
before the quadratic form (R's ``survdiff(... + strata(x))``, statsmodels'
``survdiff(strata=)``). A stratum is a value of a column, so its counts add
across sites. With frequency ``weights`` the counts are sums of weights: the
test of the rows repeated ``w`` times.

Under record-level privacy the counts carry Gaussian noise, which adds to
``O - E`` a variance that ``V`` does not hold: a test that ignored it would
reject equal survival far more often than its level says. The noise's
covariance ``V_noise`` of ``O - E`` comes from a parametric bootstrap of the
noisy counts (Ferrando, Wang & Sheldon, "Parametric bootstrap for
differentially private confidence intervals", AISTATS 2022;
:func:`~fedstats.models.kaplan_meier.noisy_count_draws`): fresh noise of the
released sums' variance, the same post-processing, ``O - E`` again, and the
covariance across draws. The statistic is then
``(O - E)' (V + V_noise)^- (O - E)``, and each group's **noise share** is
``V_noise[g, g] / (V[g, g] + V_noise[g, g])``; a share above
:data:`~fedstats.models.utility.NOISE_DOMINATES` raises
:class:`~fedstats.PrivacyUtilityWarning` (the test then has little power).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
from scipy import stats

from fedstats.contract.design import Level
from fedstats.errors import StudyConfigurationError
from fedstats.models.federation import Federation
from fedstats.models.kaplan_meier import (
    BOOTSTRAP_DRAWS,
    GridCounts,
    empty_groups_warnings,
    grid_counts,
    noisy_count_draws,
    time_grid,
)
from fedstats.models.logrank_weights import Weighting
from fedstats.models.privacy import RecordDP
from fedstats.models.secure_aggregation import SecureAggregation
from fedstats.models.summary import Summary, render_html, render_summary
from fedstats.models.utility import NOISE_DOMINATES, dominated_names, noise_shares, warn

EXACT_VARIANCE = "hypergeometric variance of O - E (Mantel 1966)"
"""The variance method of a test on exact counts."""
PRIVATE_VARIANCE = (
    EXACT_VARIANCE + ", plus the privacy noise's covariance from a parametric bootstrap of the "
    "noisy counts (Ferrando, Wang & Sheldon, AISTATS 2022)"
)
"""The variance method of a test on noisy counts."""


@dataclass(frozen=True)
class LogRankResult:
    """The log-rank test of equal survival across groups."""

    statistic: float
    dof: int
    p_value: float
    observed: pd.Series
    expected: pd.Series
    grid: np.ndarray
    variance_method: str = EXACT_VARIANCE
    """How the variance of ``O - E`` was obtained, in words."""
    noise_share: pd.Series | None = None
    """Under privacy, per group, the noise's share of the variance of ``O_g - E_g``;
    ``None`` for a test on exact counts."""
    utility_warnings: list[str] = field(default_factory=list)
    """What makes this private test misleading, in plain words
    (:class:`~fedstats.PrivacyUtilityWarning`); empty when nothing does."""
    test: str = "log-rank"
    """Which test of the weighted family, in words (e.g. ``Tarone-Ware``)."""
    strata: tuple[str, ...] = ()
    """The strata columns of a stratified test."""
    difference: pd.Series | None = None
    """Per group, the (weighted, summed over strata) ``O - E`` the statistic is built on."""
    weights: str | None = None
    """The column of frequency weights the counts sum, when weighted."""

    @property
    def noise_dominated(self) -> bool:
        """Whether any warning says the privacy noise makes this result misleading."""
        return bool(self.utility_warnings)

    def _table(self) -> pd.DataFrame:
        table = pd.DataFrame({"observed": self.observed, "expected": self.expected})
        if self.difference is not None and self.test != "log-rank":
            table["weighted O - E"] = self.difference
        if self.noise_share is not None:
            table["noise share"] = self.noise_share
        return table

    def _info(self) -> list[tuple[str, str]]:
        return [
            *([("Strata", ", ".join(self.strata))] if self.strata else []),
            *([("Frequency weights", self.weights)] if self.weights else []),
            ("Chi-squared", f"{self.statistic:.4g}"),
            ("Degrees of freedom", str(self.dof)),
            ("p-value", f"{self.p_value:.4g}"),
            ("Grid points", str(len(self.grid))),
        ]

    def _notes(self) -> list[str]:
        return [
            *(f"WARNING: {w}" for w in self.utility_warnings),
            f"variance: {self.variance_method}",
        ]

    def summary(self) -> Summary:
        """The statistic, its p-value and the observed and expected events by group: text a
        notebook shows as a table."""
        return render_summary(self._title(), self._info(), self._table(), self._notes())

    def _repr_html_(self) -> str:
        return render_html(self._title(), self._info(), self._table(), self._notes())

    def _title(self) -> str:
        stratified = "stratified " if self.strata else ""
        return f"Federated {stratified}{self.test} test"


def logrank_test(
    federation: Federation,
    time: str,
    event: str,
    group: str,
    *,
    levels: Sequence[Level] | None = None,
    strata: str | Sequence[str] | None = None,
    strata_levels: Mapping[str, Sequence[Level]] | None = None,
    weightings: str | None = None,
    p: float | None = None,
    q: float | None = None,
    weights: str | None = None,
    grid: Sequence[float] | np.ndarray | None = None,
    width: float | None = None,
    horizon: float | None = None,
    privacy: RecordDP | None = None,
    sparse_events: str = "end",
    secure_aggregation: SecureAggregation | None = None,
    draws: int = BOOTSTRAP_DRAWS,
) -> LogRankResult:
    """The (weighted, stratified) log-rank test of ``group``'s levels on the shared grid.

    See the module docstring. ``strata`` names one column or several (their
    levels crossed); their levels are agreed with the sites, or given in
    ``strata_levels`` (a mapping from column to levels; required under
    privacy). ``weightings`` is ``None`` (log-rank), ``"wilcoxon"``,
    ``"tarone-ware"`` or ``"fleming-harrington"`` with exponents ``p`` and
    ``q`` (default 0), as in lifelines' ``multivariate_logrank_test``.
    ``weights`` names a column of frequency weights (exact tests only).

    Under ``privacy`` the noise's covariance is added to the test's (a parametric bootstrap
    of ``draws`` draws seeded by the federation's ``noise_seed``, every weight recomputed
    from each draw's counts), and each of the result's
    :attr:`~LogRankResult.utility_warnings` is raised as a
    :class:`~fedstats.PrivacyUtilityWarning`.
    """
    weighting = Weighting.of(weightings, p, q)
    columns = _strata_columns(strata)
    if strata_levels is not None and set(strata_levels) != set(columns):
        raise StudyConfigurationError(
            f"strata_levels= gives the levels of every strata column {list(columns)}, no other"
        )
    counts = grid_counts(
        federation,
        time=time,
        event=event,
        group=group,
        levels=levels,
        grid=time_grid(grid, width, horizon),
        analysis=federation.new_analysis("logrank"),
        privacy=privacy,
        sparse_events=sparse_events,
        secure=secure_aggregation,
        strata=columns,
        strata_levels=None if strata_levels is None else [strata_levels[c] for c in columns],
        weights=weights,
    )
    at_risk, events = counts.by_stratum(counts.at_risk), counts.by_stratum(counts.events)
    difference, covariance = _observed_minus_expected(at_risk, events, weighting)
    plain, _ = _observed_minus_expected(at_risk, events, Weighting())
    groups = list(counts.groups)
    observed = events.sum(axis=(0, 2))
    result = {
        "observed": pd.Series(observed, index=groups, name="observed"),
        "expected": pd.Series(observed - plain, index=groups, name="expected"),
        "difference": pd.Series(difference, index=groups, name="O - E"),
        "grid": counts.grid,
        "dof": len(groups) - 1,
        "test": weighting.describe(),
        "strata": columns,
        "weights": weights,
    }
    if counts.noise_variance is None:
        statistic = _chi_squared(difference, covariance)
        return LogRankResult(
            statistic=statistic, p_value=float(stats.chi2.sf(statistic, len(groups) - 1)), **result
        )
    noise = _noise_covariance(
        counts, draws, np.random.default_rng(federation.noise_seed), weighting
    )
    statistic = _chi_squared(difference, covariance + noise)
    share = noise_shares(covariance, noise)
    warnings = [*_dominated_warnings(groups, share), *empty_groups_warnings(counts)]
    warn(warnings, stacklevel=3)  # the caller of logrank_test
    return LogRankResult(
        statistic=statistic,
        p_value=float(stats.chi2.sf(statistic, len(groups) - 1)),
        variance_method=PRIVATE_VARIANCE,
        noise_share=pd.Series(share, index=groups, name="noise share"),
        utility_warnings=warnings,
        **result,
    )


def _strata_columns(strata: str | Sequence[str] | None) -> tuple[str, ...]:
    """``strata=`` as a tuple of distinct column names (empty: unstratified)."""
    if strata is None:
        return ()
    columns = (strata,) if isinstance(strata, str) else tuple(strata)
    if not columns or not all(isinstance(c, str) and c for c in columns):
        raise StudyConfigurationError("strata= names a column, or a list of columns")
    if len(set(columns)) != len(columns):
        raise StudyConfigurationError(f"strata= names a column twice: {list(columns)}")
    return columns


def _observed_minus_expected(
    at_risk: np.ndarray, events: np.ndarray, weighting: Weighting
) -> tuple[np.ndarray, np.ndarray]:
    """Weighted ``O - E`` per group and its hypergeometric covariance ``V``, each summed over
    strata (see the module docstring); grid points with nobody at risk add nothing.

    The counts are ``... x strata x groups x grid points``; stacks of counts (leading axes,
    e.g. bootstrap draws) give stacks of results.
    """
    total_n = at_risk.sum(axis=-2, keepdims=True)
    total_d = events.sum(axis=-2, keepdims=True)
    weight = weighting.weights(total_n, total_d)
    with np.errstate(divide="ignore", invalid="ignore"):
        share = np.where(total_n > 0, at_risk / total_n, 0.0)
        spread = np.where(total_n > 1, total_d * (total_n - total_d) / (total_n - 1), 0.0)
    difference = (weight * (events - share * total_d)).sum(axis=(-3, -1))
    weighted = share * spread * weight**2
    covariance = np.einsum("...sgk,gh->...gh", weighted, np.eye(at_risk.shape[-2])) - np.einsum(
        "...sgk,...shk->...gh", weighted, share
    )
    return difference, covariance


def _noise_covariance(
    counts: GridCounts, draws: int, rng: np.random.Generator, weighting: Weighting
) -> np.ndarray:
    """The covariance the privacy noise adds to ``O - E``: its covariance over ``draws``
    replays of the noisy counts (the weights recomputed from each replay)."""
    at_risk, events = noisy_count_draws(counts, draws, rng)
    differences, _ = _observed_minus_expected(
        counts.by_stratum(at_risk), counts.by_stratum(events), weighting
    )
    return np.cov(differences, rowvar=False).reshape(len(counts.groups), len(counts.groups))


def _chi_squared(difference: np.ndarray, covariance: np.ndarray) -> float:
    """``(O - E)' V^- (O - E)`` on the first ``G - 1`` groups."""
    head = difference[:-1]
    return float(head @ np.linalg.pinv(covariance[:-1, :-1]) @ head)


def _dominated_warnings(groups: list, shares: np.ndarray) -> list[str]:
    """One warning naming each group whose noise share exceeds :data:`NOISE_DOMINATES`."""
    dominated = dominated_names(groups, shares)
    if not dominated:
        return []
    return [
        "privacy noise dominates the variance of observed minus expected events of "
        + ", ".join(dominated)
        + f" (noise share above {NOISE_DOMINATES:.0%}): the test has little power to find a "
        "difference; use a coarser grid or more budget"
    ]
