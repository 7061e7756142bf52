"""Result objects of likelihood-based federated fits.

Wald inference from the inverse observed information ``I(beta)^-1``:
``se_j = sqrt([I^-1]_jj)``, ``z_j = beta_j / se_j``, two-sided
``p_j = 2 (1 - Phi(|z_j|))`` and ``beta_j +/- z_{1-alpha/2} se_j``
(e.g. McCullagh & Nelder, *Generalized Linear Models*, 2nd ed., 1989, ch. 4).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import numpy as np
import pandas as pd
from scipy import stats
from scipy.special import expit

from fedstats.contract.design import DesignSpec
from fedstats.contract.design_matrix import design_matrix
from fedstats.errors import StudyConfigurationError
from fedstats.models.plot_text import literal
from fedstats.models.privacy import PrivacyAccount
from fedstats.models.summary import Summary, render_html, render_summary
from studyfiles.fit_records import checked_result_record
from studyfiles.inventory import MessageInventory
from studyfiles.json_values import json_number, json_tree


@dataclass(frozen=True)
class Provenance:
    """Where a fit's numbers came from: sites, counts, messages and bytes."""

    study: str
    analysis: str
    sites: tuple[str, ...]
    n_obs: dict[str, int]
    n_dropped: dict[str, int]
    rounds: int
    messages: int
    request_bytes: int
    reply_bytes: int
    bytes_by_site: pd.DataFrame
    started: datetime
    finished: datetime

    @classmethod
    def from_inventory(
        cls,
        inventory: MessageInventory,
        *,
        study: str,
        analysis: str,
        sites: tuple[str, ...],
        n_obs: dict[str, int],
        n_dropped: dict[str, int],
        rounds: int,
        started: datetime,
        finished: datetime,
    ) -> Provenance:
        records = inventory.records(analysis)
        return cls(
            study=study,
            analysis=analysis,
            sites=sites,
            n_obs=n_obs,
            n_dropped=n_dropped,
            rounds=rounds,
            messages=len(records),
            request_bytes=sum(r.request_bytes for r in records),
            reply_bytes=sum(r.reply_bytes for r in records),
            bytes_by_site=inventory.bytes_by_site(analysis),
            started=started,
            finished=finished,
        )

    @classmethod
    def of_fit(
        cls, federation: Any, analysis: str, counts: Any, rounds: int, started: datetime
    ) -> Provenance:
        """A fit's provenance, finished now: its federation's messages for ``analysis`` and the
        sites' counts (:class:`fedstats.models.agree.SiteCounts`)."""
        return cls.from_inventory(
            federation.inventory,
            study=federation.study,
            analysis=analysis,
            sites=federation.sites,
            n_obs=counts.n_obs,
            n_dropped=counts.n_dropped,
            rounds=rounds,
            started=started,
            finished=datetime.now(UTC),
        )

    def to_record(self) -> dict[str, Any]:
        """Plain JSON values: times in ISO 8601, bytes per site as ``{site: {column: n}}``."""
        return {
            "study": self.study,
            "analysis": self.analysis,
            "sites": list(self.sites),
            "n_obs": {site: json_number(n) for site, n in self.n_obs.items()},
            "n_dropped": {site: json_number(n) for site, n in self.n_dropped.items()},
            "rounds": self.rounds,
            "messages": self.messages,
            "request_bytes": self.request_bytes,
            "reply_bytes": self.reply_bytes,
            "bytes_by_site": {
                str(site): {str(k): json_number(v) for k, v in row.items()}
                for site, row in self.bytes_by_site.to_dict(orient="index").items()
            },
            "started": self.started.isoformat(),
            "finished": self.finished.isoformat(),
        }


def _series_record(series: pd.Series) -> dict[str, Any]:
    return {str(k): json_number(v) for k, v in series.items()}


def _count(value: float) -> str:
    """A count as released: exact, or ``~n`` when it carries privacy noise."""
    return str(value) if isinstance(value, int) else f"~{value:.0f}"


def _statistic(value: float, spec: str, private: bool) -> str:
    """A fit statistic for the header: formatted, or why it has no value (a private fit
    releases no log-likelihood, so neither it nor the AIC or deviance exists)."""
    if math.isfinite(value):
        return format(value, spec)
    return "not released (private fit)" if private else "undefined"


WALD_INFORMATION = "Wald, from the inverse of the summed information (as a pooled fit)"
"""The interval method of an exact fit."""

