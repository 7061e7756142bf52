"""The model registry, weights on the wire, and the Cox loss against statsmodels."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from statsmodels.duration.hazard_regression import PHReg
from torch import nn

from fedstats.deep import ModelSpecError, build_model, cox_loss, register_model
from fedstats.deep.shared.weights import flatten, parameter_arrays, unflatten


def test_builtin_models_build_with_plain_hyperparameters():
    mlp = build_model("mlp", 5, {"hidden": [8, 4], "dropout": 0.1})
    assert mlp(torch.zeros(3, 5)).shape == (3, 1)
    surv = build_model("survival_mlp", 5, {"hidden": [8]})
    assert surv[-1].bias is None
    assert sum(p.numel() for p in build_model("linear", 5, {}).parameters()) == 6


@pytest.mark.parametrize(
    ("name", "hyper", "match"),
    [
        ("nope", {}, "no model 'nope' is registered"),
        ("mlp", {"hidden": [0]}, "hidden must list"),
        ("mlp", {"dropout": 1.5}, "dropout"),
        ("mlp", {"width": 3}, "cannot be built"),
    ],
)
def test_bad_model_requests_get_a_typed_error(name, hyper, match):
    with pytest.raises(ModelSpecError, match=match):
        build_model(name, 4, hyper)


def test_user_models_register_by_name_and_models_with_buffers_are_refused():
    register_model(
        "tiny-test", lambda in_features, width=3: nn.Linear(in_features, 1), replace=True
    )
    assert build_model("tiny-test", 2, {"width": 4}).weight.shape == (1, 2)
    register_model("bn-test", lambda d: nn.Sequential(nn.BatchNorm1d(d), nn.Linear(d, 1)),
                   replace=True)  # fmt: skip
    with pytest.raises(ModelSpecError, match="buffers"):
        build_model("bn-test", 2, {})
    with pytest.raises(ModelSpecError, match="registered already"):
        register_model("mlp", lambda d: nn.Linear(d, 1))


def test_weights_round_trip_in_state_dict_order():
    model = build_model("mlp", 3, {"hidden": [4]})
    arrays = parameter_arrays(model)
    assert [a.shape for a in arrays] == [tuple(t.shape) for t in model.state_dict().values()]
    assert all(a.dtype == np.float32 for a in arrays)
    back = unflatten(flatten(arrays), arrays)
    assert all(np.array_equal(a, b) for a, b in zip(arrays, back, strict=True))


def test_cox_loss_is_statsmodels_breslow_partial_likelihood():
    """statsmodels: ``PHReg(time, X, status, ties="breslow").loglike(beta)``; with tied times."""
    rng = np.random.default_rng(0)
    n = 60
    X = rng.normal(size=(n, 2))
    time = np.round(rng.exponential(5, n))  # many ties
    event = (rng.random(n) < 0.7).astype(float)
    beta = np.array([0.4, -0.7])
    oracle = PHReg(time, X, status=event, ties="breslow").loglike(beta)
    loss = cox_loss(torch.tensor(X @ beta), torch.tensor(time), torch.tensor(event))
    assert float(loss) * event.sum() == pytest.approx(-oracle, rel=1e-10)
