"""Exact Newton rounds of a logistic likelihood over the sites' summed score and information.

One loop for every exact logistic fit whose sites answer ``gradient``, ``hessian``,
``loglik``, ``all_extreme`` and ``any_extreme`` sums at the coefficients the coordinator
relays on the verified path: the horizontal fit (``logistic.summaries``,
:class:`fedstats.LogisticRegression`) and the vertical one (``vertical.summaries``,
:class:`fedstats.VerticalLogisticRegression`). Each round is the Newton step
``beta + I(beta)^-1 U(beta)`` (:func:`fedstats.contract.newton.newton_step`), stopped when
the Newton decrement converges (:func:`~fedstats.contract.newton.decrement_converged`); the
final log-likelihood is corrected to the last step to second order. Complete and quasi
separation are detected from the summed flags (Albert and Anderson 1984).
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fedstats.contract.newton import decrement_converged, newton_decrement, newton_step
from fedstats.errors import ConvergenceWarning
from fedstats.models.federation import Federation
from fedstats.models.path_relay import PathRelay
from fedstats.models.secure_aggregation import SecureAggregation, summed_replies
from fedstats.models.separation import QuasiSeparation, check_perfect_separation


@dataclass
class NewtonRounds:
    """Where the rounds ended: coefficients, the last information matrix and log-likelihood,
    whether they converged, how many rounds ran, notes, and the path relayed."""

    beta: np.ndarray
    hessian: np.ndarray
    llf: float
    converged: bool
    rounds: int
    path: PathRelay
    notes: list[str] = field(default_factory=list)


def exact_newton_rounds(
    federation: Federation,
    task: str,
    request: Mapping[str, Any],
    names: list[str],
    *,
    analysis: str,
    maxiter: int,
    tol: float,
    secure: SecureAggregation | None = None,
) -> NewtonRounds:
    """Run Newton rounds of ``task`` from zero; ``request`` is each round's request without
    ``beta``. A fit that does not converge in ``maxiter`` rounds warns
    (:class:`~fedstats.errors.ConvergenceWarning`) and says so in its notes."""
    beta = np.zeros(len(names))
    converged, notes, previous, rounds = False, [], np.inf, 0
    separation = QuasiSeparation()
    path = PathRelay(federation)
    for rounds in range(1, maxiter + 1):
        sums = summed_replies(
            federation,
            task,
            path.arguments({**request, "beta": beta}, beta, base=beta),
            analysis=analysis,
            secure=secure,
        )
        path.answered(beta, base=beta)
        gradient, hessian, llf = sums["gradient"], sums["hessian"], float(sums["loglik"])
        # summed 0/1 flags: every site all extreme, or any site with an extreme patient
        check_perfect_separation(sums["all_extreme"], len(federation.sites))
        step = newton_step(hessian, gradient, names, first=rounds == 1)
        if step is None:
            notes.append("the information matrix became singular; the fit stopped early")
            break
        decrement = newton_decrement(gradient, step)
        if decrement_converged(decrement, previous, tol):
            converged = True
            llf += 0.5 * float(gradient @ step)
            beta = beta + step
            break
        previous = decrement
        beta = beta + step
        if separation.separated(llf, sums["any_extreme"]):
            notes.append(QuasiSeparation.warn(step, names))
            break
    if not converged and not notes:
        message = f"Newton's method did not converge in {maxiter} rounds"
        warnings.warn(message, ConvergenceWarning, stacklevel=3)
        notes.append(message)
    return NewtonRounds(beta, hessian, llf, converged, rounds, path, notes)