PRIVATE_BOOTSTRAP = (
    "Wald, with the sampling covariance plus the privacy noise's covariance from a "
    "parametric bootstrap of the noisy Newton run (Ferrando, Wang & Sheldon, AISTATS 2022)"
)
"""The interval method of a noisy Newton fit (:mod:`fedstats.models.logistic_private`)."""


class LikelihoodResults:
    """Coefficients with Wald inference, shared by the package's regression models."""

    model_name = "Federated model"

    def __init__(
        self,
        *,
        names: list[str],
        params: np.ndarray,
        cov: np.ndarray,
        llf: float,
        converged: bool,
        iterations: int,
        provenance: Provenance,
        notes: list[str] | None = None,
        privacy: PrivacyAccount | None = None,
        interval_method: str = WALD_INFORMATION,
        noise_share: np.ndarray | None = None,
        utility_warnings: list[str] | None = None,
    ) -> None:
        self._names = list(names)
        self.params = pd.Series(params, index=self._names, name="coef")
        self._cov = cov
        self.llf = float(llf)
        self.converged = bool(converged)
        self.iterations = int(iterations)
        self.provenance = provenance
        self.notes = list(notes or [])
        self.privacy = privacy
        """Privacy spent per scope (``None`` for a non-private fit)."""
        self.interval_method = interval_method
        """How :attr:`bse` and :meth:`conf_int` were obtained, in words."""
        self.noise_share = (
            None if noise_share is None else pd.Series(noise_share, index=self._names,
                                                       name="noise share")
        )  # fmt: skip
        """Per coefficient, the share of its variance that is privacy noise
        (:func:`fedstats.models.utility.noise_shares`; ``None`` for a non-private fit)."""
        self.utility_warnings = list(utility_warnings or [])
        """What makes this private result misleading, in plain words
        (:class:`~fedstats.PrivacyUtilityWarning`); empty when nothing does."""

    @property
    def noise_dominated(self) -> bool:
        """Whether any warning says the privacy noise, a noisy count or a survival horizon
        makes this result misleading."""
        return bool(self.utility_warnings)

    # ---- inference
    def cov_params(self) -> pd.DataFrame:
        """Estimated covariance of the coefficients, the inverse information."""
        return pd.DataFrame(self._cov, index=self._names, columns=self._names)

    @property
    def bse(self) -> pd.Series:
        return pd.Series(np.sqrt(np.diag(self._cov)), index=self._names, name="std err")

    @property
    def zvalues(self) -> pd.Series:
        return (self.params / self.bse).rename("z")

    @property
    def tvalues(self) -> pd.Series:
        """Alias of :attr:`zvalues` (statsmodels' name for the Wald statistics)."""
        return self.zvalues

    @property
    def pvalues(self) -> pd.Series:
        return pd.Series(2 * stats.norm.sf(np.abs(self.zvalues)), index=self._names, name="P>|z|")

    def conf_int(self, alpha: float = 0.05) -> pd.DataFrame:
        """Wald confidence intervals; columns ``lower`` and ``upper``."""
        if not 0 < alpha < 1:
            raise ValueError(f"alpha must be in (0, 1), got {alpha}")
        q = stats.norm.ppf(1 - alpha / 2)
        return pd.DataFrame(
            {"lower": self.params - q * self.bse, "upper": self.params + q * self.bse}
        )

    # ---- sizes and fit statistics
    @property
    def n_obs(self) -> int:
        return sum(self.provenance.n_obs.values())

    @property
    def n_obs_by_site(self) -> pd.Series:
        return pd.Series(self.provenance.n_obs, name="n_obs")

    @property
    def nobs(self) -> float:
        """The number of observations the fit used, over every site (statsmodels' name)."""
        return float(self.n_obs)

    def _linear_predictor(
        self, design: dict[str, Any] | None, exog: pd.DataFrame, site: str | None
    ) -> tuple[pd.Series, np.ndarray | None]:
        """``x'beta`` for each row of ``exog`` (NaN where a covariate is missing), built with
        the design the sites agreed on (:func:`fedstats.contract.design_matrix.design_matrix`),
        and the design's offset (``None`` when it has none)."""
        if design is None:
            raise StudyConfigurationError(
                "these results carry no agreed design (derived results): refit to predict"
            )
        X, _, offset = design_matrix(DesignSpec.from_wire(design), exog, site=site)
        values = X @ self.params.reindex(list(design["columns"])).to_numpy(dtype=float)
        return pd.Series(values, index=exog.index, name="linear predictor"), offset

    @property
    def n_params(self) -> int:
        """Number of estimated coefficients, intercepts included."""
        return len(self._names)

    @property
    def aic(self) -> float:
        return 2 * self.n_params - 2 * self.llf

    @property
    def bic(self) -> float:
        return np.log(self.n_obs) * self.n_params - 2 * self.llf

    # ---- record
    def to_record(self, alpha: float = 0.05) -> dict[str, Any]:
        """The fit as plain JSON values, for a study's record of what was released.

        Keys: ``model``, ``terms`` (the coefficients' names in the design's order: JSON
        objects are written with sorted keys), ``params``, ``bse``, ``conf_int`` (``{"lower": {...},
        "upper": {...}}`` at ``1 - alpha``), ``alpha``, ``pvalues``, ``llf``
        (``None`` when not released), ``converged``, ``iterations``, ``notes``,
        ``provenance`` (:meth:`Provenance.to_record`) and ``privacy`` (the
        :class:`~fedstats.models.privacy.PrivacyAccount` as a dict, ``None`` for a
        non-private fit), plus the model's own fields (events, ties, strata). The
        format is :class:`studyfiles.fit_records.ResultRecord`, checked before it is returned.
        """
        ci = self.conf_int(alpha)
        record = {
            "model": self.model_name,
            "terms": [str(term) for term in self.params.index],
            "params": _series_record(self.params),
            "bse": _series_record(self.bse),
            "conf_int": {
                "lower": _series_record(ci["lower"]),
                "upper": _series_record(ci["upper"]),
            },
            "alpha": alpha,
            "pvalues": _series_record(self.pvalues),
            "llf": json_number(self.llf),
            "converged": self.converged,
            "iterations": self.iterations,
            "notes": list(self.notes),
            "provenance": self.provenance.to_record(),
            "privacy": None
            if self.privacy is None
            else json_tree(dataclasses.asdict(self.privacy)),
            "interval_method": self.interval_method,
            "noise_share": {} if self.noise_share is None else _series_record(self.noise_share),
            "utility_warnings": list(self.utility_warnings),
            **self._record_fields(),
        }
        return checked_result_record(record)

    def _record_fields(self) -> dict[str, Any]:
        """Model-specific entries of :meth:`to_record`."""
        return {}

    # ---- presentation
    def plot(self, ax=None, alpha: float = 0.05):  # type: ignore[no-untyped-def]
        """Each coefficient (the intercepts left out, as lifelines' ``CoxPHFitter.plot``) with
        its ``1 - alpha`` interval, one row per term; returns the figure, as every ``plot`` of
        fedstats does (Kaplan–Meier, cumulative incidence, heterogeneity)."""
        import matplotlib.pyplot as plt

        ci = self.conf_int(alpha)
        terms = [t for t in self.params.index if t != "Intercept" and not t.startswith("site[")]
        if ax is None:
            _, ax = plt.subplots(figsize=(6, 0.4 * len(terms) + 1.2))
        rows = np.arange(len(terms))[::-1]
        estimate = self.params[terms].to_numpy()
        low, high = ci.loc[terms, "lower"].to_numpy(), ci.loc[terms, "upper"].to_numpy()
        ax.errorbar(estimate, rows, xerr=[estimate - low, high - estimate], fmt="o", capsize=3)
        ax.axvline(0.0, color="grey", linewidth=0.8)
        ax.set_yticks(rows, labels=[literal(t) for t in terms])
        ax.set_xlabel(literal(f"coefficient with {100 * (1 - alpha):g}% interval"))
        ax.set_title(literal(self.model_name))
        return ax.figure

    def to_frame(self, alpha: float = 0.05) -> pd.DataFrame:
        """The coefficient table; a private fit adds each coefficient's ``noise share``."""
        ci = self.conf_int(alpha)
        level = f"{100 * (1 - alpha):g}%"
        table = pd.DataFrame(
            {
                "coef": self.params,
                "std err": self.bse,
                "z": self.zvalues,
                "P>|z|": self.pvalues,
                f"[{level} lower": ci["lower"],
                f"{level} upper]": ci["upper"],
            }
        )
        if self.noise_share is not None:
            table["noise share"] = self.noise_share
        return table

    def _info(self) -> list[tuple[str, str]]:
        prov = self.provenance
        return [
            ("Sites", str(len(prov.sites))),
            ("Observations", _count(self.n_obs)),
            ("Parameters", str(self.n_params)),
            ("Log-likelihood", _statistic(self.llf, ".4f", self.privacy is not None)),
            ("AIC", _statistic(self.aic, ".3f", self.privacy is not None)),
            ("Converged", "yes" if self.converged else "NO"),
            ("Rounds", str(prov.rounds)),
            ("Bytes exchanged", f"{prov.request_bytes + prov.reply_bytes:,}"),
        ]

    def _notes(self) -> list[str]:
        per_site = ", ".join(f"{s}={_count(n)}" for s, n in self.provenance.n_obs.items())
        warned = [f"WARNING: {w}" for w in self.utility_warnings]
        method = f"intervals: {self.interval_method}"
        return [*warned, f"patients per site: {per_site}", method, *self.notes]

    def _table(self) -> pd.DataFrame:
        return self.to_frame()

    def summary(self) -> Summary:
        """The coefficient table with fit facts: text that a notebook shows as a table."""
        return render_summary(self.model_name, self._info(), self._table(), self._notes())

    def _repr_html_(self) -> str:
        return render_html(self.model_name, self._info(), self._table(), self._notes())

    def __repr__(self) -> str:
        return f"<{type(self).__name__}: {self.n_params} parameters, {self.n_obs} patients>"


