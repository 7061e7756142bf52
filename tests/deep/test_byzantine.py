"""One Byzantine site among five: robust aggregators keep the trained model, the mean does not.

The attacker is simulated at the transport: its silo trains honestly and its encoded
``deep.train`` reply is decoded, the update multiplied by 1e6 and re-encoded, so the
coordinator receives exactly the bytes a malicious site would send. The reply checks (one
schema per task: field names and shapes) accept it — a scaled update has the declared shape
and is finite — so the aggregator alone decides what it does to the model. The pooled AUC
of each final model is computed independently with ``sklearn.metrics.roc_auc_score`` on the
pooled test rows.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
from deep_helpers import BOUNDS
from sklearn.metrics import roc_auc_score

import fedstats
from fedstats.contract import codec
from fedstats.deep import FederatedTrainer
from fedstats.deep.shared.wire import TRAIN_TASK
from fedstats.models.aggregation import CoordinateMedian, Mean, TrimmedMean

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


def byzantine(handle):
    """The site's transport, with every ``deep.train`` update multiplied by ``SCALE``."""

    def transport(request: bytes) -> bytes:
        reply_bytes = handle(request)
        if codec.decode(request)["task"] != TRAIN_TASK:
            return reply_bytes
        reply = codec.decode(reply_bytes)
        if reply["status"] == "ok":
            update = reply["result"]["update"]
            reply["result"]["update"] = (update * SCALE).astype(update.dtype)
        return codec.encode(reply)

    return transport


def federation(attacked: bool) -> fedstats.Federation:
    # robust aggregators are the coordinator's own rule: sites that verify paths accept only
    # FedAvg's weighted mean (fedstats.contract.paths.FedAvgPath), so these sites do not
    honest = fedstats.Federation.in_process(TRAIN, verified_paths=False)
    if not attacked:
        return honest
    return fedstats.Federation(
        {s: byzantine(silo.handle) if s == ATTACKER else silo.handle
         for s, silo in honest.silos.items()}
    )  # fmt: skip


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
