"""Prevalence-shift (label-shift) correction of a binary model's intercept.

Under *label shift* the class-conditional distributions ``p(x | y)`` are the
same at every site and only the prevalence ``pi_s = P(y = 1)`` differs. By
Bayes' rule the log-odds at site ``s`` are then

    logit P_s(y = 1 | x) = log p(x | 1) / p(x | 0) + logit(pi_s),

so each site's optimal model shares its slopes and has intercept
``b_s = c0 + logit(pi_s)`` (Saerens, Latinne & Decaestecker, "Adjusting the
outputs of a classifier to new a priori probabilities", Neural Computation
2002; Lipton, Wang & Smola, ICML 2018). The model for a target population
with prevalence ``pi_T`` has intercept ``c0 + logit(pi_T)``:

* fitted with one intercept per site (``site_intercepts=True``, the design
  label shift calls for): ``c0`` is estimated by
  ``sum_s (n_s / N) (b_s - logit(pi_s))``, so the target intercept is
  ``sum_s (n_s / N) (b_s - logit(pi_s)) + logit(pi_T)``;
* for a model averaged from local optima (FedAvg-type), whose intercept
  averages ``c0 + logit(pi_s)`` with weights ``n_s / N``: add
  ``delta = logit(pi_T) - sum_s (n_s / N) logit(pi_s)``, the exact
  correction for that model;
* for a pooled single-intercept fit the same ``delta`` is only approximate:
  the pooled maximum-likelihood intercept is not the weighted average of
  the site intercepts (a warning says so).

The correction is valid when label shift holds (shared ``p(x | y)``) and the
log-odds are linear in the design, so that each site's model is correctly
specified; it says nothing about covariate shift. Site prevalences come from
the fit's counts (noisy, and already paid for, when the fit was private).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

from fedstats.errors import StudyConfigurationError


def logit(p: float) -> float:
    return math.log(p / (1.0 - p))


def checked_prevalence(value: float, what: str) -> float:
    if not (isinstance(value, int | float) and 0.0 < value < 1.0):
        raise StudyConfigurationError(f"{what} must be a prevalence in (0, 1), got {value!r}")
    return float(value)


def site_prevalences(
    n_events: Mapping[str, float], n_obs: Mapping[str, float]
) -> tuple[dict[str, float], dict[str, float]]:
    """Prevalences ``pi_s`` and weights ``n_s / N`` from (possibly noisy) counts.

    Noisy counts are clipped so that every prevalence lies in
    ``[0.5 / n_s, 1 - 0.5 / n_s]`` (post-processing).
    """
    sizes = {s: max(float(n), 1.0) for s, n in n_obs.items()}
    total = sum(sizes.values())
    prevalences = {}
    for site, n in sizes.items():
        events = min(max(float(n_events[site]), 0.5), n - 0.5)
        prevalences[site] = events / n
    return prevalences, {s: n / total for s, n in sizes.items()}


def prevalence_shift(
    prevalences: Mapping[str, float], weights: Mapping[str, float], target: float
) -> float:
    """``delta = logit(pi_T) - sum_s w_s logit(pi_s)``: the intercept shift of an averaged model."""
    target = checked_prevalence(target, "target_prevalence")
    return logit(target) - sum(weights[s] * logit(p) for s, p in prevalences.items())


def site_intercepts_to_target(
    intercepts: Mapping[str, float],
    prevalences: Mapping[str, float],
    weights: Mapping[str, float],
    target: float,
) -> tuple[float, np.ndarray]:
    """The target intercept from site intercepts, and its gradient in them (for its variance).

    ``c_T = sum_s w_s (b_s - logit(pi_s)) + logit(pi_T)``; ``dc_T / db_s = w_s``.
    """
    target = checked_prevalence(target, "target_prevalence")
    sites = list(intercepts)
    value = sum(weights[s] * (intercepts[s] - logit(prevalences[s])) for s in sites)
    return value + logit(target), np.array([weights[s] for s in sites])
