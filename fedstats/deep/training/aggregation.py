"""Combining the sampled sites' updates at the coordinator.

Client sampling: each site takes part in a round independently with
probability ``p`` (``sample_rate_sites``). With weights
``w_k = n_k / (N p)`` the combination ``sum_{k in S} w_k Delta_k`` is an
unbiased estimate of the full-participation FedAvg update
``sum_k (n_k / N) Delta_k`` (McMahan et al., AISTATS 2017; the unbiased
weighting of Li, Sahu, Zaheer et al., MLSys 2020, Sec. 4).

An :class:`~fedstats.models.aggregation.Aggregator` maps the sampled sites' flat
update vectors and their weights to one update; :func:`weighted_sum` is
FedAvg's. A robust rule of :mod:`fedstats.models.aggregation` (coordinate-wise
median, trimmed mean, norm bounding) can be passed in its place.
Client-level privacy replaces the combination by DP-FedAvg's clipped, noised
sum over the expected number of sites (:class:`fedstats.models.client_dp.DPFedAvg`,
passed as ``fit(privacy=...)``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from fedstats.models.aggregation import Aggregator

__all__ = ["Aggregator", "client_weights", "sample_sites", "weighted_sum"]


def weighted_sum(updates: Sequence[np.ndarray], weights: Sequence[float]) -> np.ndarray:
    """``sum_k w_k Delta_k`` (FedAvg's combination with weights ``n_k / (N p)``)."""
    total = np.zeros_like(np.asarray(updates[0], dtype=np.float64))
    for update, weight in zip(updates, weights, strict=True):
        total += float(weight) * np.asarray(update, dtype=np.float64)
    return total


def sample_sites(sites: Sequence[str], rate: float, rng: np.random.Generator) -> list[str]:
    """Each site independently with probability ``rate`` (all of them when ``rate == 1``)."""
    if rate >= 1.0:
        return list(sites)
    return [s for s in sites if rng.random() < rate]


def client_weights(
    n_obs: Mapping[str, float], sampled: Sequence[str], rate: float
) -> dict[str, float]:
    """``n_k / (N p)`` for the sampled sites, ``N`` summed over every site of the study."""
    total = float(sum(max(v, 0.0) for v in n_obs.values()))
    if total <= 0:
        return {s: 1.0 / (len(n_obs) * rate) for s in sampled}
    return {s: max(float(n_obs[s]), 0.0) / (total * rate) for s in sampled}
