"""The trainer's options as three checked values: what a site does in a round, how
DP-SGD clips and samples there, and how the coordinator combines the round.

Each value checks itself when built, so a wrong option stops the trainer's
constructor before any site is contacted, with a message naming the option.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from fedstats.contract.quantize import check_bits
from fedstats.deep.shared.dp_sgd_plan import ENGINES
from fedstats.deep.shared.wire import ALGORITHMS
from fedstats.errors import StudyConfigurationError


def finite(value: Any) -> bool:
    """A real, finite number (``bool`` is not one)."""
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _positive_int(name: str, value: Any) -> None:
    if type(value) is not int or value < 1:
        raise StudyConfigurationError(f"{name} must be a positive integer")


@dataclass(frozen=True)
class LocalWork:
    """One sampled site's work in one round: ``algorithm`` (``fedavg``, ``fedprox`` with
    proximal weight ``mu``, ``scaffold``), local SGD with learning rate ``lr`` over
    ``local_epochs`` epochs or ``local_steps`` steps (exactly one), in batches of
    ``batch_size``."""

    algorithm: str
    local_epochs: int | None
    local_steps: int | None
    lr: float
    batch_size: int
    mu: float

    def __post_init__(self) -> None:
        if self.algorithm not in ALGORITHMS:
            raise StudyConfigurationError(f"algorithm must be one of {ALGORITHMS}")
        if (self.local_epochs is None) == (self.local_steps is None):
            raise StudyConfigurationError("give exactly one of local_epochs and local_steps")
        _positive_int("batch_size", self.batch_size)
        for name in ("local_epochs", "local_steps"):
            if getattr(self, name) is not None:
                _positive_int(name, getattr(self, name))
        if not (finite(self.lr) and self.lr > 0 and finite(self.mu) and self.mu >= 0):
            raise StudyConfigurationError("lr must be positive and mu non-negative")
        if self.algorithm == "fedprox" and self.mu <= 0:
            raise StudyConfigurationError("FedProx needs mu > 0 (mu = 0 is FedAvg)")
        object.__setattr__(self, "lr", float(self.lr))
        object.__setattr__(self, "mu", float(self.mu))

    def describe(self) -> str:
        """The local work for the result's notes."""
        work = (
            f"{self.local_steps} local steps"
            if self.local_steps
            else f"{self.local_epochs} local epoch(s)"
        )
        return f"local SGD lr {self.lr}; {work}"


@dataclass(frozen=True)
class DpSgdOptions:
    """DP-SGD's per-patient clipping norm, Poisson sampling rate (``None``: the batch size
    over the median site's size) and clipping engine (:mod:`fedstats.deep.site.dp_sgd`)."""

    max_grad_norm: float
    sample_rate: float | None
    engine: str

    def __post_init__(self) -> None:
        if not (finite(self.max_grad_norm) and self.max_grad_norm > 0):
            raise StudyConfigurationError("max_grad_norm must be positive")
        if self.sample_rate is not None and not (
            finite(self.sample_rate) and 0 < self.sample_rate <= 1
        ):
            raise StudyConfigurationError("sample_rate must be in (0, 1]")
        if self.engine not in ENGINES:
            raise StudyConfigurationError(f"engine must be one of {ENGINES}")
        object.__setattr__(self, "max_grad_norm", float(self.max_grad_norm))


@dataclass(frozen=True)
class RoundPlan:
    """The coordinator's side of every round: ``rounds`` rounds, each site sampled with
    probability ``sample_rate_sites``, updates quantised to ``quantize_bits`` bits (or
    float32), and the server step (``server_optimizer`` ``None``/``"adam"``/``"yogi"``
    with ``server_lr``; default 1 for FedAvg's step, 0.01 for the adaptive ones)."""

    rounds: int
    sample_rate_sites: float
    quantize_bits: int | None
    server_optimizer: str | None
    server_lr: float

    def __post_init__(self) -> None:
        _positive_int("rounds", self.rounds)
        if not (finite(self.sample_rate_sites) and 0 < self.sample_rate_sites <= 1):
            raise StudyConfigurationError("sample_rate_sites must be in (0, 1]")
        if self.quantize_bits is not None:
            check_bits(self.quantize_bits)
        object.__setattr__(self, "sample_rate_sites", float(self.sample_rate_sites))

    @classmethod
    def of(
        cls,
        rounds: int,
        sample_rate_sites: float,
        quantize_bits: int | None,
        server_optimizer: str | None,
        server_lr: float | None,
    ) -> RoundPlan:
        """The plan with the server learning rate defaulted for the optimiser."""
        default_lr = 1.0 if server_optimizer is None else 0.01
        lr = default_lr if server_lr is None else server_lr
        return cls(rounds, sample_rate_sites, quantize_bits, server_optimizer, float(lr))
