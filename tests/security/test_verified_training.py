"""Verified paths for exact federated training (FedAvg, FedProx, SCAFFOLD): a coordinator
cannot send the sites a global network of its own choosing.

A crafted global model is the deep-learning form of crafted coefficients: a network whose
weights make one patient's gradient stand out of an update (trap weights, Boenisch et al.
2023; Fowl et al., ICLR 2022) gives rows back. A site that verifies paths trains only from
the network the request's ``init_seed`` draws (round 1) or from the FedAvg step the relayed,
signed updates of every site lead to (:class:`fedstats.contract.paths.FedAvgPath`), and
refuses anything else with rule ``path`` before reading a row.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

import fedstats
from fedstats.contract import codec
from fedstats.contract.paths import MAX_SERVER_LR
from fedstats.deep import FederatedTrainer
from fedstats.deep.training.server_optimizers import ServerOptimizer

SITES = ("a", "b", "c")
BOUNDS = {"x1": (-4.0, 4.0), "x2": (-4.0, 4.0)}


def frame(n: int, seed: int) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 2))
    y = (rng.random(n) < 1 / (1 + np.exp(-(x[:, 0] - 0.5 * x[:, 1])))).astype(int)
    return pd.DataFrame({"x1": x[:, 0], "x2": x[:, 1], "y": y})


FRAMES = {site: frame(80 + 20 * i, 60 + i) for i, site in enumerate(SITES)}


def trainer(**options) -> FederatedTrainer:
    settings = dict(formula="y ~ x1 + x2", bounds=BOUNDS, rounds=3, local_steps=4, lr=0.2,
                    batch_size=16, seed=11, progress=False)  # fmt: skip
    settings.update(options)
    return FederatedTrainer("mlp", {"hidden": [6]}, **settings)


def recorded(frames, **options) -> tuple[fedstats.Federation, list[tuple[str, bytes]]]:
    """A federation of verifying sites whose requests are recorded as sent."""
    inner = fedstats.Federation.in_process(frames, **options)
    sent: list[tuple[str, bytes]] = []

    def transport(site: str):
        def send(request: bytes) -> bytes:
            sent.append((site, request))
            return inner.silos[site].handle(request)

        return send

    fed = fedstats.Federation({s: transport(s) for s in frames})
    fed.silos = inner.silos
    fed.path_sites = inner.path_sites
    return fed, sent


@pytest.mark.parametrize("algorithm", ["fedavg", "fedprox", "scaffold"])
def test_honest_training_takes_the_same_steps_with_and_without_verification(algorithm):
    options = {"algorithm": algorithm, "mu": 0.5 if algorithm == "fedprox" else 0.0}
    plain = trainer(**options).fit(
        fedstats.Federation.in_process(FRAMES, verified_paths=False), evaluation=False
    )
    fed = fedstats.Federation.in_process(FRAMES)
    verified = trainer(**options).fit(fed, evaluation=False)
    for got, want in zip(verified.weights, plain.weights, strict=True):
        np.testing.assert_array_equal(got, want)
    rounds = [r for r in fed.inventory.records() if r.task == "deep.train"]
    assert len(rounds) == 3 * len(SITES) and all(r.path == "verified" for r in rounds)


def test_a_crafted_global_model_is_refused_through_the_public_api(monkeypatch):
    """A coordinator whose server step scales the global network (a trap model) after round 1:
    every site refuses round 2, rule ``path``; so does round 1 with weights of its own."""
    honest_step = ServerOptimizer.step

    def crafted(self, weights, update):
        return (honest_step(self, weights, update) * 1000).astype(np.float32)

    monkeypatch.setattr(ServerOptimizer, "step", crafted)
    with pytest.raises(fedstats.DisclosureError) as refused:
        trainer().fit(fedstats.Federation.in_process(FRAMES), evaluation=False)
    assert refused.value.rule == "path"
    monkeypatch.setattr(ServerOptimizer, "step", honest_step)
    start = [
        np.full_like(w, 0.5)
        for w in trainer(rounds=1)
        .fit(fedstats.Federation.in_process(FRAMES, verified_paths=False), evaluation=False)
        .weights
    ]
    with pytest.raises(fedstats.DisclosureError) as refused:
        trainer().fit(fedstats.Federation.in_process(FRAMES), initial_weights=start,
                      evaluation=False)  # fmt: skip
    assert refused.value.rule == "path"
    answered = trainer(rounds=1).fit(  # sites that do not verify take given initial weights
        fedstats.Federation.in_process(FRAMES, verified_paths=False), initial_weights=start,
        evaluation=False,
    )  # fmt: skip
    assert answered.weights


def test_a_shifted_network_or_another_seed_is_refused_through_raw_requests():
    """Round 2's request replayed with one weight moved by 1e-3, or round 1's with another
    ``init_seed`` (or weights drawn from another seed): refused, rule ``path``; replayed as
    sent, each is answered."""
    fed, sent = recorded(FRAMES)
    trainer(rounds=2).fit(fed, evaluation=False)
    train = [(s, r) for s, r in sent if codec.decode(r)["task"] == "deep.train"]
    silo = fed.silos["a"]

    def ask(message: dict) -> dict:
        return codec.decode(silo.handle(codec.encode(message)))

    first, second = (codec.decode(r) for s, r in train if s == "a")
    assert ask(second)["status"] == "ok"
    shifted = {**second, "args": {**second["args"]}}
    weights = [w.copy() for w in second["args"]["weights"]]
    weights[0].flat[0] += 1e-3
    shifted["args"]["weights"] = weights
    reply = ask(shifted)
    assert reply["status"] == "error" and reply["error"]["values"]["rule"] == "path"
    assert ask(first)["status"] == "ok"
    reseeded = {**first, "args": {**first["args"], "init_seed": first["args"]["init_seed"] + 1}}
    reply = ask(reseeded)
    assert reply["status"] == "error" and reply["error"]["values"]["rule"] == "path"


@pytest.mark.parametrize("algorithm", ["fedavg", "scaffold"])
def test_an_exact_training_inside_secure_aggregation_is_verified_at_every_masked_round(
    algorithm,
):
    """Each site weighs its own update by its rows and sends them (``scale`` ``"rows"``), so
    the coordinator divides ``sum_k n_k Delta_k`` by ``sum_k n_k`` and every site re-derives
    each round's network from the relayed signed masked replies and seeds: every answer
    verified, the network the clear training's to fixed-point precision."""
    clear = trainer(algorithm=algorithm).fit(fedstats.Federation.in_process(FRAMES),
                                             evaluation=False)  # fmt: skip
    fed = fedstats.Federation.in_process(FRAMES)
    secure = trainer(algorithm=algorithm).fit(
        fed, secure_aggregation=fedstats.SecureAggregation(), evaluation=False
    )
    for got, want in zip(secure.weights, clear.weights, strict=True):
        np.testing.assert_allclose(got, want, atol=1e-6)
    answers = [r for r in fed.inventory.records() if r.task == "deep.train"]
    assert answers and {r.path for r in answers} == {"verified"}


