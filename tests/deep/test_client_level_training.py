"""Client-level DP-FedAvg in federated training: the coordinator's ledger against
dp_accounting, refusal before anything is sent, adaptive clipping, noise and clipping."""

from __future__ import annotations

import dp_accounting
import numpy as np
import pytest
from deep_helpers import BOUNDS, ledgers, synthetic_frame
from dp_accounting.rdp import RdpAccountant

import accounting
import fedstats
from fedstats.contract import codec
from fedstats.deep import FederatedTrainer
from fedstats.deep.shared.wire import TRAIN_TASK
from fedstats.errors import PlannedBudgetError, StudyConfigurationError
from fedstats.models.aggregation import CoordinateMedian
from fedstats.models.client_dp import DPFedAvg

SITES = ("a", "b", "c", "d")
FRAMES = {s: synthetic_frame(120, 20 + i) for i, s in enumerate(SITES)}
COORDINATOR = accounting.Scope(unit="site", owner="coordinator", study="study")
DELTA = 1e-5


def trainer(**options) -> FederatedTrainer:
    settings = dict(formula="y ~ x1 + x2", bounds=BOUNDS, rounds=4, local_steps=5, lr=0.2,
                    batch_size=16, seed=3, progress=False)  # fmt: skip
    settings.update(options)
    return FederatedTrainer("mlp", {"hidden": [8]}, **settings)


def coordinator_ledger(tmp_path, epsilon: float) -> accounting.Ledger:
    ledger = accounting.Ledger(tmp_path / "coordinator.db")
    ledger.set_budget(COORDINATOR, epsilon=epsilon, delta=DELTA)
    return ledger


def federation(ledger, frames=FRAMES, noise_seed=None, **options) -> fedstats.Federation:
    return fedstats.Federation.in_process(
        frames, ledger=ledger, noise_seed=noise_seed, trusts_client_level=True, **options
    )


def test_coordinator_ledger_epsilon_equals_dp_accounting_for_the_rounds(tmp_path):
    """Oracle: ``dp_accounting.rdp.RdpAccountant`` (default orders) composing ``rounds`` times
    the Poisson-subsampled Gaussian of DP-FedAvg with sites sampled at rate 1/2."""
    options = DPFedAvg.for_budget(8.0, DELTA, rounds=4, clip=0.5, sites=4, sample_rate=0.5)
    ledger = coordinator_ledger(tmp_path, epsilon=10.0)
    result = trainer(sample_rate_sites=0.5).fit(
        federation(ledger), privacy=options, evaluation=False
    )
    oracle = RdpAccountant()
    oracle.compose(
        dp_accounting.SelfComposedDpEvent(
            dp_accounting.PoissonSampledDpEvent(
                0.5, dp_accounting.GaussianDpEvent(options.noise_multiplier)
            ),
            4,
        )
    )
    expected = oracle.get_epsilon(DELTA)
    assert ledger.spent(COORDINATOR).epsilon == pytest.approx(expected, abs=1e-9)
    assert len(ledger.entries(COORDINATOR)) == 4  # every round, rounds without sites too
    (scope,) = result.privacy.scopes
    assert (scope.unit, scope.owner) == ("site", "coordinator")
    assert scope.epsilon == pytest.approx(expected, abs=1e-9)
    assert scope.cumulative_epsilon == pytest.approx(expected, abs=1e-9)
    assert expected <= 8.0 + 1e-9
    assert result.history["train_loss"].isna().all()  # the loss is not released
    assert any("with 4 sites, hiding one hospital needs noise" in n.lower() for n in result.notes)


def test_training_over_the_coordinator_budget_is_refused_before_anything_is_sent(tmp_path):
    options = DPFedAvg.for_budget(5.0, DELTA, rounds=4, clip=0.5, sites=4)
    ledger = coordinator_ledger(tmp_path, epsilon=1.0)
    fed = federation(ledger)
    with pytest.raises(PlannedBudgetError, match="coordinator's client-level budget"):
        trainer().fit(fed, privacy=options)
    assert ledger.spent(COORDINATOR).epsilon == 0.0 and ledger.entries(COORDINATOR) == []
    assert not [r for r in fed.inventory.records() if r.task == TRAIN_TASK]
    assert fed.inventory.records() == []


def test_adaptive_clipping_lowers_a_clip_far_above_every_update_norm(tmp_path):
    """Andrew et al. 2021: with every update inside the bound the noisy unclipped fraction is
    near 1 > target 1/2, so ``C <- C exp(-eta (b - gamma))`` falls round after round."""
    options = DPFedAvg(noise_multiplier=0.8, clip=100.0, expected_sites=4, adaptive=True,
                       target_quantile=0.5, clip_learning_rate=0.5, count_noise=1.0)  # fmt: skip
    ledger = coordinator_ledger(tmp_path, epsilon=1e3)
    result = trainer(rounds=8).fit(federation(ledger, noise_seed=5), privacy=options,
                                   evaluation=False)  # fmt: skip
    clips = result.history["clip"].to_numpy()
    assert clips[0] == 100.0
    assert clips[-1] < 0.3 * clips[0]
    assert np.all(result.history["unclipped_fraction"] > 0.5)
    oracle = RdpAccountant().compose(
        dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(0.8), 8)
    )  # the count's release is inside z (update noise z_u < z)
    assert ledger.spent(COORDINATOR).epsilon == pytest.approx(oracle.get_epsilon(DELTA), abs=1e-9)