class MeanPredictions:
    """``predict`` of a model with a link: statsmodels' ``predict(exog, which=...)``."""

    design: dict[str, Any] | None

    def _mean(self, linear: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def predict(
        self, exog: pd.DataFrame, *, which: str = "mean", site: str | None = None
    ) -> pd.Series:
        """The fitted mean ``g^-1(x'beta + offset)`` (``which="mean"``: a probability for a
        logistic fit, a rate times exposure for Poisson) or the linear predictor ``x'beta +
        offset`` (``which="linear"``) for each row of ``exog``, a frame with the formula's
        columns, as statsmodels' ``predict``. ``offset`` is the design's offset column plus
        the log of its exposure column.

        The design is the one the sites agreed on (levels, columns); a row with a missing
        covariate gets NaN, a level the fit never saw is refused naming it. ``site`` names
        whose intercept applies to a fit with one intercept per site.
        """
        linear, offset = self._linear_predictor(self.design, exog, site)  # type: ignore[attr-defined]
        if offset is not None:
            linear = linear + offset
        if which == "linear":
            return linear
        if which != "mean":
            raise StudyConfigurationError(f"which must be 'mean' or 'linear', got {which!r}")
        return pd.Series(self._mean(linear.to_numpy()), index=exog.index, name="predicted")


class LogisticRegressionResults(MeanPredictions, LikelihoodResults):
    """Results of :class:`fedstats.LogisticRegression`."""

    model_name = "Federated logistic regression"

    def __init__(self, *, n_events: dict[str, float], model: Any = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.model = model
        """The :class:`fedstats.LogisticRegression` that was fitted (None for derived results);
        site-by-site estimates of it: :func:`fedstats.heterogeneity`."""
        self.n_events_by_site = pd.Series(n_events, name="n_events")
        self.design: dict[str, Any] | None = None
        """The agreed design (its wire form) a fit scored its sites with; ``None`` for
        derived results (:func:`fedstats.classification_metrics` then refuses them)."""
        self.path_evidence: dict[str, Any] | None = None
        """The fit's last answered point with every site's signed reply, relayed with an
        evaluation so that sites which verify paths can check the coefficients."""

    def _record_fields(self) -> dict[str, Any]:
        return {"n_events": _series_record(self.n_events_by_site)}

    def _mean(self, linear: np.ndarray) -> np.ndarray:
        """The logistic function: a probability from the linear predictor."""
        return expit(linear)

    @property
    def deviance(self) -> float:
        """``-2 llf``: for a binary outcome the saturated model's log-likelihood is 0."""
        return -2 * self.llf

    def odds_ratios(self, alpha: float = 0.05) -> pd.DataFrame:
        """``exp(coef)`` with its Wald interval: columns ``odds_ratio``, ``lower``, ``upper``.

        Rows for intercepts (``Intercept``, ``site[...]``) are baseline odds, not ratios.
        """
        ci = np.exp(self.conf_int(alpha))
        return pd.DataFrame(
            {"odds_ratio": np.exp(self.params), "lower": ci["lower"], "upper": ci["upper"]}
        )

    def recalibrate(
        self, target_prevalence: float | None = None, *, site: str | None = None
    ) -> LogisticRegressionResults:
        """The model for deployment where the outcome prevalence is ``target_prevalence``.

        Or ``site=name``: that site's own prevalence. Returns results whose
        params hold one ``Intercept`` and the shared slopes; see
        :mod:`fedstats.models.recalibration` for when the correction is valid and
        how it is derived. A fit with one intercept per site gets the
        label-shift estimate of the target intercept (its variance from the
        site intercepts' covariance); a single-intercept fit gets the shift
        ``delta``, with a :class:`~fedstats.errors.PrevalenceShiftWarning`.
        """
        import warnings

        from fedstats.errors import PrevalenceShiftWarning
        from fedstats.models.recalibration import (
            checked_prevalence,
            prevalence_shift,
            site_intercepts_to_target,
            site_prevalences,
        )

        if (target_prevalence is None) == (site is None):
            raise ValueError("give target_prevalence=... or site=..., not both")
        prevalences, weights = site_prevalences(
            self.n_events_by_site.to_dict(), self.provenance.n_obs
        )
        if site is not None:
            if site not in prevalences:
                raise ValueError(f"unknown site {site!r}; the fit's sites are {list(prevalences)}")
            target = prevalences[site]
        else:
            target = checked_prevalence(target_prevalence, "target_prevalence")
        names = list(self.params.index)
        site_columns = [f"site[{s}]" for s in prevalences]
        cov = self.cov_params().to_numpy()
        if all(c in names for c in site_columns):
            slopes = [n for n in names if n not in site_columns]
            index = [names.index(c) for c in site_columns]
            rest = [names.index(n) for n in slopes]
            intercepts = {
                s: float(self.params[c]) for s, c in zip(prevalences, site_columns, strict=True)
            }
            value, gradient = site_intercepts_to_target(intercepts, prevalences, weights, target)
            params = np.r_[value, self.params.to_numpy()[rest]]
            new_cov = np.empty((len(params), len(params)))
            new_cov[0, 0] = gradient @ cov[np.ix_(index, index)] @ gradient
            new_cov[0, 1:] = new_cov[1:, 0] = gradient @ cov[np.ix_(index, rest)]
            new_cov[1:, 1:] = cov[np.ix_(rest, rest)]
            how = (
                "label shift: intercept sum_s (n_s/N)(b_s - logit pi_s) + logit pi_T "
                f"with pi_T = {target:.4g}"
            )
            names = ["Intercept", *slopes]
        elif "Intercept" in names:
            delta = prevalence_shift(prevalences, weights, target)
            message = (
                "a single-intercept fit's intercept is not the average of site intercepts, so "
                f"the prevalence shift delta = {delta:+.4g} is only approximate; fit with "
                "site_intercepts=True for the label-shift correction"
            )
            warnings.warn(message, PrevalenceShiftWarning, stacklevel=2)
            params = self.params.to_numpy().copy()
            params[names.index("Intercept")] += delta
            new_cov = cov
            how = f"approximate prevalence shift delta = {delta:+.6g} to pi_T = {target:.4g}"
        else:
            raise ValueError("the model has no intercept to recalibrate")
        return LogisticRegressionResults(
            names=names,
            params=params,
            cov=new_cov,
            llf=float("nan"),
            converged=self.converged,
            iterations=self.iterations,
            provenance=self.provenance,
            notes=[*self.notes, f"recalibrated for deployment: {how}"],
            privacy=self.privacy,
            n_events=self.n_events_by_site.to_dict(),
        )

    def _info(self) -> list[tuple[str, str]]:
        info = super()._info()
        events = self.n_events_by_site.sum()
        info.insert(2, ("Events", _count(int(events) if not self.privacy else float(events))))
        info.insert(4, ("Deviance", _statistic(self.deviance, ".4f", self.privacy is not None)))
        return info

    def _table(self) -> pd.DataFrame:
        table = self.to_frame()
        table.insert(1, "odds ratio", np.exp(self.params))
        return table


class CoxPHResults(LikelihoodResults):
    """Results of :class:`fedstats.CoxPH`: log hazard ratios with Wald inference.

    ``llf`` is the log partial likelihood (summed over strata, unpenalised).
    """

    model_name = "Federated Cox proportional hazards regression"

    def __init__(
        self,
        *,
        n_events: dict[str, float],
        ties: str,
        strata: tuple[str, ...],
        baseline: pd.DataFrame | None = None,
        design: dict | None = None,
        events_used: float | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.n_events_by_site = pd.Series(n_events, name="n_events")
        self.events_used = events_used
        """Events the fit used, when fewer than the sites hold may have been: the pooled
        model's events up to each site's safe horizon (``None``: every event)."""
        self.ties = ties
        self.strata = strata
        self._baseline = baseline
        self.design = design
        """The agreed design (wire form) the coefficients apply to, or ``None``; with it
        :func:`fedstats.concordance_index` scores held-out sites."""

    def _record_fields(self) -> dict[str, Any]:
        return {
            "n_events": _series_record(self.n_events_by_site),
            "events_used": None if self.events_used is None else json_number(self.events_used),
            "ties": self.ties,
            "strata": list(self.strata),
        }

    def predict_log_partial_hazard(self, df: pd.DataFrame) -> pd.Series:
        """``x'beta`` for each row of ``df`` (NaN where a covariate is missing).

        Not centred: lifelines subtracts the training data's column means (``(x - xbar)'beta``),
        which stay at the sites; differences between rows, hazard ratios and
        :meth:`predict_survival_function` are the same either way.
        """
        linear, _ = self._linear_predictor(self.design, df, None)
        return linear.rename("log partial hazard")

    def predict_partial_hazard(self, df: pd.DataFrame) -> pd.Series:
        """``exp(x'beta)`` for each row of ``df`` (not centred; see
        :meth:`predict_log_partial_hazard`)."""
        return np.exp(self.predict_log_partial_hazard(df)).rename("partial hazard")

    def predict_survival_function(self, df: pd.DataFrame) -> pd.DataFrame:
        """``S(t | x) = exp(-H0(t) exp(x'beta))`` on the grid, one column per row of ``df``
        (pooled model only: Breslow's baseline ``H0`` of :attr:`baseline_cumulative_hazard_`,
        at ``x = 0``), as lifelines' ``predict_survival_function``."""
        baseline = self.baseline_cumulative_hazard_["cumulative_hazard"].to_numpy()
        hazard = self.predict_partial_hazard(df).to_numpy()
        table = np.exp(-np.outer(baseline, hazard))
        return pd.DataFrame(table, index=self.baseline_cumulative_hazard_.index, columns=df.index)

    @property
    def baseline_cumulative_hazard_(self) -> pd.DataFrame:
        """Breslow's estimate ``H0(g_k) = sum_{j<=k} d_j / S0_j(beta)`` on the grid (pooled
        model only: a stratified model's baselines stay at the sites)."""
        if self._baseline is None:
            raise AttributeError(
                "baseline hazards of a stratified model stay at the sites; fit with "
                "strata=None on a time grid for a shared baseline"
            )
        return self._baseline[["cumulative_hazard"]]

    @property
    def baseline_survival_(self) -> pd.DataFrame:
        """``exp(-H0)`` on the grid (pooled model only)."""
        return np.exp(-self.baseline_cumulative_hazard_).rename(
            columns={"cumulative_hazard": "survival"}
        )

    def hazard_ratios(self, alpha: float = 0.05) -> pd.DataFrame:
        """``exp(coef)`` with its Wald interval: columns ``hazard_ratio``, ``lower``, ``upper``."""
        ci = np.exp(self.conf_int(alpha))
        return pd.DataFrame(
            {"hazard_ratio": np.exp(self.params), "lower": ci["lower"], "upper": ci["upper"]}
        )

    @property
    def aic(self) -> float:
        """Partial AIC, ``2 p - 2 llf`` (as lifelines' ``AIC_partial_``)."""
        return 2 * self.n_params - 2 * self.llf

    @property
    def bic(self) -> float:
        """``log(events) p - 2 llf``: the partial likelihood's information grows with events."""
        events = max(float(self.n_events_by_site.sum()), 1.0)
        return np.log(events) * self.n_params - 2 * self.llf

    def _info(self) -> list[tuple[str, str]]:
        info = super()._info()
        held = self.n_events_by_site.sum()
        events = _count(int(held) if not self.privacy else float(held))
        if self.events_used is not None:
            used = self.events_used
            events = f"{_count(round(used) if not self.privacy else used)} of {events} used"
        info.insert(2, ("Events", events))
        info.insert(3, ("Ties", self.ties))
        info.insert(4, ("Strata", " x ".join(self.strata) or "none"))
        info = [(k, v) for k, v in info if k != "Log-likelihood"]
        info.insert(5, ("Log partial lik.", f"{self.llf:.4f}"))
        return info

    def _table(self) -> pd.DataFrame:
        table = self.to_frame()
        table.insert(1, "exp(coef)", np.exp(self.params))
        return table
