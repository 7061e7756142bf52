"""A model's performance per site and pooled, from the sites' sums and counts: a trained
network's (:meth:`fedstats.FederatedTrainer.evaluate`) or a fitted logistic regression's
(:func:`classification_metrics`).

Per site: accuracy (threshold 1/2), AUC (computed at the site by
scikit-learn), Brier score ``mean (p - y)^2`` and log-loss; calibration
intercept and slope — the logistic recalibration ``logit P(y=1) = a + b f``
of the outcome on the model's logit ``f`` (Cox, Biometrika 1958; ideal
``a = 0``, ``b = 1``) — fitted by statsmodels' binomial GLM on the site's
histogram of logits by outcome (bins of width 0.01 on ``[-8, 8]``, merged
at the site until each released bin holds at least ``k`` patients). Pooled:
the same from summed counts; the pooled AUC is the Mann–Whitney statistic
of the summed histograms (pairs in one bin count 1/2), exact up to the
merged bins. Survival: Harrell's C from pair counts within sites, pooled by
summing the counts (pairs across sites are not compared).
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import statsmodels.api as sm

from fedstats.contract.paths import PATH_KEY
from fedstats.contract.tasks.classifier_scores import EVALUATE, LOGIT_EDGES
from fedstats.errors import StudyConfigurationError
from fedstats.models.federation import Federation

POOLED = "pooled"


@dataclass(frozen=True)
class Evaluation:
    """Metrics by site, with a ``pooled`` row; ``kind`` is ``"binary"`` or ``"survival"``."""

    table: pd.DataFrame
    kind: str

    def to_frame(self) -> pd.DataFrame:
        return self.table.copy()

    @property
    def sites(self) -> pd.DataFrame:
        return self.table.drop(index=POOLED)

    @property
    def mean_site_accuracy(self) -> float:
        """Unweighted mean of the sites' accuracies (FLamby's summary of a benchmark)."""
        return float(self.sites["accuracy"].mean())

    @property
    def mean_site_c_index(self) -> float:
        return float(self.sites["c_index"].mean())

    def _repr_html_(self) -> str:
        return self.table.to_html(float_format=lambda v: f"{v:.4f}")


def histogram_auc(events: np.ndarray, non_events: np.ndarray) -> float:
    """``P(f_event > f_non_event) + P(same bin) / 2`` from binned logits."""
    n1, n0 = events.sum(), non_events.sum()
    if n1 == 0 or n0 == 0:
        return math.nan
    below = np.concatenate([[0.0], np.cumsum(non_events)[:-1]])
    return float((events * (below + non_events / 2)).sum() / (n1 * n0))


def binned_calibration(events: np.ndarray, non_events: np.ndarray) -> tuple[float, float]:
    """Calibration intercept and slope fitted on binned logits (NaN when not estimable)."""
    centres = (LOGIT_EDGES[:-1] + LOGIT_EDGES[1:]) / 2
    used = (events + non_events) > 0
    if events.sum() == 0 or non_events.sum() == 0 or used.sum() < 2:
        return math.nan, math.nan
    endog = np.column_stack([events[used], non_events[used]])
    exog = sm.add_constant(centres[used])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            fit = sm.GLM(endog, exog, family=sm.families.Binomial()).fit()
        except Exception:  # noqa: BLE001 - separation: the fit does not exist
            return math.nan, math.nan
    intercept, slope = (float(v) for v in fit.params)
    if not (math.isfinite(intercept) and math.isfinite(slope)):
        return math.nan, math.nan
    return intercept, slope


def binary_row(reply: dict[str, Any], auc: float | None = None) -> dict[str, float]:
    n = float(reply["n"])
    events, non_events = reply["logits_events"], reply["logits_non_events"]
    intercept, slope = binned_calibration(events, non_events)
    return {
        "n": n,
        "n_events": float(reply["n_events"]),
        "accuracy": reply["correct"] / n,
        "auc": reply["auc"] if auc is None else auc,
        "brier": reply["brier_sum"] / n,
        "log_loss": reply["log_loss_sum"] / n,
        "calibration_intercept": intercept,
        "calibration_slope": slope,
    }


def combine_binary(replies: dict[str, dict[str, Any]]) -> pd.DataFrame:
    rows = {site: binary_row(reply) for site, reply in replies.items()}
    total = {
        key: sum(np.asarray(r[key], dtype=np.float64) for r in replies.values())
        for key in ("n", "n_events", "correct", "brier_sum", "log_loss_sum")
    }
    events = sum(r["logits_events"] for r in replies.values())
    non_events = sum(r["logits_non_events"] for r in replies.values())
    pooled = {**total, "auc": math.nan, "logits_events": events, "logits_non_events": non_events}
    rows[POOLED] = binary_row(pooled, auc=histogram_auc(events, non_events))
    return pd.DataFrame.from_dict(rows, orient="index")


def combine_survival(replies: dict[str, dict[str, Any]]) -> pd.DataFrame:
    def row(r: dict[str, Any]) -> dict[str, float]:
        comparable = float(r["comparable"])
        c = (r["concordant"] + r["tied"] / 2) / comparable if comparable else math.nan
        return {"n": float(r["n"]), "n_events": float(r["n_events"]), "c_index": c}

    rows = {site: row(reply) for site, reply in replies.items()}
    keys = ("n", "n_events", "concordant", "tied", "comparable")
    rows[POOLED] = row({k: sum(float(r[k]) for r in replies.values()) for k in keys})
    return pd.DataFrame.from_dict(rows, orient="index")


def classification_metrics(result: Any, federation: Federation) -> Evaluation:
    """Accuracy, AUC, Brier score, log-loss and calibration of a fitted logistic regression at
    the sites of ``federation``, per site and pooled (as :class:`Evaluation` reads them).

    Each site scores its own patients with the fit's linear predictor ``x' beta`` and
    replies sums and counts (``logistic.evaluate``); pass a federation of held-out frames
    (same columns) to validate out of sample. Sites that verify paths answer only at the
    point the fit's last round leads to, which the request relays with every site's signed
    reply there (held-out sites check it when they pin the fit's sites' keys:
    ``Federation.in_process(test_frames, keys_of=training_federation)``); a derived result
    (e.g. recalibrated) was fitted by no path and is refused by them.
    """
    design = getattr(result, "design", None)
    if design is None:
        raise StudyConfigurationError(
            "this result carries no design to evaluate: pass the results of "
            "LogisticRegression.fit (a recalibrated or combined result was fitted by no path)"
        )
    args: dict[str, Any] = {"design": design, "beta": result.params.to_numpy()}
    evidence = getattr(result, "path_evidence", None)
    if evidence is not None:
        args[PATH_KEY] = evidence  # sites check the fit's last round leads to beta
    replies = federation.request(
        EVALUATE.name, args, analysis=federation.new_analysis("logistic-evaluate")
    )
    return Evaluation(combine_binary(replies), "binary")
