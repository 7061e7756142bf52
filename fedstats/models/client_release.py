"""The coordinator's client-level release: clip each site's contribution, charge, then noise.

Client-level privacy (unit: one site) protects a whole hospital's
contribution. Every client-level release at the coordinator — the noisy
score and information of a private logistic fit
(:class:`~fedstats.models.privacy.ClientDP`), the noisy mean update of
DP-FedAvg (:class:`~fedstats.models.client_dp.DPFedAvg`) — is made here, in
one order:

1. **clip**: each site's contribution ``c_k`` is scaled to L2 norm at most
   ``C``, ``c_k min(1, C / ||c_k||)``, so one site moves the sum ``S`` by at
   most ``C`` (McMahan, Ramage, Talwar & Zhang, ICLR 2018);
2. **preview** (once per fit, by the caller, with
   :func:`fedstats.models.privacy.preview_coordinator_budget`): the whole
   planned sequence is refused before anything is sent if the coordinator's
   budget cannot pay for it;
3. **charge**: the release's ``DpEvent`` is written to the coordinator's
   ledger (:class:`accounting.Ledger`) before any noisy value exists;
4. **noise**: ``S + N(0, (z C)^2)`` entry by entry; for a symmetric matrix
   the upper triangle is drawn and mirrored
   (:func:`fedstats.noise.symmetric_gaussian`), so the
   release stays symmetric with the same per-entry scale.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import dp_accounting
import numpy as np

from fedstats.models.privacy import coordinator_ledger, coordinator_scope
from fedstats.noise import symmetric_gaussian


def clip_norm(value: np.ndarray, bound: float, norm: float | None = None) -> np.ndarray:
    """``value min(1, bound / ||value||_2)``: the value, or scaled to L2 norm ``bound``
    (``norm``, when given, is ``||value||_2`` already computed)."""
    norm = float(np.linalg.norm(value)) if norm is None else norm
    return value if norm <= bound else value * (bound / norm)


def l2_norms(contributions: Sequence[np.ndarray]) -> np.ndarray:
    """``||c_k||_2`` of every contribution."""
    return np.array([float(np.linalg.norm(c)) for c in contributions])


def clipped_sum(
    contributions: Sequence[np.ndarray], bound: float, norms: np.ndarray | None = None
) -> np.ndarray:
    """``sum_k clip(c_k, bound)``: the sum one site can move by at most ``bound``
    (``norms``, when given, are :func:`l2_norms` of the contributions)."""
    vectors = [np.asarray(c, dtype=np.float64) for c in contributions]
    norms = l2_norms(vectors) if norms is None else norms
    return sum(clip_norm(v, bound, float(n)) for v, n in zip(vectors, norms, strict=True))


@dataclass(frozen=True)
class GaussianSum:
    """A sum to release with Gaussian noise of standard deviation ``scale`` on every entry."""

    total: np.ndarray
    scale: float
    symmetric: bool = False

    def noised(self, rng: np.random.Generator) -> np.ndarray:
        total = np.asarray(self.total, dtype=np.float64)
        if self.symmetric:
            return total + symmetric_gaussian(rng, self.scale, total.shape[0])
        return total + rng.normal(0.0, self.scale, total.shape)


def release(
    federation: Any,
    sums: Sequence[GaussianSum],
    event: dp_accounting.DpEvent,
    rng: np.random.Generator,
    *,
    note: str,
    analysis: str,
    task: str,
    parameters: dict[str, Any],
) -> list[np.ndarray]:
    """Charge ``event`` to the coordinator's ledger, then return each sum with its noise.

    The charge raises :class:`~fedstats.errors.BudgetExceededError` when the
    budget cannot pay; then no noisy value is drawn, so nothing is released.
    """
    coordinator_ledger(federation).charge(
        coordinator_scope(federation.study),
        event,
        note=note,
        analysis=analysis,
        task=task,
        parameters=parameters,
    )
    return [part.noised(rng) for part in sums]
