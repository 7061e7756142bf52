"""Each iterative exact task's path rule: where its fits start and how they step.

One table both sides read: the coordinator's fits step with these rules
(:mod:`fedstats.models`), and a site that verifies paths re-derives every
requested point with the same rule before it reads a row
(:mod:`fedstats.site.verified_paths`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from fedstats.contract.fine_gray import CENSORING_INPUTS, relayed_fields, relayed_inputs
from fedstats.contract.paths import DampedNewtonPath, FedAvgPath, NewtonPath

FAIR_PATH = DampedNewtonPath(
    evaluation="tpr-parity", max_trials=30, armijo=1e-4, warm_start="gamma"
)
"""A TPR-parity penalised logistic fit (:mod:`fedstats.contract.fairness`): Newton steps on the
penalised objective with Armijo backtracking (at most 30 trials), each fit along the penalty
free to start where the previous one ended."""

FINE_GRAY_PATH = DampedNewtonPath(evaluation="fine-gray", prelude="censoring")
"""A Fine–Gray fit: counts at the start with every censoring weight 1, the start again with the
censoring curve they give, then damped Newton steps on the weighted partial likelihood."""

PATH_RULES: dict[str, NewtonPath] = {
    "logistic.summaries": NewtonPath(),
    "vertical.summaries": NewtonPath(),  # the same sums, from each hospital's kept X^T y
    "glm.summaries": DampedNewtonPath(restart="rates"),
    "cox.summaries": DampedNewtonPath(),
    "cox.grid_summaries": DampedNewtonPath(evaluation="cox-grid"),
    "fairness.summaries": FAIR_PATH,
    "fine_gray.grid_summaries": FINE_GRAY_PATH,
    "deep.train": FedAvgPath(),
}
"""The tasks a site that verifies paths answers only on a verified path, and each one's rule."""


@dataclass(frozen=True)
class RelayedEvaluation:
    """An evaluation of a fit whose request carries arrays derived from the summed replies at
    the fit's last point (some of ``derived``, computed by ``derive`` from the summed
    ``fields`` of the fit's arguments, and from those arguments): a site that verifies paths
    checks them against the relayed, signed replies of task ``of``, and refuses any other of
    ``derived`` the request carries."""

    of: str
    derived: tuple[str, ...]
    fields: Callable[[Mapping[str, Any]], tuple[str, ...]]
    derive: Callable[[Mapping[str, Any], Mapping[str, Any]], dict[str, np.ndarray]]


TRAINED_EVALUATIONS: dict[str, str] = {"deep.evaluate": "deep.train"}
"""Evaluations of a trained network, answered at a site that verifies paths only at the network
the training path's last round leads to: the request relays that round's signed replies and the
training request they answer (``training``), and the site re-derives the step
(:class:`fedstats.contract.paths.FedAvgPath`)."""

STEPPED_EVALUATIONS: dict[str, str] = {"logistic.evaluate": "logistic.summaries"}
"""Evaluations of a fitted model at the point its last answered round leads to (a logistic fit
ends one Newton step past it; one that stopped on a singular information, at it): the request
relays that round's signed replies and the fit's task and arguments (``fit``), and the site
re-derives the step with the fit's rule."""

TRAINED_INPUTS = ("design", "scaling", "model", "hyper")
"""The arguments an evaluation of a trained network must share with its training: the network
is scored on the inputs it was trained on. Scaling of the coordinator's choosing (half-widths
near zero make each input the indicator of a moving threshold) would let differenced scores
place single patients' values."""

TRAINING_KEY = "training"
"""The argument of an evaluation's ``path`` carrying the training request's arguments but its
point (what the relayed replies were signed over)."""

RELAYED_EVALUATIONS: dict[str, RelayedEvaluation] = {
    "fine_gray.robust": RelayedEvaluation(
        of="fine_gray.grid_summaries",
        derived=("hazard", "means", *CENSORING_INPUTS),
        fields=relayed_fields,
        derive=relayed_inputs,
    ),
}
"""Evaluations answered, at a site that verifies paths, only with the fit's last point relayed."""