def test_weights_of_the_coordinators_choosing_inside_secure_aggregation_are_refused():
    """A coordinator that weighs the masked updates itself could single one site's update
    out of the sum (weight 1 for it, 0 for the others): sites that verify paths answer an
    exact training round inside secure aggregation only self-weighted, and a round-2
    request replayed with weights of the coordinator's, or with SCAFFOLD's control scale
    moved, is refused (rule ``path``), before any session state is read. A sampled training,
    whose weights ``n_k / (N p)`` the coordinator sets, is not asked inside secure aggregation
    of verifying sites."""
    fed, sent = recorded(FRAMES)
    trainer(rounds=2, algorithm="scaffold").fit(
        fed, secure_aggregation=fedstats.SecureAggregation(), evaluation=False
    )
    masked = [codec.decode(r) for s, r in sent
              if s == "a" and codec.decode(r)["task"] == "deep.train"]  # fmt: skip
    second = masked[1]
    assert second["args"]["scale"] == "rows" and "seeds" in second["args"]["path"]["previous"]
    silo = fed.silos["a"]
    for change in ({"scale": {"a": 1.0, "b": 0.0, "c": 0.0}}, {"control_scale": 1.0}):
        message = {**second, "args": {**second["args"], **change}}
        reply = codec.decode(silo.handle(codec.encode(message)))
        assert reply["status"] == "error" and reply["error"]["values"]["rule"] == "path", change
    with pytest.raises(fedstats.StudyConfigurationError, match="cannot be re-derived"):
        trainer(rounds=1, sample_rate_sites=0.999).fit(
            fedstats.Federation.in_process(FRAMES), evaluation=False,
            secure_aggregation=fedstats.SecureAggregation(threshold=2),
        )  # fmt: skip


