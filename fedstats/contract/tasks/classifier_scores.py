"""The wire of a binary classifier's scores at a site: ``logistic.evaluate`` and ``deep.evaluate``.

A site scores its own patients with a model's logit ``f`` and replies sums and counts
the coordinator adds over sites (:mod:`fedstats.models.classifier_scores`): patients,
events, correct classifications at probability 1/2, the Brier sum ``sum (p_i - y_i)^2``,
the log-loss sum, the site's AUC and the histograms of the logits of events and
non-events on :data:`LOGIT_EDGES`, merged at the site until every released bin holds
at least ``k`` patients (:func:`fedstats.site.handlers.classifier_scores.binary_scores`).
``logistic.evaluate`` scores a fitted logistic regression's linear predictor
``f = x' beta (+ offset)``; a site that verifies paths answers it only at the point the
fit's relayed, signed last round leads to (:mod:`fedstats.site.verified_paths`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fedstats.contract.task_spec import TaskSpec
from fedstats.contract.tasks.design import spec_from_args
from fedstats.errors import MalformedRequestError
from fedstats.schema import Array, Number

LOGIT_EDGES = np.linspace(-8.0, 8.0, 1601)
"""Bins of the predicted logits in an evaluation reply (values beyond are put in the end bins)."""

SCORE_COUNTS = ("n", "n_events", "correct", "brier_sum", "log_loss_sum", "auc")


def binary_scores_schema() -> dict:
    """The reply of a binary classifier's scores at one site."""
    bins = len(LOGIT_EDGES) - 1
    return {
        **{k: Number() for k in SCORE_COUNTS},
        "logits_events": Array((bins,)),
        "logits_non_events": Array((bins,)),
    }


def evaluate_schema(args: dict[str, Any]) -> dict:
    spec = spec_from_args(args)  # a design the site can build, checked before any row
    if spec.outcome_kind != "binary":
        raise MalformedRequestError(site=None, task=None, reason="the design is not a binary one")
    return binary_scores_schema()


EVALUATE = TaskSpec(
    name="logistic.evaluate",
    schema=evaluate_schema,
    description="a fitted logistic model's accuracy, Brier score, log-loss, AUC and calibration "
    "histograms at its coefficients",
)
