"""One Byzantine site among five: robust aggregators keep the trained model, the mean does not.

The attacker is a site whose ``deep.train`` handler multiplies its honest update by 1e6
before the site checks, signs and sends it: exactly what a malicious site with its own key
would send. The reply checks (one schema per task: field names and shapes) accept it — a
scaled update has the declared shape and is finite — so the aggregator alone decides what it
does to the model. Every site verifies paths: each round names its combination rule, and
every site re-derives the next network with it from all five signed updates (the
attacker's included), so verification takes nothing from a robust rule and adds nothing to
the mean's collapse. The pooled AUC
of each final model is computed independently with ``sklearn.metrics.roc_auc_score`` on the
pooled test rows.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import pytest
import torch
from deep_helpers import BOUNDS
from sklearn.metrics import roc_auc_score

import fedstats
from fedstats.deep import FederatedTrainer
from fedstats.deep.shared.wire import TRAIN_TASK
from fedstats.models.aggregation import CoordinateMedian, Mean, TrimmedMean
from fedstats.secagg.roster import in_process_pins
from fedstats.site.registry import REGISTRY
from fedstats.site.silo import Silo
from fedstats.site.task import TaskRegistry

SITES = ("a", "b", "c", "d", "e")
ATTACKER = "e"
SCALE = 1e6


def informative_frame(n: int, seed: int) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    x1, x2 = rng.normal(size=n), rng.normal(size=n)
    p = 1 / (1 + np.exp(-(0.2 + 1.8 * x1 - 1.4 * x2)))
    return pd.DataFrame({"x1": x1, "x2": x2, "y": (rng.random(n) < p).astype(int)})


TRAIN = {s: informative_frame(160, 10 + i) for i, s in enumerate(SITES)}
TEST = pd.concat([informative_frame(300, 40 + i) for i in range(len(SITES))], ignore_index=True)


def scaled(handler):
    """A ``deep.train`` handler whose update is multiplied by ``SCALE`` before the site checks,
    signs and sends it: a malicious site with its own key (its signature covers what it sent)."""

    def handle(context, args):
        reply = handler(context, args)
        update = reply.payload["update"]
        return dataclasses.replace(
            reply, payload={**reply.payload, "update": (update * SCALE).astype(update.dtype)}
        )

    return handle


def federation(attacked: bool) -> fedstats.Federation:
    """Five sites that verify paths (each re-derives every round's network with the rule the
    request names); with ``attacked``, site ``e`` sends and signs a scaled update."""
    pins = in_process_pins(list(SITES))
    silos = {}
    for site in SITES:
        registry = REGISTRY
        if attacked and site == ATTACKER:
            registry = TaskRegistry()
            for task in REGISTRY.available():
                if task.name == TRAIN_TASK:
                    task = dataclasses.replace(task, handler=scaled(task.handler))
                registry.add(task)
        silos[site] = Silo(site, TRAIN[site], registry=registry, secure_aggregation=pins[site],
                           verified_paths=True)  # fmt: skip
    fed = fedstats.Federation({s: silo.handle for s, silo in silos.items()})
    fed.silos = silos
    return fed


def train(aggregator, attacked: bool):
    trainer = FederatedTrainer(
        "mlp", {"hidden": [8]}, formula="y ~ x1 + x2", bounds=BOUNDS, rounds=6, local_steps=8,
        lr=0.3, batch_size=32, seed=5, progress=False, aggregator=aggregator,
    )  # fmt: skip
    return trainer.fit(federation(attacked), evaluation=False)


def pooled_auc(result) -> float:
    """Oracle: scikit-learn's AUC of the final network on the pooled test rows (inputs scaled by
    the public bounds ``(-4, 4)`` to ``[-1, 1]``)."""
    X = torch.tensor(np.clip(TEST[["x1", "x2"]].to_numpy() / 4.0, -1, 1), dtype=torch.float32)
    with torch.no_grad():
        logits = result.module()(X).reshape(-1).double().numpy()
    if not np.isfinite(logits).all():
        return float("nan")
    return float(roc_auc_score(TEST["y"], logits))


@pytest.fixture(scope="module")
def clean():
    result = train(Mean(), attacked=False)
    return result, pooled_auc(result)


def test_the_clean_federation_learns_an_informative_model(clean):
    _, auc = clean
    assert auc > 0.78, f"clean pooled AUC {auc:.4f}"


@pytest.mark.parametrize(
    "aggregator", [CoordinateMedian(), TrimmedMean(beta=0.2)], ids=["median", "trimmed-mean"]
)
def test_robust_aggregators_keep_the_clean_auc_under_one_scaled_site(clean, aggregator):
    _, clean_auc = clean
    result = train(aggregator, attacked=True)
    auc = pooled_auc(result)
    print(f"{type(aggregator).__name__}: attacked AUC {auc:.4f}, clean {clean_auc:.4f}")
    assert abs(auc - clean_auc) <= 0.01
    assert max(float(np.abs(w).max()) for w in result.weights) < 100


def test_the_weighted_mean_collapses_under_one_scaled_site(clean):
    """Breakdown point 0: the attacker's 1e6-times update dominates the mean."""
    clean_result, clean_auc = clean
    result = train(Mean(), attacked=True)
    largest = max(float(np.abs(w).max()) for w in result.weights)
    clean_largest = max(float(np.abs(w).max()) for w in clean_result.weights)
    auc = pooled_auc(result)
    print(f"Mean: attacked AUC {auc:.4f} (clean {clean_auc:.4f}); largest |weight| {largest:.3g}")
    assert largest > 1e3 * clean_largest or not np.isfinite(largest)
    assert np.isnan(auc) or abs(auc - 0.5) < 0.05  # NaN: the outputs are not even finite
