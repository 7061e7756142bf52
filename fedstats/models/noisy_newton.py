"""Noisy Newton steps and their parametric bootstrap, shared by every private likelihood fit.

A private fit (Avella-Medina, Bradshaw & Loh, "Differentially private
inference via noisy optimization", Ann. Statist. 51(5), 2023) releases a
noisy score ``g + xi`` and information ``H + E`` and steps
``beta <- beta + H_+^{-1} (g + xi)``, where ``H_+`` is the symmetrised noisy
information with eigenvalues floored at the noise level (:func:`floored`,
:func:`noise_floor`). :func:`noise_covariance` estimates what that noise adds
to the estimate's error by replaying the run (Ferrando, Wang & Sheldon,
AISTATS 2022). Noise scales may be numbers (every entry carries the same
noise) or arrays (entries summed over different numbers of sites).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fedstats.noise import symmetric_gaussian

Scale = float | np.ndarray
"""A noise scale: one number for every entry, or one per entry (vector or symmetric matrix)."""

FLOOR_FACTOR = 1.0


def noise_floor(entry_sd: Scale, p: int) -> float:
    """Smallest eigenvalue kept in a noisy information: ``FLOOR_FACTOR * sd * sqrt(p)``.

    ``sd * sqrt(p)`` is half the spectral norm of a ``p x p`` symmetric
    Gaussian noise matrix with entry standard deviation ``sd`` (Wigner's
    semicircle law): eigenvalues below it are mostly noise. With a matrix of
    entry standard deviations ``sd_ij`` (entries that carry different noises)
    the scale is the largest row's ``sqrt(sum_j sd_ij^2)``, which is
    ``sd sqrt(p)`` when they are equal (Bandeira & van Handel, Ann. Probab. 2016).
    """
    sd = np.asarray(entry_sd, dtype=np.float64)
    if sd.ndim == 0:
        return FLOOR_FACTOR * float(sd) * math.sqrt(p)
    return FLOOR_FACTOR * float(np.sqrt(np.max(np.sum(sd**2, axis=1))))


def floored(hessian: np.ndarray, floor: float) -> np.ndarray:
    """Symmetrise and floor the eigenvalues at ``floor`` (positive definite by construction);
    a stack of matrices (``... x p x p``) is floored matrix by matrix."""
    symmetric = (hessian + np.swapaxes(hessian, -1, -2)) / 2
    values, vectors = np.linalg.eigh(symmetric)
    largest = np.abs(values).max(axis=-1, keepdims=True)
    values = np.maximum(values, np.maximum(floor, 1e-12 * np.maximum(1.0, largest)))
    return (vectors * values[..., None, :]) @ np.swapaxes(vectors, -1, -2)


def noise_covariance(
    info: np.ndarray,
    beta: np.ndarray,
    start: np.ndarray,
    noise_plan: list[tuple[Scale, Scale | None]],
    rng: np.random.Generator,
    draws: int = 400,
    corrections: int = 8,
    info_sd: Scale | None = None,
    round_infos: list[np.ndarray | None] | None = None,
) -> np.ndarray:
    """Mean squared error the privacy noise adds to the estimate, by parametric bootstrap.

    The noisy Newton run is replayed ``draws`` times on a quadratic model of
    the log-likelihood (score ``H (target - b)``, information ``H``), with
    fresh noise of the released scales, the same start, flooring and reuse
    of the information (Ferrando, Wang & Sheldon, "Parametric bootstrap for
    differentially private confidence intervals", AISTATS 2022).

    ``H`` is known only through the released information ``H~ = H + E``. With
    ``info_sd`` (the entry standard deviation of ``E``) every replay draws its
    own ``H_d = floor(H~ + E_d)``, ``E_d`` a fresh symmetric noise matrix of
    that scale, so the replays carry the uncertainty about ``H`` too: where the
    information is noise-dominated a single plug-in ``H = H~`` makes replays
    far more alike than the real run's possible outcomes, and intervals that
    are far too narrow. Flooring shrinks weakly identified coefficients
    towards the start, so the estimate itself is shrunk: the target whose
    replays average to the estimate is found by iterated bootstrap bias
    correction (``target += beta - mean(replays(target))``, ``corrections``
    times; Efron & Tibshirani 1993, §10.6), and the reported error is the
    replays' mean squared error about that target, bias included. It uses only
    released values, so it costs no privacy.
    """
    target = beta.copy()
    for _ in range(corrections):
        replays = _replay(info, target, start, noise_plan, rng, draws // 4, info_sd, round_infos)
        target = target + beta - replays.mean(0)
    errors = _replay(info, target, start, noise_plan, rng, draws, info_sd, round_infos) - target
    return errors.T @ errors / draws


def _replay(
    info: np.ndarray,
    target: np.ndarray,
    start: np.ndarray,
    noise_plan: list[tuple[Scale, Scale | None]],
    rng: np.random.Generator,
    draws: int,
    info_sd: Scale | None = None,
    round_infos: list[np.ndarray | None] | None = None,
) -> np.ndarray:
    """End points of ``draws`` noisy Newton runs on the quadratic model centred at ``target``
    (each with its own information drawn about ``info`` when ``info_sd`` is given), run
    side by side as stacks of matrices."""
    p = len(target)
    model = np.broadcast_to(info, (draws, p, p))
    if info_sd is not None:
        plausible = info + symmetric_gaussian(rng, info_sd, p, draws)
        model = floored(plausible, noise_floor(info_sd, p) / 10)
    b = np.tile(start, (draws, 1))
    used = model
    released = round_infos or [None] * len(noise_plan)
    last = max((t for t, r in enumerate(released) if r is not None), default=-1)
    for t, (score_var, entry_sd) in enumerate(noise_plan):
        if entry_sd is not None:
            measured = model
            if released[t] is not None and t < last:
                plausible = released[t] + symmetric_gaussian(rng, entry_sd, p, draws)
                measured = floored(plausible, noise_floor(entry_sd, p) / 10)
            noisy = measured + symmetric_gaussian(rng, entry_sd, p, draws)
            used = floored(noisy, noise_floor(entry_sd, p))
        score = np.einsum("dij,dj->di", model, target - b)
        score = score + rng.normal(0.0, 1.0, (draws, p)) * np.sqrt(score_var)
        b = b + np.linalg.solve(used, score[..., None])[..., 0]
    return b


@dataclass
class NoisyPath:
    """A private fit's noisy Newton path: the parameters ``theta`` and where they started,
    the information used for steps (the released one, floored), the last released
    information, its floor and entry noise scale, each round's noise scales (for the
    bootstrap), and the coordinator's bookkeeping of the last replies and secure sums."""

    theta: np.ndarray
    start: np.ndarray
    info: np.ndarray
    released_info: np.ndarray
    released_floor: float = 0.0
    last_info_sd: Scale | None = None
    noise_plan: list[tuple[Scale, Scale | None]] = field(default_factory=list)
    round_infos: list[np.ndarray | None] = field(default_factory=list)
    last_replies: dict = field(default_factory=dict)
    secure_rounds: list[Any] = field(default_factory=list)

    @classmethod
    def starting_at(cls, theta: np.ndarray) -> NoisyPath:
        identity = np.eye(theta.size)
        return cls(theta=theta, start=theta.copy(), info=identity, released_info=identity)

    def step(
        self,
        score: np.ndarray,
        information: np.ndarray | None,
        score_var: Scale,
        entry_sd: Scale | None,
    ) -> None:
        """``theta <- theta + H_+^{-1} g``: a released information (with its entry noise
        scale) replaces the one in use, floored at its noise level; an information-free
        round reuses the last."""
        if information is not None:
            self.released_info = information
            self.released_floor = noise_floor(entry_sd, self.theta.size)
            self.last_info_sd = entry_sd
            self.info = floored(information, self.released_floor)
        self.noise_plan.append((score_var, entry_sd))
        self.round_infos.append(information)
        self.theta = self.theta + np.linalg.solve(self.info, score)

    def covariances(self, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """The sampling covariance ``H^-1`` and the privacy noise's covariance
        (:func:`noise_covariance`) in the fit's coordinates. Information below a tenth of
        its noise level is indistinguishable from noise: the working "true" information
        keeps it at that level rather than at the noise floor."""
        truth = floored(self.released_info, self.released_floor / 10)
        noise = noise_covariance(
            truth,
            self.theta,
            self.start,
            self.noise_plan,
            rng,
            info_sd=self.last_info_sd,
            round_infos=self.round_infos,
        )
        return np.linalg.inv(truth), noise
