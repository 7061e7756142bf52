"""Federated training against independent oracles: central torch training, secure sums,
scikit-learn and lifelines metrics, and the unbiasedness of client-sampling weights."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pandas as pd
import pytest
import torch
from deep_helpers import BOUNDS, synthetic_frame
from lifelines.utils import concordance_index
from sklearn.metrics import roc_auc_score

import fedstats
from fedstats.deep import FederatedTrainer, build_model
from fedstats.deep.shared.weights import parameter_arrays
from fedstats.deep.training.aggregation import client_weights, weighted_sum
from fedstats.deep.training.rounds import round_seed

FORMULA = "y ~ x1 + x2"


def trainer(**options) -> FederatedTrainer:
    settings = dict(formula=FORMULA, bounds=BOUNDS, rounds=2, local_steps=6, lr=0.2,
                    batch_size=16, seed=7, progress=False)  # fmt: skip
    settings.update(options)
    return FederatedTrainer("mlp", {"hidden": [8]}, **settings)


def test_fedavg_with_one_site_equals_central_torch_training():
    """Oracle: a plain torch loop on the pooled (one-site) rows — inputs scaled by the public
    bounds, the same initial weights, SGD on the same shuffled batches (round r's order from
    ``torch.randperm`` with seed ``SeedSequence([seed, r])``)."""
    frame = synthetic_frame(120, 1)
    torch.manual_seed(3)
    init = parameter_arrays(build_model("mlp", 2, {"hidden": [8]}))
    fed = fedstats.Federation.in_process({"only": frame})
    result = trainer().fit(fed, init_seed=3, evaluation=False)  # draws init, as above

    model = build_model("mlp", 2, {"hidden": [8]})
    with torch.no_grad():
        for p, w in zip(model.parameters(), init, strict=True):
            p.copy_(torch.from_numpy(w))
    X = torch.tensor(np.clip(frame[["x1", "x2"]].to_numpy() / 4.0, -1, 1), dtype=torch.float32)
    y = torch.tensor(frame["y"].to_numpy(), dtype=torch.float32)
    opt = torch.optim.SGD(model.parameters(), lr=0.2)
    for r in (1, 2):
        order = torch.randperm(120, generator=torch.Generator().manual_seed(round_seed(7, r)))
        for b in range(6):
            index = order[16 * b : 16 * (b + 1)]
            opt.zero_grad()
            loss = torch.nn.functional.binary_cross_entropy_with_logits(
                model(X[index]).reshape(-1), y[index]
            )
            loss.backward()
            opt.step()
    for got, want in zip(result.weights, parameter_arrays(model), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_fedavg_update_is_the_size_weighted_mean_of_site_updates():
    """Two rounds of FedAvg with two sites equal the n-weighted mean of one-site runs (round 1)."""
    frames = {"a": synthetic_frame(90, 2), "b": synthetic_frame(150, 3)}
    torch.manual_seed(4)
    init = parameter_arrays(build_model("mlp", 2, {"hidden": [8]}))
    both = trainer(rounds=1).fit(
        fedstats.Federation.in_process(frames), init_seed=4, evaluation=False
    )
    alone = {
        s: trainer(rounds=1).fit(
            fedstats.Federation.in_process({s: f}), init_seed=4, evaluation=False
        )
        for s, f in frames.items()
    }
    for j, start in enumerate(init):
        expected = start + sum(len(frames[s]) / 240 * (alone[s].weights[j] - start) for s in frames)
        np.testing.assert_allclose(both.weights[j], expected, rtol=1e-5, atol=1e-6)


def test_secure_aggregation_gives_the_clear_result_without_showing_updates():
    frames = {s: synthetic_frame(80, i) for i, s in enumerate(["a", "b", "c"])}
    clear = trainer(algorithm="scaffold").fit(fedstats.Federation.in_process(frames),
                                              evaluation=False)  # fmt: skip
    fed = fedstats.Federation.in_process(frames)  # each masked round's network verified
    secure = trainer(algorithm="scaffold").fit(
        fed, secure_aggregation=fedstats.SecureAggregation(), evaluation=False
    )
    for got, want in zip(secure.weights, clear.weights, strict=True):
        np.testing.assert_allclose(got, want, atol=1e-5)
    train_replies = [r for r in fed.inventory.records() if r.task == "deep.train"]
    assert train_replies and all(r.status == "ok" for r in train_replies)
    assert any("secure aggregation" in note for note in secure.notes)
    assert any(note.startswith("FIXED SEED 7:") for note in secure.notes)
    unseeded = trainer(seed=None).fit(fedstats.Federation.in_process(frames), evaluation=False)
    assert not any("FIXED SEED" in note for note in unseeded.notes)


def test_scaffold_keeps_each_sites_control_variate_between_rounds():
    frames = {"a": synthetic_frame(80, 5), "b": synthetic_frame(60, 6)}
    fed = fedstats.Federation.in_process(frames)
    trainer(algorithm="scaffold", rounds=3).fit(fed, evaluation=False)
    for silo in fed.silos.values():
        (control,) = silo._context.cache["deep.scaffold"].values()
        assert control.shape == (8 * 2 + 8 + 8 + 1,) and np.abs(control).sum() > 0


def test_fedprox_with_large_mu_stays_near_the_global_model():
    frames = {"a": synthetic_frame(80, 7), "b": synthetic_frame(60, 8)}
    torch.manual_seed(5)
    init = parameter_arrays(build_model("mlp", 2, {"hidden": [8]}))
    moves = {}
    for algorithm, mu in (("fedavg", 0.0), ("fedprox", 50.0)):
        result = trainer(algorithm=algorithm, mu=mu, rounds=1, lr=0.01).fit(
            fedstats.Federation.in_process(frames), init_seed=5, evaluation=False
        )
        moves[algorithm] = sum(np.linalg.norm(w - i) for w, i in zip(result.weights, init,
                                                                       strict=True))  # fmt: skip
    assert moves["fedprox"] < 0.9 * moves["fedavg"]


def test_client_sampling_weights_are_unbiased():
    """``E[sum_{k in S} n_k/(N p) Delta_k] = sum_k n_k/N Delta_k`` over all subsets S."""
    n = {"a": 30.0, "b": 50.0, "c": 20.0}
    updates = {s: np.array([i + 1.0, -i]) for i, s in enumerate(n)}
    p = 0.4
    expected = sum(n[s] / 100 * updates[s] for s in n)
    mean = np.zeros(2)
    for size in range(1, 4):
        for subset in itertools.combinations(n, size):
            prob = p**size * (1 - p) ** (3 - size)
            w = client_weights(n, subset, p)
            mean += prob * weighted_sum([updates[s] for s in subset], [w[s] for s in subset])
    np.testing.assert_allclose(mean, expected)


def test_evaluation_matches_scikit_learn_on_the_pooled_rows():
    frames = {"a": synthetic_frame(150, 9), "b": synthetic_frame(120, 10)}
    fed = fedstats.Federation.in_process(frames)
    result = trainer(rounds=6, local_steps=10).fit(fed)
    network = result.module()
    pooled = pd.concat(frames.values(), ignore_index=True)
    X = torch.tensor(np.clip(pooled[["x1", "x2"]].to_numpy() / 4.0, -1, 1), dtype=torch.float32)
    with torch.no_grad():
        logits = network(X).reshape(-1).numpy()
    y = pooled["y"].to_numpy()
    table = result.evaluation.table
    assert table.loc["pooled", "accuracy"] == pytest.approx(((logits > 0) == y).mean())
    assert table.loc["pooled", "auc"] == pytest.approx(roc_auc_score(y, logits), abs=0.01)
    site_a = logits[: len(frames["a"])]
    assert table.loc["a", "auc"] == pytest.approx(roc_auc_score(frames["a"]["y"], site_a))
    p = 1 / (1 + np.exp(-logits))
    assert table.loc["pooled", "brier"] == pytest.approx(np.mean((p - y) ** 2), rel=1e-5)


def test_survival_network_c_index_is_lifelines_concordance():
    """Per-site C equals lifelines' ``concordance_index(T, -risk, E)``; training improves on 0.5."""
    rng = np.random.default_rng(11)
    frames = {}
    for site in ("a", "b"):
        x = rng.normal(size=(150, 2))
        t = rng.exponential(np.exp(-(1.0 * x[:, 0] - 0.5 * x[:, 1])))
        c = rng.exponential(2.0, 150)
        frames[site] = pd.DataFrame({"x1": x[:, 0], "x2": x[:, 1], "T": np.minimum(t, c),
                                     "E": (t <= c).astype(int)})  # fmt: skip
    fed = fedstats.Federation.in_process(frames)
    result = FederatedTrainer("survival_mlp", {"hidden": [8]}, formula="Surv(T, E) ~ x1 + x2",
                              bounds=BOUNDS, rounds=4, local_steps=10, lr=0.1, batch_size=50,
                              seed=1, progress=False).fit(fed)  # fmt: skip
    network = result.module()
    for site, frame in frames.items():
        X = torch.tensor(np.clip(frame[["x1", "x2"]].to_numpy() / 4, -1, 1), dtype=torch.float32)
        with torch.no_grad():
            risk = network(X).reshape(-1).numpy()
        oracle = concordance_index(frame["T"], -risk, frame["E"])
        assert result.evaluation.table.loc[site, "c_index"] == pytest.approx(oracle)
    assert result.evaluation.table.loc["pooled", "c_index"] > 0.6
    assert math.isfinite(result.history["train_loss"].iloc[-1])


def test_evaluation_histograms_release_no_bin_of_fewer_than_k_patients():
    """Every non-empty released logit bin holds at least k patients; none is lost."""
    from fedstats.contract import codec
    from fedstats.deep.shared.wire import EVALUATE_TASK

    frames = {"a": synthetic_frame(150, 9), "b": synthetic_frame(120, 10)}
    base = fedstats.Federation.in_process(frames)
    released: dict[str, list[dict]] = {site: [] for site in frames}

    def recording(site, handle):
        def send(request: bytes) -> bytes:
            reply = handle(request)
            if codec.decode(request)["task"] == EVALUATE_TASK:
                released[site].append(codec.decode(reply)["result"])
            return reply

        return send

    fed = fedstats.Federation({s: recording(s, silo.handle) for s, silo in base.silos.items()})
    trainer(rounds=2, local_steps=5).fit(fed)
    for site, replies in released.items():
        assert replies
        k = base.silos[site].policy.min_count
        for reply in replies:
            together = reply["logits_events"] + reply["logits_non_events"]
            assert together.sum() == len(frames[site])
            assert np.all((together == 0) | (together >= k))
            assert reply["logits_events"].sum() == frames[site]["y"].sum()
