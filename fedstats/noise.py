"""Gaussian noise drawn by a site (record-level releases) and by the coordinator (client-level)."""

from __future__ import annotations

import numpy as np


def symmetric_gaussian(
    rng: np.random.Generator, scale: float | np.ndarray, size: int, draws: int | None = None
) -> np.ndarray:
    """A symmetric ``size x size`` matrix of ``N(0, scale^2)`` entries: the upper triangle
    (diagonal included) drawn, then mirrored, so each distinct entry has standard deviation
    ``scale`` (the Gaussian mechanism on the upper triangle; Dwork & Roth 2014, App. A).
    ``scale`` may be a symmetric matrix of per-entry scales; ``draws`` stacks that many
    independent matrices (``draws x size x size``)."""
    shape = (size, size) if draws is None else (draws, size, size)
    upper = np.triu(rng.normal(0.0, 1.0, shape) * scale)
    return upper + np.swapaxes(np.triu(upper, 1), -1, -2)