def test_a_robust_rule_is_re_derived_and_a_rule_swapped_mid_training_is_refused():
    """A training combined by a rule of the contract (coordinate-wise median, trimmed mean,
    norm bounding) names it in every round; every site re-derives each network with it (all
    answers verified, evaluation answered at the final network). Round 2 replayed with its
    rule swapped for the mean (so the network no longer follows), with a rule the contract
    does not know, or with a malformed one: refused, rule ``path``. A coordinator's own
    callable has no wire form: its training is not asked of verifying sites."""
    from fedstats.contract.aggregation import RULE_KEY
    from fedstats.models.aggregation import CoordinateMedian, NormBounded, TrimmedMean

    for rule in (CoordinateMedian(), TrimmedMean(0.25), NormBounded(0.5, CoordinateMedian())):
        fed = fedstats.Federation.in_process(FRAMES)
        result = trainer(rounds=3, aggregator=rule).fit(fed)
        answers = [r for r in fed.inventory.records() if r.task == "deep.train"]
        assert answers and {r.path for r in answers} == {"verified"}, rule
        assert result.evaluation is not None, rule
    fed, sent = recorded(FRAMES)
    trainer(rounds=2, aggregator=CoordinateMedian()).fit(fed, evaluation=False)
    second = [codec.decode(r) for s, r in sent
              if s == "a" and codec.decode(r)["task"] == "deep.train"][1]  # fmt: skip
    silo = fed.silos["a"]
    assert codec.decode(silo.handle(codec.encode(second)))["status"] == "ok"
    nested: dict = {"rule": "median"}
    for _ in range(8):  # deeper than any rule needs
        nested = {"rule": "norm_bounded", "bound": 1.0, "inner": nested}
    for swapped in ({"rule": "mean"}, {"rule": "krum"}, {"rule": "trimmed_mean", "beta": 0.9},
                    {"rule": "median", "extra": 1}, "median", None, nested,
                    {"rule": "norm_bounded", "bound": float("nan"), "inner": {"rule": "median"}},
                    {"rule": "norm_bounded", "bound": True, "inner": {"rule": "median"}},
                    {"rule": "norm_bounded", "bound": 1e-300, "inner": "median"},
                    {"rule": "trimmed_mean", "beta": "0.1"}):  # fmt: skip
        message = {**second, "args": {**second["args"], RULE_KEY: swapped}}
        reply = codec.decode(silo.handle(codec.encode(message)))
        assert reply["status"] == "error", swapped
        assert reply["error"]["values"]["rule"] == "path", (swapped, reply)

    def own_rule(updates, weights):
        return np.max(np.stack(updates), axis=0)

    verifying = fedstats.Federation.in_process(FRAMES)
    with pytest.raises(fedstats.DisclosureError) as refused:
        trainer(rounds=1, aggregator=own_rule).fit(verifying, evaluation=False)
    assert refused.value.rule == "path"


def test_a_network_is_evaluated_only_where_its_training_ended():
    """``fit`` evaluates the final network with the last round relayed: answered. The same
    network moved by 1e-3, or any network without its training's last round (the public
    ``evaluate``), is refused by sites that verify paths, rule ``path``."""
    fed = fedstats.Federation.in_process(FRAMES)
    model = trainer(algorithm="scaffold")
    result = model.fit(fed)
    assert result.evaluation is not None
    evaluations = [r for r in fed.inventory.records() if r.task == "deep.evaluate"]
    assert evaluations and all(r.status == "ok" for r in evaluations)
    with pytest.raises(fedstats.DisclosureError) as refused:
        model.evaluate(fed, result.weights)
    assert refused.value.rule == "path"
    fed2, sent = recorded(FRAMES)
    model.fit(fed2)
    (site, request) = next((s, r) for s, r in sent if codec.decode(r)["task"] == "deep.evaluate")
    message = codec.decode(request)
    assert codec.decode(fed2.silos[site].handle(request))["status"] == "ok"
    weights = [w.copy() for w in message["args"]["weights"]]
    weights[-1].flat[0] += 1e-3
    moved = {**message, "args": {**message["args"], "weights": weights}}
    reply = codec.decode(fed2.silos[site].handle(codec.encode(moved)))
    assert reply["status"] == "error" and reply["error"]["values"]["rule"] == "path"


