"""Combining the sites' model updates: the weighted mean and robust alternatives.

Each rule maps the sites' flat update vectors ``u_1..u_n`` (and weights
``w_k``) to one vector:

* :class:`Mean` — ``sum_k w_k u_k / sum_k w_k`` (FedAvg, McMahan et al.,
  AISTATS 2017); one arbitrary update moves it arbitrarily (breakdown
  point 0);
* :class:`CoordinateMedian` — the median of each coordinate (Yin, Chen,
  Ramchandran & Bartlett, "Byzantine-robust distributed learning", ICML
  2018); breakdown point 1/2;
* :class:`TrimmedMean` — per coordinate, drop the ``ceil(beta n)`` largest
  and smallest values and average the rest (Yin et al. 2018); tolerates
  fewer than ``beta n`` arbitrary sites;
* :class:`NormBounded` — scale each update to L2 norm at most ``bound``
  before the inner rule (Sun et al., "Can you really backdoor federated
  learning?", 2019); bounds any one site's influence to ``bound`` (times
  its weight share).

The robust rules ignore the weights (a weighted median would let a site
claiming a large ``n`` dominate again), which is what they are for.

The rules are part of the contract: an exact training's request names its rule
(:func:`to_wire`), and a site that verifies paths re-derives the next network
with the same rule from every site's signed update
(:class:`fedstats.contract.paths.FedAvgPath`); :func:`from_wire` reads a rule
back, refusing anything it does not know.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from fedstats.errors import StudyConfigurationError


class Aggregator(Protocol):
    """Anything that combines update vectors and weights into one vector."""

    def __call__(self, updates: Sequence[np.ndarray], weights: Sequence[float]) -> np.ndarray: ...


def _stack(
    updates: Sequence[np.ndarray], weights: Sequence[float]
) -> tuple[np.ndarray, np.ndarray]:
    if len(updates) == 0:
        raise StudyConfigurationError("there is no update to aggregate")
    stacked = np.stack([np.asarray(u, dtype=np.float64).ravel() for u in updates])
    w = np.asarray(weights, dtype=np.float64)
    if w.shape != (len(updates),) or not np.all(np.isfinite(w)) or np.any(w < 0) or w.sum() <= 0:
        raise StudyConfigurationError("weights must be one non-negative number per update")
    return stacked, w


@dataclass(frozen=True)
class Mean:
    """The weighted mean (FedAvg)."""

    def __call__(self, updates: Sequence[np.ndarray], weights: Sequence[float]) -> np.ndarray:
        stacked, w = _stack(updates, weights)
        return w @ stacked / w.sum()


@dataclass(frozen=True)
class CoordinateMedian:
    """The coordinate-wise median (unweighted)."""

    def __call__(self, updates: Sequence[np.ndarray], weights: Sequence[float]) -> np.ndarray:
        stacked, _ = _stack(updates, weights)
        return np.median(stacked, axis=0)


@dataclass(frozen=True)
class TrimmedMean:
    """The coordinate-wise ``beta``-trimmed mean (unweighted)."""

    beta: float = 0.2

    def __post_init__(self) -> None:
        if not 0 <= self.beta < 0.5:
            raise StudyConfigurationError(
                f"trim fraction beta must be in [0, 0.5), got {self.beta}"
            )

    def __call__(self, updates: Sequence[np.ndarray], weights: Sequence[float]) -> np.ndarray:
        stacked, _ = _stack(updates, weights)
        n = len(stacked)
        cut = math.ceil(self.beta * n) if self.beta > 0 else 0
        if n - 2 * cut < 1:
            raise StudyConfigurationError(
                f"trimming {cut} of each end leaves no update of {n}; lower beta or add sites"
            )
        ordered = np.sort(stacked, axis=0)
        return ordered[cut : n - cut].mean(axis=0)


@dataclass(frozen=True)
class NormBounded:
    """Scale each update to L2 norm at most ``bound``, then apply ``inner``."""

    bound: float
    inner: Aggregator = field(default_factory=Mean)

    def __post_init__(self) -> None:
        if not (math.isfinite(self.bound) and self.bound > 0):
            raise StudyConfigurationError(f"the norm bound must be positive, got {self.bound}")

    def __call__(self, updates: Sequence[np.ndarray], weights: Sequence[float]) -> np.ndarray:
        stacked, w = _stack(updates, weights)
        norms = np.linalg.norm(stacked, axis=1)
        factors = np.minimum(1.0, self.bound / np.maximum(norms, 1e-300))
        return self.inner(list(stacked * factors[:, None]), list(w))


RULE_KEY = "aggregator"
"""The request argument of an exact training round naming its combination rule (absent: FedAvg's
weighted mean of the updates by each site's rows)."""

MAX_WIRE_DEPTH = 4
"""How deeply norm bounds may nest on the wire (one is all anyone needs)."""


def to_wire(rule: Aggregator) -> dict[str, Any] | None:
    """A rule of this module as its request argument; ``None`` for any other callable (a
    coordinator's own rule, which no site can re-derive)."""
    if isinstance(rule, Mean):
        return {"rule": "mean"}
    if isinstance(rule, CoordinateMedian):
        return {"rule": "median"}
    if isinstance(rule, TrimmedMean):
        return {"rule": "trimmed_mean", "beta": float(rule.beta)}
    if isinstance(rule, NormBounded):
        inner = to_wire(rule.inner)
        return None if inner is None else {"rule": "norm_bounded",
                                           "bound": float(rule.bound), "inner": inner}  # fmt: skip
    return None


def from_wire(wire: Any, depth: int = 0) -> Aggregator:
    """The rule a request argument names. Raises ``ValueError`` for anything but a rule of
    this module with valid parameters."""
    if not isinstance(wire, dict) or depth > MAX_WIRE_DEPTH:
        raise ValueError("an aggregation rule must be a mapping naming its rule")
    name = wire.get("rule")
    fields = {
        "mean": {"rule"},
        "median": {"rule"},
        "trimmed_mean": {"rule", "beta"},
        "norm_bounded": {"rule", "bound", "inner"},
    }.get(name if isinstance(name, str) else "")
    if fields is None or set(wire) != fields:
        raise ValueError(f"unknown aggregation rule {name!r} or fields {sorted(wire)}")
    number = {k: wire[k] for k in ("beta", "bound") if k in wire}
    if any(isinstance(v, bool) or not isinstance(v, int | float) for v in number.values()):
        raise ValueError("an aggregation rule's parameters must be numbers")
    try:
        if name == "mean":
            return Mean()
        if name == "median":
            return CoordinateMedian()
        if name == "trimmed_mean":
            return TrimmedMean(float(wire["beta"]))
        return NormBounded(float(wire["bound"]), from_wire(wire["inner"], depth + 1))
    except StudyConfigurationError as error:
        raise ValueError(str(error)) from None
