"""The coordinator's step from the combined update ``Delta`` (a pseudo-gradient ``-Delta``).

* ``None`` (FedAvg): ``x <- x + eta_s Delta`` with ``eta_s = server_lr`` (1 by default).
* ``"adam"`` (FedAdam) and ``"yogi"`` (FedYogi), Reddi et al., "Adaptive
  federated optimization", ICLR 2021, Algorithm 2:
  ``m <- b1 m + (1 - b1) Delta``;
  Adam: ``v <- b2 v + (1 - b2) Delta^2``;
  Yogi: ``v <- v - (1 - b2) Delta^2 sign(v - Delta^2)``;
  ``x <- x + eta_s m / (sqrt(v) + tau)``, with ``v`` started at ``tau^2``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from fedstats.errors import StudyConfigurationError

SERVER_OPTIMIZERS = (None, "adam", "yogi")


@dataclass
class ServerOptimizer:
    """The server's optimiser state over rounds."""

    kind: str | None = None
    lr: float = 1.0
    beta1: float = 0.9
    beta2: float = 0.99
    tau: float = 1e-3
    _m: np.ndarray | None = field(default=None, repr=False)
    _v: np.ndarray | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.kind not in SERVER_OPTIMIZERS:
            raise StudyConfigurationError(
                f"server_optimizer must be one of {SERVER_OPTIMIZERS}, got {self.kind!r}"
            )
        if not (np.isfinite(self.lr) and self.lr > 0):
            raise StudyConfigurationError(f"server_lr must be positive, got {self.lr!r}")

    def step(self, weights: np.ndarray, update: np.ndarray) -> np.ndarray:
        """The next global weights from the current ones and the combined update."""
        delta = np.asarray(update, dtype=np.float64)
        if self.kind is None:
            return (weights + self.lr * delta).astype(np.float32)
        if self._m is None:
            self._m = np.zeros_like(delta)
            self._v = np.full_like(delta, self.tau**2)
        self._m = self.beta1 * self._m + (1 - self.beta1) * delta
        squared = delta**2
        if self.kind == "adam":
            self._v = self.beta2 * self._v + (1 - self.beta2) * squared
        else:
            self._v = self._v - (1 - self.beta2) * squared * np.sign(self._v - squared)
        step = self.lr * self._m / (np.sqrt(self._v) + self.tau)
        return (weights + step).astype(np.float32)
