"""Quantised site updates: the trained model matches float training, the bytes match the
packing formula, and quantisation does not combine with secure aggregation."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch
from deep_helpers import BOUNDS
from sklearn.metrics import roc_auc_score

import fedstats
from fedstats.contract import codec
from fedstats.deep import FederatedTrainer, build_model
from fedstats.deep.shared.wire import TRAIN_TASK
from fedstats.deep.training.rounds import train_arguments
from fedstats.errors import StudyConfigurationError
from fedstats.models.agree import agree_design

SITES = ("a", "b", "c")


def informative_frame(n: int, seed: int) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    x1, x2 = rng.normal(size=n), rng.normal(size=n)
    p = 1 / (1 + np.exp(-(0.3 + 1.5 * x1 - 1.0 * x2 + 0.5 * x1 * x2)))
    return pd.DataFrame({"x1": x1, "x2": x2, "y": (rng.random(n) < p).astype(int)})


TRAIN = {s: informative_frame(150, 60 + i) for i, s in enumerate(SITES)}
TEST = pd.concat([informative_frame(300, 70 + i) for i in range(len(SITES))], ignore_index=True)
HIDDEN = {"hidden": [8]}
# parameters of the network, counted by torch itself: 2 inputs -> 8 hidden -> 1 output
N_PARAMS = sum(p.numel() for p in build_model("mlp", 2, HIDDEN).parameters())


def trainer(**options) -> FederatedTrainer:
    settings = dict(formula="y ~ x1 + x2", bounds=BOUNDS, rounds=6, local_steps=8, lr=0.3,
                    batch_size=32, seed=11, progress=False)  # fmt: skip
    settings.update(options)
    return FederatedTrainer("mlp", HIDDEN, **settings)


def pooled_auc(result) -> float:
    """Oracle: scikit-learn's AUC of the final network on the pooled test rows."""
    X = torch.tensor(np.clip(TEST[["x1", "x2"]].to_numpy() / 4.0, -1, 1), dtype=torch.float32)
    with torch.no_grad():
        logits = result.module()(X).reshape(-1).numpy()
    return float(roc_auc_score(TEST["y"], logits))


@pytest.fixture(scope="module")
def float_run():
    return trainer().fit(fedstats.Federation.in_process(TRAIN), evaluation=False)


def test_eight_bit_updates_train_a_model_as_good_as_float_updates(float_run):
    quantized = trainer(quantize_bits=8).fit(
        fedstats.Federation.in_process(TRAIN), evaluation=False
    )
    float_auc, quantized_auc = pooled_auc(float_run), pooled_auc(quantized)
    print(f"pooled AUC: float {float_auc:.4f}, 8-bit {quantized_auc:.4f}")
    assert float_auc > 0.75
    assert abs(quantized_auc - float_auc) <= 0.02
    moved = [np.abs(q - f).max() for q, f in zip(quantized.weights, float_run.weights,
                                                   strict=True)]  # fmt: skip
    assert max(moved) > 0  # the updates were rounded, not sent as floats


@pytest.mark.parametrize("bits", [8, 3])
def test_update_bytes_follow_the_packing_formula(float_run, bits):
    """Per site and round ``ceil(d b / 8)`` bytes of codes plus the 8-byte scale, against
    ``4 d`` bytes of float32 (``8 d`` of float64)."""
    fed = fedstats.Federation.in_process(TRAIN)
    result = trainer(quantize_bits=bits, rounds=2).fit(fed, evaluation=False)
    per_site = math.ceil(N_PARAMS * bits / 8) + 8
    assert (result.history["update_bytes"] == len(SITES) * per_site).all()
    assert (result.history["update_bytes_unquantized"] == len(SITES) * 4 * N_PARAMS).all()
    assert (float_run.history["update_bytes"] == len(SITES) * 4 * N_PARAMS).all()
    if bits == 8:
        assert per_site == N_PARAMS + 8  # one eighth of float64's 8 d, plus the scale
    replies = [r for r in fed.inventory.records() if r.task == TRAIN_TASK]
    assert replies and all(r.status == "ok" for r in replies)


def test_quantisation_is_refused_with_secure_aggregation():
    fed = fedstats.Federation.in_process(TRAIN)
    with pytest.raises(StudyConfigurationError, match="secure aggregation"):
        trainer(quantize_bits=8).fit(fed, secure_aggregation=fedstats.SecureAggregation())
    assert fed.inventory.records() == []
    with pytest.raises(StudyConfigurationError, match=r"1\.\.16"):
        trainer(quantize_bits=0)


def test_a_site_refuses_a_malformed_quantisation_request(float_run):
    """Asked directly for 17-bit codes, the silo refuses the request and releases nothing."""
    fed = fedstats.Federation.in_process({"a": TRAIN["a"]})
    plain = trainer()
    design = agree_design(fed, plain.formula, analysis="q", outcome_kind=plain.kind).spec
    args = train_arguments(
        design=design.to_wire(), scaling=float_run.scaling, model=plain.model, hyper=plain.hyper,
        local=plain.local, quantize_bits=None, schedule=None, analysis="study/q",
    )  # fmt: skip
    args.update({"weights": float_run.weights, "seed": 1, "quantize_bits": 17})
    reply = codec.decode(fed.silos["a"].handle(codec.encode({"task": TRAIN_TASK, "args": args})))
    assert reply["status"] == "error" and reply["error"]["type"] == "MalformedRequestError"
    assert "quantize_bits" in str(reply["error"]["values"])
