"""Weight functions of the weighted log-rank family, from pooled counts on the grid.

A weighted log-rank test puts weight ``w_k`` on grid point ``k`` of each
stratum: ``O_g - E_g = sum_k w_k (d_gk - n_gk d_k / n_k)``, with variance
``sum_k w_k^2 d_k (n_k - d_k) / (n_k - 1) (n_gk / n_k) (delta_gh - n_hk / n_k)``
(Fleming & Harrington, *Counting Processes and Survival Analysis*, Wiley 1991,
ch. 7). The weights follow lifelines (``multivariate_logrank_test``'s
``weightings``) and statsmodels (``survdiff``'s ``weight_type``):

* ``None`` -- the log-rank test, ``w_k = 1`` (Mantel 1966);
* ``"wilcoxon"`` -- Gehan–Breslow, ``w_k = n_k``, the number at risk over all
  groups (Gehan 1965; Breslow 1970; statsmodels ``"gb"``);
* ``"tarone-ware"`` -- ``w_k = sqrt(n_k)`` (Tarone & Ware 1977; statsmodels ``"tw"``);
* ``"fleming-harrington"`` -- ``w_k = S(t_k-)^p (1 - S(t_k-))^q`` with ``S``
  the Kaplan–Meier estimate of the stratum's groups pooled, taken at its left
  limit: the value after the previous grid point, 1 at the first (Harrington
  & Fleming 1982; lifelines' ``p``, ``q``; statsmodels ``"fh"`` with ``fh_p``
  is ``q = 0``).

Every weight is a function of the pooled counts, so the coordinator computes
it; on noisy counts the same function is applied to every bootstrap draw.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from fedstats.errors import StudyConfigurationError

WEIGHTINGS = ("wilcoxon", "tarone-ware", "fleming-harrington")
"""The weightings besides the log-rank test's own (``None``)."""


@dataclass(frozen=True)
class Weighting:
    """One weight function of the family (see the module docstring)."""

    name: str | None = None
    p: float = 0.0
    q: float = 0.0

    @classmethod
    def of(cls, name: str | None, p: float | None, q: float | None) -> Weighting:
        """The weighting ``name`` (``p`` and ``q`` only for Fleming–Harrington), checked."""
        if name is not None and name not in WEIGHTINGS:
            raise StudyConfigurationError(
                f"weightings must be None or one of {list(WEIGHTINGS)}, got {name!r}"
            )
        if name != "fleming-harrington":
            if p is not None or q is not None:
                raise StudyConfigurationError(
                    "p= and q= are the exponents of weightings='fleming-harrington' only"
                )
            return cls(name)
        if p is None:
            raise StudyConfigurationError(
                "weightings='fleming-harrington' needs p= (and q=, default 0): the weight is "
                "S(t-)^p (1 - S(t-))^q"
            )
        q = 0.0 if q is None else q
        for label, value in (("p", p), ("q", q)):
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise StudyConfigurationError(f"{label}= must be a number, got {value!r}")
            if not (math.isfinite(value) and value >= 0):
                raise StudyConfigurationError(f"{label}= must be finite and >= 0, got {value!r}")
        return cls(name, float(p), float(q))

    def describe(self) -> str:
        """The test's name, in words."""
        if self.name is None:
            return "log-rank"
        if self.name == "fleming-harrington":
            return f"Fleming-Harrington (p={self.p:g}, q={self.q:g})"
        return {"wilcoxon": "Wilcoxon (Gehan-Breslow)", "tarone-ware": "Tarone-Ware"}[self.name]

    def weights(self, total_at_risk: np.ndarray, total_events: np.ndarray) -> np.ndarray:
        """``w_k`` from the pooled numbers at risk and of events, along the last axis (the
        grid); any leading axes (draws, strata) are kept."""
        if self.name is None:
            return np.ones_like(total_at_risk, dtype=np.float64)
        if self.name == "wilcoxon":
            return np.asarray(total_at_risk, dtype=np.float64)
        if self.name == "tarone-ware":
            return np.sqrt(np.maximum(total_at_risk, 0.0))
        survival = np.cumprod(left_factors(total_at_risk, total_events), axis=-1)
        left = np.concatenate(
            [np.ones_like(survival[..., :1]), survival[..., :-1]], axis=-1
        )  # S(t-): the value after the previous grid point
        return np.power(left, self.p) * np.power(1.0 - left, self.q)


def left_factors(total_at_risk: np.ndarray, total_events: np.ndarray) -> np.ndarray:
    """The Kaplan–Meier factors ``1 - d_k / n_k`` (1 where nobody is at risk)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(total_at_risk > 0, 1.0 - total_events / total_at_risk, 1.0)
