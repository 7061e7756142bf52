"""Results of :class:`fedstats.GLM`: coefficients, dispersion and fit statistics of one family.

Wald inference as for every likelihood fit (:mod:`fedstats.models.results`),
with the covariance ``phi (X^T W X)^-1``: ``phi = 1`` for the binomial and
Poisson families, and for a Gaussian (or quasi-Poisson) fit Pearson's
``X^2 / (sum w - p)`` (McCullagh & Nelder, *Generalized Linear Models*, 2nd
ed., 1989, §2.5.1 and §4.5), as statsmodels' ``GLM.fit()`` and R's ``glm``
report it. The log-likelihood of a Gaussian fit is the profile one, at
``phi = deviance / sum w`` (statsmodels' ``llf``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
from scipy.special import expit

from fedstats.models.results import (
    LikelihoodResults,
    MeanPredictions,
    _count,
    _series_record,
    _statistic,
)

FAMILY_TITLES = {
    "binomial": "binomial, logit link",
    "poisson": "Poisson, log link",
    "gaussian": "Gaussian, identity link",
}


class GLMResults(MeanPredictions, LikelihoodResults):
    """Results of :class:`fedstats.GLM`.

    Beyond :class:`~fedstats.models.results.LikelihoodResults`: ``family``,
    ``scale`` (the dispersion ``phi`` in the covariance), ``deviance``,
    ``pearson_chi2``, ``nobs`` (the weight total: rows, or patients the
    frequency weights stand for), ``df_resid`` and, by family,
    :meth:`rate_ratios` (Poisson) or :meth:`odds_ratios` (binomial).
    """

    def __init__(
        self,
        *,
        family: str,
        scale: float,
        deviance: float,
        pearson_chi2: float,
        nobs: float,
        n_events: dict[str, float],
        model: Any = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.family = family
        self.scale = float(scale)
        self.deviance = float(deviance)
        self.pearson_chi2 = float(pearson_chi2)
        self._nobs = float(nobs)
        self.model = model
        """The :class:`fedstats.GLM` that was fitted."""
        self.n_events_by_site = pd.Series(n_events, name="n_events")
        self.design: dict[str, Any] | None = None
        """The agreed design (wire form) the coefficients apply to (:meth:`predict`)."""

    @property
    def nobs(self) -> float:  # type: ignore[override]
        """The weight total: rows, or patients the frequency weights stand for."""
        return self._nobs

    def _mean(self, linear: np.ndarray) -> np.ndarray:
        """The inverse link of the family: expit (binomial), exp (Poisson), identity."""
        return {"binomial": expit, "poisson": np.exp, "gaussian": lambda v: v}[self.family](linear)

    @property
    def model_name(self) -> str:  # type: ignore[override]
        return f"Federated GLM ({FAMILY_TITLES[self.family]})"

    @property
    def df_resid(self) -> float:
        """Residual degrees of freedom, ``sum w - p``."""
        return self.nobs - self.n_params

    @property
    def aic(self) -> float:
        """``-2 llf + 2 (p + 1)`` for a Gaussian fit (its scale is estimated), else ``+ 2 p``."""
        extra = 1 if self.family == "gaussian" else 0
        return -2 * self.llf + 2 * (self.n_params + extra)

    @property
    def bic(self) -> float:
        """``deviance - df_resid log(sum w)``: statsmodels' (and older R's) deviance-based BIC."""
        return self.deviance - self.df_resid * np.log(self.nobs)

    def rate_ratios(self, alpha: float = 0.05) -> pd.DataFrame:
        """``exp(coef)`` of a Poisson fit with its Wald interval: ``rate_ratio``, ``lower``,
        ``upper``. The intercept's row is the baseline rate per unit of exposure."""
        if self.family != "poisson":
            raise ValueError(f"rate ratios belong to a Poisson fit, not a {self.family} one")
        return self._exponentiated("rate_ratio", alpha)

    def odds_ratios(self, alpha: float = 0.05) -> pd.DataFrame:
        """``exp(coef)`` of a binomial fit with its Wald interval."""
        if self.family != "binomial":
            raise ValueError(f"odds ratios belong to a binomial fit, not a {self.family} one")
        return self._exponentiated("odds_ratio", alpha)

    def _exponentiated(self, name: str, alpha: float) -> pd.DataFrame:
        ci = np.exp(self.conf_int(alpha))
        return pd.DataFrame({name: np.exp(self.params), "lower": ci["lower"], "upper": ci["upper"]})

    def _record_fields(self) -> dict[str, Any]:
        return {"n_events": _series_record(self.n_events_by_site)}

    def _info(self) -> list[tuple[str, str]]:
        info = super()._info()
        nobs = int(self.nobs) if self.nobs.is_integer() else self.nobs
        info[1] = ("Observations", _count(nobs))
        info.insert(3, ("Deviance", _statistic(self.deviance, ".4f", self.privacy is not None)))
        if self.family == "gaussian" or self.scale != 1.0:
            info.insert(4, ("Scale (dispersion)", f"{self.scale:.6g}"))
        if self.family == "poisson":
            info.insert(2, ("Events (total count)", _count(float(self.n_events_by_site.sum()))))
        return info

    def _table(self) -> pd.DataFrame:
        table = self.to_frame()
        ratio = {"poisson": "rate ratio", "binomial": "odds ratio"}.get(self.family)
        if ratio:
            table.insert(1, ratio, np.exp(self.params))
        return table
