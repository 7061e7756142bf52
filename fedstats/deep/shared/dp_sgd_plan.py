"""The DP-SGD block of a training request: sampling rate, noise, clipping norm and steps.

The coordinator plans it (:mod:`fedstats.deep.training.privacy_plan`) and each site
runs exactly the mechanism it declares (:mod:`fedstats.deep.site.dp_sgd`), after
charging its ``dp_accounting`` event (:meth:`DpSgdPlan.event`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import dp_accounting

from fedstats.contract.dp_request import (
    MAX_NOISE_MULTIPLIER,
    MIN_NOISE_MULTIPLIER,
    noise_multiplier_in_range,
)
from fedstats.errors import MalformedRequestError

ENGINES = ("auto", "bookkeeping", "ghost", "hooks")


MAX_STEPS = 1_000_000


MAX_GRAD_NORM = 1e6
"""The largest per-example clipping norm a request may set: the noise is ``sigma`` times it,
and past about 1e154 its square overflows; no network's gradients need more."""


@dataclass(frozen=True)
class DpSgdPlan:
    """The mechanism one training request runs at a site: ``steps`` DP-SGD steps."""

    sample_rate: float
    noise_multiplier: float
    max_grad_norm: float
    steps: int
    engine: str = "auto"

    def event(self) -> dp_accounting.DpEvent:
        """``SelfComposedDpEvent(PoissonSampledDpEvent(q, GaussianDpEvent(sigma)), steps)``."""
        return dp_sgd_event(self.sample_rate, self.noise_multiplier, self.steps)

    def to_args(self) -> dict[str, Any]:
        return {
            "sample_rate": self.sample_rate,
            "noise_multiplier": self.noise_multiplier,
            "max_grad_norm": self.max_grad_norm,
            "steps": self.steps,
            "engine": self.engine,
        }

    @classmethod
    def from_args(cls, args: dict[str, Any]) -> DpSgdPlan:
        """The request's ``dp_sgd`` block, checked; a typed refusal otherwise."""
        block = args.get("dp_sgd")
        keys = {"sample_rate", "noise_multiplier", "max_grad_norm", "steps", "engine"}
        if not (isinstance(block, dict) and set(block) == keys):
            raise MalformedRequestError(
                site=None, task=None, reason=f"a private request needs 'dp_sgd' with {sorted(keys)}"
            )
        q, clip, sigma = block["sample_rate"], block["max_grad_norm"], block["noise_multiplier"]
        steps = block["steps"]
        if not (
            _positive(q)
            and q <= 1
            and noise_multiplier_in_range(sigma)
            and _positive(clip)
            and clip <= MAX_GRAD_NORM
        ):
            raise MalformedRequestError(
                site=None,
                task=None,
                reason="'dp_sgd' needs 0 < sample_rate <= 1, noise_multiplier in "
                f"[{MIN_NOISE_MULTIPLIER:g}, {MAX_NOISE_MULTIPLIER:g}] and "
                f"0 < max_grad_norm <= {MAX_GRAD_NORM:g}",
            )
        if not (type(steps) is int and 1 <= steps <= MAX_STEPS):
            raise MalformedRequestError(
                site=None, task=None, reason=f"dp_sgd steps must be an integer in 1..{MAX_STEPS}"
            )
        if not (isinstance(block["engine"], str) and block["engine"] in ENGINES):
            raise MalformedRequestError(
                site=None, task=None, reason=f"dp_sgd engine must be one of {ENGINES}"
            )
        return cls(float(q), float(sigma), float(clip), steps, block["engine"])


def dp_sgd_event(sample_rate: float, noise_multiplier: float, steps: int) -> dp_accounting.DpEvent:
    """The ``dp_accounting`` event of ``steps`` Poisson-sampled Gaussian steps."""
    return dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(
            sample_rate, dp_accounting.GaussianDpEvent(noise_multiplier)
        ),
        steps,
    )


def training_event(args: dict[str, Any]) -> dp_accounting.DpEvent:
    """``Task.private_training`` of ``deep.train``: the event the request's DP-SGD runs."""
    return DpSgdPlan.from_args(args).event()


def _positive(value: Any) -> bool:
    return (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and value > 0
    )
