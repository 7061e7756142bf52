"""Record-level DP-SGD: the ledgers' epsilon against dp_accounting and Opacus, budget refusals."""

from __future__ import annotations

import dp_accounting
import numpy as np
import pytest
from deep_helpers import BOUNDS, ledgers, synthetic_frame
from dp_accounting.rdp import RdpAccountant
from opacus.accountants import RDPAccountant

import accounting
import fedstats
from fedstats.contract import codec
from fedstats.deep import FederatedTrainer
from fedstats.deep.training.privacy_plan import COUNTS_NOISE_MULTIPLIER
from fedstats.deep.training.rounds import train_arguments


def private_trainer(**options) -> FederatedTrainer:
    settings = dict(formula="y ~ x1 + x2", bounds=BOUNDS, rounds=2, local_steps=7, lr=0.2,
                    batch_size=20, seed=3, progress=False)  # fmt: skip
    settings.update(options)
    return FederatedTrainer("mlp", {"hidden": [8]}, **settings)


def test_ledger_epsilon_equals_dp_accounting_and_opacus_for_the_steps_opacus_took(tmp_path):
    """Each site's ledger: the counts' Gaussian and the DP-SGD steps Opacus' accountant counted.
    Oracles: ``dp_accounting.rdp.RdpAccountant`` (default orders) to 1e-9, and
    ``opacus.accountants.RDPAccountant`` (its own order grid) within 0.1 %."""
    frames = {"a": synthetic_frame(200, 1), "b": synthetic_frame(150, 2)}
    fed = fedstats.Federation.in_process(
        frames, ledgers=ledgers(tmp_path, frames, epsilon=5.0, delta=1e-5), noise_seed=11
    )
    result = private_trainer().fit(fed, privacy=fedstats.RecordDP(epsilon=2.0, delta=1e-5))
    schedule = result.dp_schedule
    q, sigma = schedule.sample_rate, schedule.noise_multiplier
    assert result.dp_steps == {"a": 14, "b": 14}
    for site, steps in result.dp_steps.items():
        ledger_eps = (
            fed.silos[site]
            .ledger.spent(accounting.Scope(unit="patient", owner=site, study="study"))
            .epsilon
        )
        oracle = RdpAccountant()
        oracle.compose(dp_accounting.GaussianDpEvent(COUNTS_NOISE_MULTIPLIER))
        oracle.compose(
            dp_accounting.SelfComposedDpEvent(
                dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma)),
                steps,
            )
        )
        assert ledger_eps == pytest.approx(oracle.get_epsilon(1e-5), abs=1e-9)
        opacus = RDPAccountant()
        opacus.history = [(COUNTS_NOISE_MULTIPLIER, 1.0, 1), (sigma, q, steps)]
        assert ledger_eps == pytest.approx(opacus.get_epsilon(1e-5), rel=1e-3)
        assert ledger_eps <= 2.0 + 1e-9  # calibrated to the target
    scope = result.privacy.scopes[0]
    assert scope.fixed_seed and scope.cumulative_epsilon == pytest.approx(scope.epsilon)
    assert any("FIXED NOISE SEED" in note for note in result.notes)


def test_planned_training_over_a_sites_budget_is_refused_before_any_charge(tmp_path):
    frames = {"a": synthetic_frame(200, 1), "b": synthetic_frame(150, 2)}
    books = ledgers(tmp_path, frames, epsilon=1.0, delta=1e-5)
    books["b"].set_budget(accounting.Scope(unit="patient", owner="b", study="study"),
                          epsilon=0.5, delta=1e-5)  # fmt: skip
    fed = fedstats.Federation.in_process(frames, ledgers=books)
    with pytest.raises(fedstats.PlannedBudgetError, match=r"\['b'\]"):
        private_trainer(sample_rate=0.1).fit(
            fed, privacy=fedstats.RecordDP(epsilon=1.0, delta=1e-5)
        )
    for site, ledger in books.items():
        scope = accounting.Scope(unit="patient", owner=site, study="study")
        assert ledger.spent(scope).epsilon == 0.0


def test_a_site_refuses_a_round_over_its_budget_and_releases_nothing(tmp_path):
    """Asked directly (past the coordinator's preview), the silo's charge refuses the round."""
    frames = {"a": synthetic_frame(200, 1)}
    fed = fedstats.Federation.in_process(frames, ledgers=ledgers(tmp_path, frames, 1.0, 1e-5))
    result = private_trainer().fit(fed, privacy=fedstats.RecordDP(epsilon=1.0, delta=1e-5),
                                   evaluation=False)  # fmt: skip
    silo = fed.silos["a"]
    before = silo.ledger.spent(accounting.Scope(unit="patient", owner="a", study="study"))
    records = [r for r in fed.inventory.records() if r.task == "deep.train"]
    assert records
    trainer = private_trainer()
    schedule = result.dp_schedule
    args = train_arguments(
        design=_wire(fed, trainer), scaling=np.tile([0.0, 4.0], (3, 1)), model=trainer.model,
        hyper=trainer.hyper, local=trainer.local, quantize_bits=None, schedule=schedule,
        analysis="study/again",
    )  # fmt: skip
    args["weights"] = result.weights
    args["seed"] = None
    args["dp"] = {"noise_multipliers": {"dp_sgd": schedule.noise_multiplier}, "study": "study",
                  "analysis": "again", "note": ""}  # fmt: skip
    reply = codec.decode(silo.handle(codec.encode({"task": "deep.train", "args": args})))
    assert reply["status"] == "error" and reply["error"]["type"] == "BudgetExceededError"
    after = silo.ledger.spent(accounting.Scope(unit="patient", owner="a", study="study"))
    assert after.epsilon == before.epsilon


def test_survival_networks_are_refused_under_record_level_dp():
    with pytest.raises(fedstats.StudyConfigurationError, match="risk sets"):
        FederatedTrainer("survival_mlp", formula="Surv(T, E) ~ x1", bounds={"x1": (0, 1)},
                         local_steps=1, progress=False).fit(
            fedstats.Federation.in_process({"a": synthetic_frame(50, 1)}),
            privacy=fedstats.RecordDP(epsilon=1.0),
        )  # fmt: skip


def _wire(fed, trainer) -> dict:
    from fedstats.models.agree import agree_design

    return agree_design(fed.subset(["a"]), trainer.formula, analysis="x",
                        levels=None).spec.to_wire()  # fmt: skip
