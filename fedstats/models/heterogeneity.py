"""How much sites differ: outcome prevalence and distances, site estimates, Cochran's Q and I².

From aggregates only. Every site is fitted on its own (the same federated
Newton method, through the same silo checks, on a one-site federation with
the study's agreed levels), and its coefficients and standard errors are
combined as in a meta-analysis (DerSimonian & Laird, Control Clin Trials
1986; Higgins & Thompson, Stat Med 2002). For coefficient ``j`` with site
estimates ``b_s``, variances ``v_s`` and weights ``w_s = 1 / v_s``:

* fixed-effect estimate ``b_FE = sum w_s b_s / sum w_s``, standard error
  ``(sum w_s)^-1/2``;
* Cochran's ``Q = sum w_s (b_s - b_FE)^2`` on ``k - 1`` degrees of freedom,
  with its chi-squared p-value;
* ``I^2 = max(0, (Q - (k - 1)) / Q)``, the share of variation beyond chance;
* DerSimonian–Laird ``tau^2 = max(0, (Q - (k - 1)) / (sum w - sum w^2 / sum w))``.

``i2`` and ``tau2`` truncate at 0 as Higgins & Thompson define them;
``i2_untruncated`` and ``tau2_untruncated`` are the raw values that
statsmodels' ``combine_effects`` reports.

Outcome distributions: each site's prevalence ``pi_s`` from its counts, and
the total-variation and Wasserstein-1 distances between sites' outcome
distributions; for a binary outcome both equal ``|pi_s - pi_t|``. For a
time-to-event outcome, :func:`survival_heterogeneity` compares the sites'
Kaplan–Meier curves on a shared grid.
A site whose own fit is impossible (too few patients for the design,
separation, a constant column) is listed with the reason and left out.
"""

from __future__ import annotations

import dataclasses
import itertools
import warnings
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
from scipy import stats

from fedstats.errors import DisclosureError, FedstatsError, FedstatsWarning
from fedstats.models.federation import Federation
from fedstats.models.plot_text import literal


@dataclass
class HeterogeneityResults:
    """Site estimates, their meta-analytic summary, and outcome-distribution distances."""

    estimates: pd.DataFrame  # sites x coefficients
    std_errors: pd.DataFrame  # sites x coefficients
    prevalence: pd.Series  # by site
    excluded: dict[str, str] = field(default_factory=dict)  # site -> why it has no estimates
    analyses: tuple[str, ...] = ()
    """The analyses (message-inventory labels) it started: its design's and one fit per site;
    what a study records with the table (``StudyRecorder.record_diagnostic(..., analyses=)``)."""

    @property
    def summary_frame(self) -> pd.DataFrame:
        """Per coefficient: fixed-effect estimate and se, Q, df, p-value, I², tau² (DL)
        (and their untruncated values)."""
        rows = {}
        for name in self.estimates.columns:
            b = self.estimates[name].dropna()
            v = self.std_errors[name].loc[b.index] ** 2
            rows[name] = meta_analysis(b.to_numpy(), v.to_numpy())
        return pd.DataFrame(rows).T

    @property
    def total_variation(self) -> pd.DataFrame:
        """Pairwise total-variation distances between the sites' outcome distributions."""
        p = self.prevalence
        return pd.DataFrame(np.abs(p.to_numpy()[:, None] - p.to_numpy()[None, :]),
                            index=p.index, columns=p.index)  # fmt: skip

    @property
    def wasserstein(self) -> pd.DataFrame:
        """Pairwise Wasserstein-1 distances (for a 0/1 outcome, equal to total variation)."""
        return self.total_variation

    def plot(self, coefficient: str, ax=None):
        """Forest plot of one coefficient: each site's estimate and 95% interval, and b_FE."""
        import matplotlib.pyplot as plt

        if ax is None:
            _, ax = plt.subplots(figsize=(6, 0.5 * len(self.estimates) + 1.5))
        b = self.estimates[coefficient].dropna()
        se = self.std_errors[coefficient].loc[b.index]
        rows = np.arange(len(b))[::-1]
        ax.errorbar(b, rows, xerr=1.96 * se, fmt="s", capsize=3, color="black")
        summary = self.summary_frame.loc[coefficient]
        ax.axvline(summary["estimate_fe"], color="tab:blue", label="fixed effect")
        ax.set_yticks(rows)
        ax.set_yticklabels([literal(site) for site in b.index])
        ax.set_xlabel(f"{literal(coefficient)} (95% CI)")
        ax.set_title(f"Q = {summary['q']:.2f} (p = {summary['p_value']:.3f}), "
                     f"I² = {100 * summary['i2']:.0f}%")  # fmt: skip
        ax.legend(loc="best")
        return ax.figure


def meta_analysis(effects: np.ndarray, variances: np.ndarray) -> dict[str, float]:
    """Fixed-effect summary, Cochran's Q, I² and DerSimonian–Laird tau² (module docstring)."""
    k = len(effects)
    if k == 0:
        names = ("estimate_fe", "se_fe", "q", "df", "p_value", "i2", "tau2", "i2_untruncated",
                 "tau2_untruncated")  # fmt: skip
        return dict.fromkeys(names, np.nan)
    w = 1.0 / variances
    estimate = float(np.sum(w * effects) / np.sum(w))
    q = float(np.sum(w * (effects - estimate) ** 2))
    df = k - 1
    i2_raw = (q - df) / q if q > 0 else 0.0
    scale = np.sum(w) - np.sum(w**2) / np.sum(w)
    tau2_raw = (q - df) / scale if scale > 0 else 0.0
    return {
        "estimate_fe": estimate,
        "se_fe": float(np.sum(w) ** -0.5),
        "q": q,
        "df": float(df),
        "p_value": float(stats.chi2.sf(q, df)) if df > 0 else np.nan,
        "i2": max(0.0, i2_raw),
        "tau2": max(0.0, tau2_raw),
        "i2_untruncated": i2_raw,
        "tau2_untruncated": float(tau2_raw),
    }


