"""Heart disease (four real hospitals, FLamby's split): a federated MLP against the exact fit."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from deep_helpers import HEART_POLICY, heart_split

import fedstats
from fedstats import datasets
from fedstats.deep import FederatedTrainer
from fedstats.errors import DisclosureError


def _accuracy(params, frames) -> float:
    """Mean per-site test accuracy of logistic coefficients, computed on the test rows."""
    scores = []
    for frame in frames.values():
        eta = np.full(len(frame), params["Intercept"])
        for name, value in params.items():
            if name.startswith("C("):
                variable, level = name[2:].split(")[T.")
                eta += value * (frame[variable].astype(str) == level.rstrip("]"))
            elif name != "Intercept":
                eta += value * frame[name]
        scores.append(float(((eta > 0).astype(int) == frame["disease"]).mean()))
    return float(np.mean(scores))


HEART_SITES = {
    "cleveland_va": ["cleveland", "va"],
    "hungary_switzerland": ["hungary", "switzerland"],
}
"""FLamby's training rows of the four hospitals held by two sites (Switzerland's training split,
which has one outcome, trains with Hungary's)."""


def _grouped(frames: dict[str, pd.DataFrame]) -> dict[str, pd.DataFrame]:
    return {
        site: pd.concat([frames[h] for h in hospitals], ignore_index=True)
        for site, hospitals in HEART_SITES.items()
    }


def test_fedavg_mlp_accuracy_is_in_the_range_of_the_exact_logistic_fit():
    """FLamby's split as four sites leaves cells of one patient in the training splits (Hungary's
    LV hypertrophy, VA's women) and in the test splits (Hungary's typical angina, Switzerland's
    fbs): refused (rule ``cross-cells``) at the least threshold a site may set. The training rows
    held by two sites train; the four test splits are evaluated together, as one site. The oracle
    is the exact federated logistic regression (equal to statsmodels' pooled fit) on the same
    training rows."""
    train, test = heart_split()
    trainable = {s: f for s, f in train.items() if 0 < f["disease"].sum() < len(f)}
    with pytest.raises(DisclosureError) as refused:
        fedstats.LogisticRegression(datasets.HEART_FORMULA, levels=datasets.HEART_LEVELS).fit(
            fedstats.Federation.in_process(trainable, disclosure=HEART_POLICY)
        )
    assert refused.value.rule == "cross-cells"
    exact = fedstats.LogisticRegression(datasets.HEART_FORMULA, levels=datasets.HEART_LEVELS).fit(
        fedstats.Federation.in_process(_grouped(train), disclosure=HEART_POLICY)
    )
    evaluation = {"test": pd.concat(test.values(), ignore_index=True)}
    reference = _accuracy(exact.params, evaluation)
    trainer = FederatedTrainer(
        "mlp",
        {"hidden": [16]},
        formula=datasets.HEART_FORMULA,
        levels=datasets.HEART_LEVELS,
        bounds=datasets.HEART_BOUNDS,
        rounds=20,
        local_steps=10,
        lr=0.05,
        batch_size=16,
        seed=0,
        progress=False,
    )
    training = fedstats.Federation.in_process(_grouped(train), disclosure=HEART_POLICY)
    # the held-out site pins the training sites' keys: it checks the network it evaluates is
    # the one their signed last round leads to
    held_out = fedstats.Federation.in_process(evaluation, disclosure=HEART_POLICY,
                                              keys_of=training)  # fmt: skip
    result = trainer.fit(training, evaluation=held_out)
    accuracy = result.evaluation.mean_site_accuracy
    print(f"heart disease: MLP test accuracy {accuracy:.3f}, exact logistic {reference:.3f}")
    assert reference - 0.05 <= accuracy <= 1.0, (accuracy, reference)
    assert list(result.evaluation.table.index) == ["test", "pooled"]
    assert result.evaluation.table.loc["test", "n"] == sum(len(f) for f in test.values())
