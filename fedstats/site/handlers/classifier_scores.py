"""Site side of a binary classifier's scores: ``logistic.evaluate``, and the sums both it and
``deep.evaluate`` reply (:mod:`fedstats.contract.tasks.classifier_scores`).

For logits ``f_i`` and outcomes ``y_i`` of the site's patients, with ``p_i = expit(f_i)``:
patients, events, correct classifications ``sum 1[(f_i > 0) = (y_i = 1)]``, the Brier
sum ``sum (p_i - y_i)^2`` (Brier, Mon. Weather Rev. 1950), the log-loss sum
``sum log(1 + e^f_i) - y_i f_i``, the site's AUC (scikit-learn; NaN with one class) and
the histograms of the events' and non-events' logits, merged so that every released bin
holds at least ``k`` patients (for the pooled AUC and the calibration fit, Cox,
Biometrika 1958).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from scipy.special import expit

from fedstats.contract.tasks.classifier_scores import EVALUATE, LOGIT_EDGES
from fedstats.contract.tasks.design import checked_beta, spec_from_args
from fedstats.errors import MalformedRequestError
from fedstats.site.handlers.design import build_design
from fedstats.site.handlers.survival import deferred_points
from fedstats.site.patient_rows import patients_of
from fedstats.site.task import SiteContext, TaskReply


def binary_scores(scores: np.ndarray, y: np.ndarray, k: int) -> dict[str, Any]:
    """The reply's sums and ``k``-protected histograms for logits ``scores`` and 0/1 ``y``."""
    from sklearn.metrics import roc_auc_score  # with SciPy's stats: loaded on first use

    p = expit(scores)
    log_loss = np.logaddexp(0.0, scores) - y * scores
    both = 0 < y.sum() < len(y)
    clipped = np.clip(scores, LOGIT_EDGES[0], LOGIT_EDGES[-1])
    events, non_events = k_protected_histograms(
        np.histogram(clipped[y == 1], LOGIT_EDGES)[0].astype(np.float64),
        np.histogram(clipped[y == 0], LOGIT_EDGES)[0].astype(np.float64),
        k,
    )
    return {
        "n": len(y),
        "n_events": int(y.sum()),
        "correct": int(((scores > 0) == (y == 1)).sum()),
        "brier_sum": float(np.sum((p - y) ** 2)),
        "log_loss_sum": float(np.sum(log_loss)),
        "auc": float(roc_auc_score(y, scores)) if both else math.nan,
        "logits_events": events,
        "logits_non_events": non_events,
    }


def k_protected_histograms(
    events: np.ndarray, non_events: np.ndarray, k: int
) -> tuple[np.ndarray, np.ndarray]:
    """The two logit histograms with every released bin holding at least ``k`` patients.

    Bins are merged from the left as in the survival curves' deferred
    events (:func:`fedstats.site.handlers.survival.deferred_points`): patients
    accumulate until at least ``k`` are pending, then all are released at
    the current bin; the last fewer than ``k`` join the last released bin.
    Events and non-events of one merged bin stay together, so the pooled AUC
    counts their pairs as ties, and no bin tells of fewer than ``k``
    patients' logits and outcomes.
    """
    release = deferred_points(events + non_events, k)
    released = release[release >= 0]
    release[release < 0] = released.max() if released.size else len(release) - 1
    return (
        np.bincount(release, weights=events, minlength=len(events)),
        np.bincount(release, weights=non_events, minlength=len(non_events)),
    )


def evaluate(ctx: SiteContext, args: dict[str, Any]) -> TaskReply:
    """A fitted logistic regression's scores on this site's patients: ``f = X beta (+ offset)``.

    Counts and sums whatever the design's size, so the saturation rule of ``prepare``
    (parameters per patient) does not apply: held-out sets may be small. A frame with several
    rows per patient is refused (the reply's ``k`` rules count rows)."""
    spec = spec_from_args(args)
    beta = checked_beta(ctx.name, args, spec.n_params)
    if patients_of(ctx.frame) is not None:  # the k rules below count rows, not patients
        raise MalformedRequestError(
            site=ctx.name,
            task=EVALUATE.name,
            reason="a classifier's scores count rows, and this site's frame holds several rows "
            "per patient (its index names each row's patient): score a frame of one row per "
            "patient",
        )
    design = build_design(ctx, spec, saturation=False)
    scores = design.X @ beta
    if design.offset is not None:
        scores = scores + design.offset
    if not np.isfinite(scores).all():
        raise MalformedRequestError(
            site=ctx.name, task=None, reason="the model's linear predictor is not finite"
        )
    y = np.asarray(design.y, dtype=np.float64)
    return TaskReply(binary_scores(scores, y, ctx.policy.min_count), contributors=len(y))