def test_the_release_is_noised(tmp_path):
    """Same seeds for sampling, initial weights and local training: without a fixed noise seed
    two trainings differ; with the same fixed noise seed they are identical."""
    options = DPFedAvg(noise_multiplier=1.0, clip=0.5, expected_sites=4)

    def weights(name: str, noise_seed: int | None) -> np.ndarray:
        ledger = coordinator_ledger(tmp_path / name, epsilon=1e3)
        result = trainer(rounds=2).fit(federation(ledger, noise_seed=noise_seed),
                                       privacy=options, evaluation=False)  # fmt: skip
        return np.concatenate([w.ravel() for w in result.weights])

    for name in ("one", "two", "three", "four"):
        (tmp_path / name).mkdir()
    assert np.abs(weights("one", None) - weights("two", None)).max() > 1e-3
    np.testing.assert_array_equal(weights("three", 9), weights("four", 9))


def scaled(handle, factor: float, seen: list[float]):
    """A site's transport whose ``deep.train`` update is multiplied by ``factor``."""

    def transport(request: bytes) -> bytes:
        reply_bytes = handle(request)
        if codec.decode(request)["task"] != TRAIN_TASK:
            return reply_bytes
        reply = codec.decode(reply_bytes)
        update = reply["result"]["update"] * factor
        seen.append(float(np.linalg.norm(update)))
        reply["result"]["update"] = update.astype(np.float32)
        return codec.encode(reply)

    return transport


def test_one_huge_update_moves_the_model_by_at_most_clip_over_m(tmp_path):
    """With the same noise (the same fixed seed, so it cancels), one round with site ``d``'s
    update scaled by 1e6 lands within ``C / m`` of the honest round: clipping bounds one
    site's influence, whatever it sends."""
    clip = 0.5
    options = DPFedAvg(noise_multiplier=1.0, clip=clip, expected_sites=4)

    def fit(factor: float, name: str, seen: list[float]):
        (tmp_path / name).mkdir()
        honest = federation(None)
        fed = fedstats.Federation(
            {s: scaled(silo.handle, factor, seen) if s == "d" else silo.handle
             for s, silo in honest.silos.items()},
            ledger=coordinator_ledger(tmp_path / name, epsilon=1e3), noise_seed=4,
        )  # fmt: skip
        result = trainer(rounds=1).fit(fed, privacy=options, evaluation=False)
        return np.concatenate([w.ravel() for w in result.weights]).astype(np.float64)

    honest_norms: list[float] = []
    attack_norms: list[float] = []
    clean = fit(1.0, "clean", honest_norms)
    attacked = fit(1e6, "attacked", attack_norms)
    assert attack_norms[0] > 1e4 * clip  # what the attacker sent
    moved = float(np.linalg.norm(attacked - clean))
    print(
        f"honest norm {honest_norms[0]:.3g}, attack norm {attack_norms[0]:.3g}, moved {moved:.4g}"
    )
    assert moved <= clip / 4 + 1e-6
    # exactly: the honest update u (|u| < C) became C u / |u|, which differs from u by C - |u|
    assert honest_norms[0] < clip
    assert moved == pytest.approx((clip - honest_norms[0]) / 4, abs=1e-5)


def test_record_and_client_level_privacy_combine_with_both_accounts(tmp_path):
    frames = {s: FRAMES[s] for s in ("a", "b")}
    fed = fedstats.Federation.in_process(
        frames,
        ledgers=ledgers(tmp_path, frames, epsilon=10.0, delta=DELTA),
        ledger=coordinator_ledger(tmp_path, epsilon=1e3),
        noise_seed=2,
    )
    options = DPFedAvg(noise_multiplier=1.0, clip=0.5, expected_sites=2)
    result = trainer(rounds=1, local_steps=2).fit(
        fed, privacy=(fedstats.RecordDP(epsilon=5.0, delta=DELTA), options), evaluation=False
    )
    units = sorted((s.unit, s.owner) for s in result.privacy.scopes)
    assert units == [("patient", "a"), ("patient", "b"), ("site", "coordinator")]
    assert fed.ledger.spent(COORDINATOR).epsilon == pytest.approx(
        RdpAccountant().compose(dp_accounting.GaussianDpEvent(1.0)).get_epsilon(DELTA), abs=1e-9
    )


@pytest.mark.parametrize(
    ("options", "fit_options", "message"),
    [
        ({"sample_rate_sites": 0.5}, {}, "sample_rate_sites"),
        ({}, {"expected_sites": 3.0}, "expected_sites"),
        ({"aggregator": CoordinateMedian()}, {}, "aggregation rule"),
        ({"algorithm": "scaffold"}, {}, "SCAFFOLD"),
        ({}, {"secure": True}, "secure aggregation"),
    ],
)
def test_inconsistent_client_level_options_are_refused_before_anything_is_sent(
    tmp_path, options, fit_options, message
):
    ledger = coordinator_ledger(tmp_path, epsilon=1e3)
    fed = federation(ledger)
    privacy = DPFedAvg(noise_multiplier=1.0, clip=0.5,
                       expected_sites=fit_options.get("expected_sites", 4.0))  # fmt: skip
    secure = fedstats.SecureAggregation() if fit_options.get("secure") else None
    with pytest.raises(StudyConfigurationError, match=message):
        trainer(**options).fit(fed, privacy=privacy, secure_aggregation=secure)
    assert fed.inventory.records() == [] and ledger.entries(COORDINATOR) == []


def test_client_level_privacy_needs_a_coordinator_ledger():
    with pytest.raises(StudyConfigurationError, match="coordinator ledger"):
        trainer().fit(federation(None), privacy=DPFedAvg(1.0, 0.5, 4.0))