def heterogeneity(model, federation: Federation) -> HeterogeneityResults:
    """Fit ``model`` (a :class:`fedstats.LogisticRegression`) at every site on its own.

    The categorical levels are agreed across the whole federation first, so
    every site codes its design the same way. With ``site_intercepts=True``
    each site's fit has its own ``Intercept``. The result names the analyses it started
    (``analyses``).
    """
    with federation.analyses_started() as analyses:
        result = _site_by_site(model, federation)
    return dataclasses.replace(result, analyses=tuple(analyses))


def _site_by_site(model, federation: Federation) -> HeterogeneityResults:
    from fedstats.models.logistic import LogisticRegression

    analysis = federation.new_analysis("heterogeneity")
    excluded: dict[str, str] = {}
    answering = list(federation.sites)
    while True:  # a site that refuses the design is listed with its reason
        try:
            agreement = model.agree(federation.subset(answering), analysis)
            break
        except DisclosureError as refusal:
            if refusal.site not in answering or len(answering) == 1:
                raise
            excluded[refusal.site] = f"{type(refusal).__name__}: {refusal}"
            answering.remove(refusal.site)
    counts = agreement.counts
    prevalence = pd.Series(
        {s: float(counts.n_events[s]) / max(float(counts.n_obs[s]), 1.0) for s in answering},
        name="prevalence",
    )
    local = LogisticRegression(
        model.formula,
        offset=model.offset,
        levels={k: list(v) for k, v in agreement.spec.levels.items()},
        missing=model.missing,
        maxiter=model.maxiter,
        tol=model.tol,
    )
    estimates, errors = {}, {}
    for site in answering:
        try:
            with warnings.catch_warnings():
                # separation or non-convergence: no estimate (other warnings pass through)
                warnings.simplefilter("error", FedstatsWarning)
                fit = local.fit(federation.subset([site]))
        except (FedstatsError, FedstatsWarning) as problem:
            excluded[site] = f"{type(problem).__name__}: {problem}"
            continue
        estimates[site], errors[site] = fit.params, fit.bse
    return HeterogeneityResults(
        estimates=pd.DataFrame(estimates).T,
        std_errors=pd.DataFrame(errors).T,
        prevalence=prevalence,
        excluded=excluded,
    )


@dataclass
class SurvivalHeterogeneity:
    """Each site's Kaplan–Meier curve on the shared grid and the distances between them.

    For sites ``s`` and ``t`` the distances use the grid points where both
    curves are defined (each site ends its curve at its safe horizon):
    Wasserstein-1 ``sum_k |S_s(g_k) - S_t(g_k)| (g_{k+1} - g_k)`` (the area
    between the step curves up to their last common point) and total
    variation ``1/2 sum_k |m_s,k - m_t,k|`` of the probability masses
    ``m_k = S(g_{k-1}) - S(g_k)`` per interval plus the mass left after the
    last common point.
    """

    curves: pd.DataFrame  # grid x sites

    @property
    def total_variation(self) -> pd.DataFrame:
        return self._pairwise(_total_variation)

    @property
    def wasserstein(self) -> pd.DataFrame:
        return self._pairwise(_wasserstein)

    def _pairwise(self, distance) -> pd.DataFrame:
        sites = list(self.curves.columns)
        grid = self.curves.index.to_numpy(dtype=float)
        out = pd.DataFrame(0.0, index=sites, columns=sites)
        for a, b in itertools.combinations(sites, 2):
            both = self.curves[a].notna() & self.curves[b].notna()
            value = distance(grid[both], self.curves[a][both].to_numpy(),
                             self.curves[b][both].to_numpy())  # fmt: skip
            out.loc[a, b] = out.loc[b, a] = value
        return out


def _masses(curve: np.ndarray) -> np.ndarray:
    return np.r_[1.0 - curve[0], -np.diff(curve), curve[-1]]


def _total_variation(grid: np.ndarray, s: np.ndarray, t: np.ndarray) -> float:
    if len(grid) == 0:
        return float("nan")
    return float(0.5 * np.abs(_masses(s) - _masses(t)).sum())


def _wasserstein(grid: np.ndarray, s: np.ndarray, t: np.ndarray) -> float:
    if len(grid) == 0:
        return float("nan")
    # S = 1 on [0, g_1); the curves' values hold on [g_k, g_{k+1})
    return float(np.sum(np.abs(s[:-1] - t[:-1]) * np.diff(grid)))


def survival_heterogeneity(
    federation: Federation,
    time: str,
    event: str,
    *,
    grid=None,
    width: float | None = None,
    horizon: float | None = None,
) -> SurvivalHeterogeneity:
    """Each site's Kaplan–Meier curve on the shared grid (k-protected counts), and distances."""
    from fedstats.models.kaplan_meier import KaplanMeier

    curves = {}
    for site in federation.sites:
        fit = KaplanMeier(time, event, grid=grid, width=width, horizon=horizon).fit(
            federation.subset([site])
        )
        curves[site] = fit.survival_function_["all"]
    return SurvivalHeterogeneity(pd.DataFrame(curves))
