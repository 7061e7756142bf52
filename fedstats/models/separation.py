"""Separation in a binary-outcome fit, from the sites' summed extreme-probability flags.

Every site reports whether every / any of its fitted probabilities lies
within ``1e-10`` of 0 or 1 (:mod:`fedstats.site.handlers.logistic`,
:mod:`fedstats.site.handlers.glm`). Summed over sites they show

* **perfect separation**: every site's patients all fitted exactly — the
  maximum likelihood estimate does not exist (Albert & Anderson,
  Biometrika 1984);
* **quasi-complete separation**: some patients fitted exactly while the
  log-likelihood stops improving over two rounds and coefficients keep
  growing: those coefficients are not identified.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import numpy as np

from fedstats.errors import PerfectSeparationError, SeparationWarning


def check_perfect_separation(all_extreme: float, n_sites: int) -> None:
    """Raise :class:`~fedstats.errors.PerfectSeparationError` when every site is all extreme."""
    if round(all_extreme) == n_sites:
        raise PerfectSeparationError(
            "perfect separation: the covariates predict every patient's outcome exactly, "
            "so the maximum likelihood estimate does not exist; remove or combine the "
            "separating covariates or use a penalised model"
        )


class QuasiSeparation:
    """Counts rounds whose log-likelihood did not improve while some patient was fitted
    exactly; two in a row mean quasi-complete separation."""

    def __init__(self) -> None:
        self.previous_llf = -np.inf
        self.flat_rounds = 0

    def separated(self, llf: float, any_extreme: float) -> bool:
        flat = round(any_extreme) > 0 and abs(llf - self.previous_llf) < 1e-9
        self.flat_rounds = self.flat_rounds + 1 if flat else 0
        self.previous_llf = llf
        return self.flat_rounds >= 2

    @staticmethod
    def warn(step: np.ndarray, names: Sequence[str], stacklevel: int = 3) -> str:
        """Warn with :class:`~fedstats.errors.SeparationWarning` naming the growing
        coefficients; returns the message for the fit's notes."""
        diverging = [names[j] for j in np.argsort(-np.abs(step))[:3]]
        message = (
            "quasi-complete separation: the log-likelihood no longer improves while "
            f"coefficients {diverging} keep growing; they are not identified. "
            "Combine sparse categories or use a penalised model."
        )
        warnings.warn(message, SeparationWarning, stacklevel=stacklevel)
        return message