def test_a_trained_network_is_evaluated_only_on_its_trainings_inputs(monkeypatch):
    """The honest network, with its training's last round relayed, evaluated on inputs of the
    coordinator's choosing: half-widths of 1e-6 (each input becomes the indicator of a
    threshold the coordinator moves, so differenced scores tell where single patients' values
    lie), moved centres, another formula, dropout switched on. Each is refused, rule ``path``,
    before a row is read; the request as sent is answered."""
    fed, sent = recorded(FRAMES)
    trainer().fit(fed)
    (site, request) = next((s, r) for s, r in sent if codec.decode(r)["task"] == "deep.evaluate")
    message = codec.decode(request)
    args = message["args"]
    read: list[str] = []
    import fedstats.deep.site.tasks as site_tasks

    real = site_tasks.site_tensors
    monkeypatch.setattr(
        site_tasks, "site_tensors", lambda *a, **k: read.append("rows") or real(*a, **k)
    )

    def answer(**fields) -> dict:
        changed = {**message, "args": {**args, **fields}}
        return codec.decode(fed.silos[site].handle(codec.encode(changed)))

    tiny, moved = args["scaling"].copy(), args["scaling"].copy()
    tiny[:, 1] = 1e-6
    moved[1:, 0] = 3.0
    narrow_design = {**args["design"], "formula": "y ~ x1 + x2 - 1"}
    for fields in (
        {"scaling": tiny},
        {"scaling": moved},
        {"design": narrow_design},
        {"hyper": {"hidden": [6], "dropout": 0.5}},
    ):
        reply = answer(**fields)
        assert reply["status"] == "error", fields
        assert reply["error"]["values"]["rule"] == "path", (fields, reply)
    # another network kind cannot hold these weights: refused as malformed, also unread
    assert answer(model="linear", hyper={})["error"]["type"] == "MalformedRequestError"
    assert read == []
    assert answer()["status"] == "ok" and read == ["rows"]


def test_every_training_field_a_coordinator_sets_is_bound_or_refused(monkeypatch):
    """The fields an exact training path adds, sent as a malicious coordinator would: round 2
    replayed with another server learning rate or an adaptive server optimiser (not what the
    relayed replies were signed under), a training whose server learning rate exceeds the
    cap (its round 2 follows no rule), round 1 with an ``init_seed`` that is not a seed,
    and a ``client_level`` flag at a site that does not trust the coordinator: each refused,
    rule ``path``, and no row is read for any of them."""
    fed, sent = recorded(FRAMES)
    trainer(rounds=2).fit(fed, evaluation=False)
    first, second = (codec.decode(r) for s, r in sent
                     if s == "a" and codec.decode(r)["task"] == "deep.train")  # fmt: skip
    read: list[str] = []
    import fedstats.deep.site.tasks as site_tasks

    real = site_tasks.site_tensors
    monkeypatch.setattr(
        site_tasks, "site_tensors", lambda *a, **k: read.append("rows") or real(*a, **k)
    )

    def refused(message: dict) -> None:
        reply = codec.decode(fed.silos["a"].handle(codec.encode(message)))
        assert reply["status"] == "error" and reply["error"]["values"]["rule"] == "path", reply

    def changed(message: dict, **fields) -> dict:
        return {**message, "args": {**message["args"], **fields}}

    refused(changed(second, server_lr=2.0))
    refused(changed(second, server_optimizer="adam"))
    refused(changed(second, client_level=True))
    for seed in ("7", -1, 2**63, True, None):
        refused(changed(first, init_seed=seed))
    assert read == []
    assert codec.decode(fed.silos["a"].handle(codec.encode(first)))["status"] == "ok"
    assert read == ["rows"]  # the honest round reads them: the patch sees a read
    with pytest.raises(fedstats.DisclosureError) as info:
        trainer(server_lr=MAX_SERVER_LR * 2).fit(
            fedstats.Federation.in_process(FRAMES), evaluation=False
        )
    assert info.value.rule == "path"
    trainer(server_lr=MAX_SERVER_LR).fit(fedstats.Federation.in_process(FRAMES), evaluation=False)
