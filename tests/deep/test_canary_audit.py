"""One-run canary audit of real federated DP-SGD (Steinke, Nasr & Jagielski, NeurIPS 2023).

The statistics are :mod:`fedstats.models.audit`'s (tested in ``tests/fedstats/test_audit.py``);
here the canaries go through the real training path — silos, codec, DP-SGD,
ledgers — and the non-private control shows that the audit has power.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from deep_helpers import ledgers

import accounting
import fedstats
from fedstats.deep import FederatedTrainer
from fedstats.deep.canary_audit import audit_training, audit_with_control, draw_canaries

COVARIATES = [f"x{j}" for j in range(1, 33)]
BOUNDS = {c: (-4.0, 4.0) for c in COVARIATES}
CANARIES = 500
GRID = [20, 50, 100, 200]
EPSILON, DELTA = 1.0, 1e-5
CONTROL_THRESHOLD = 0.5
"""The control's bound must clear this: with 500 canaries and these guess counts the
non-private MLP memorises enough random labels for bounds of about 1.2-1.9 (eight OS-entropy
inclusion draws), while a model that learnt nothing about the canaries gets a bound above
0 with probability at most 5 %, and above 0.5 far more rarely."""


def covariate_frame(n: int, seed: int) -> pd.DataFrame:
    """32 standard-normal covariates (well inside the bounds +/-4) and a weak logistic outcome."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, len(COVARIATES)))
    p = 1 / (1 + np.exp(-0.2 * (x[:, 0] - x[:, 1])))
    frame = pd.DataFrame(x, columns=COVARIATES)
    frame["y"] = (rng.random(n) < p).astype(int)
    return frame


FRAMES = {"a": covariate_frame(200, 1), "b": covariate_frame(200, 2)}


def trainer() -> FederatedTrainer:
    """Enough capacity and local steps for the control to memorise canaries' random labels."""
    return FederatedTrainer("mlp", {"hidden": [128]}, formula="y ~ " + " + ".join(COVARIATES),
                            bounds=BOUNDS, rounds=2, local_steps=100, lr=2.0, batch_size=48,
                            seed=5, progress=False)  # fmt: skip


def canaries(seed: int) -> pd.DataFrame:
    return draw_canaries(CANARIES, FRAMES["a"], bounds=BOUNDS, outcome="y",
                         rng=np.random.default_rng(seed))  # fmt: skip


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    """The private fit at epsilon 1 and its non-private control: same canaries, same draw."""
    books = ledgers(tmp_path_factory.mktemp("pair"), FRAMES, EPSILON, DELTA)
    return audit_with_control(trainer(), FRAMES, canaries(0), site="a",
                              privacy=fedstats.RecordDP(epsilon=EPSILON, delta=DELTA),
                              guess_grid=GRID, ledgers=books, noise_seed=17,
                              rng=np.random.default_rng(0)), books  # fmt: skip


def test_private_runs_never_exceed_the_sites_accounted_epsilon(tmp_path):
    """Three private fits, each with fresh canaries and a fresh inclusion draw."""
    for run in range(1, 4):
        folder = tmp_path / f"run{run}"
        folder.mkdir()
        books = ledgers(folder, FRAMES, EPSILON, DELTA)
        audited = audit_training(trainer(), FRAMES, canaries(run), site="a",
                                 privacy=fedstats.RecordDP(epsilon=EPSILON, delta=DELTA),
                                 guess_grid=GRID, ledgers=books, noise_seed=100 + run,
                                 rng=np.random.default_rng(run))  # fmt: skip
        assert 0 < audited.accounted_epsilon <= EPSILON + 1e-9
        assert audited.epsilon_lower <= audited.accounted_epsilon, (run, audited.result)


def test_the_non_private_control_detects_membership(report):
    pair, _ = report
    control = pair.control
    assert control.epsilon_lower >= CONTROL_THRESHOLD, control.result
    assert pair.private.epsilon_lower <= pair.private.accounted_epsilon
    assert pair.private.epsilon_lower < control.epsilon_lower
    # the same canaries and the same inclusion draw in both runs
    np.testing.assert_array_equal(pair.private.included, control.included)
    assert control.scores[control.included].mean() > control.scores[~control.included].mean()


def test_records_carry_the_accounted_epsilon_and_whether_the_run_was_private(report):
    pair, books = report
    private, control = pair.private.to_record(), pair.control.to_record()
    scope = next(s for s in pair.private.fit.privacy.scopes if s.owner == "a")
    assert private["private"] is True and control["private"] is False
    assert private["accounted_epsilon"] == scope.epsilon
    assert control["accounted_epsilon"] is None
    assert private["method"].startswith("one-run canary audit")
    for record, run in ((private, pair.private), (control, pair.control)):
        assert record["canaries"] == CANARIES
        assert record["canaries_inserted"] == record["included"] == int(run.included.sum())
        assert record["site_rows"] == len(FRAMES["a"]) + record["canaries_inserted"]
        assert record["site"] == "a"
    # the inserted canaries were patients of site a: its ledger paid the fit's epsilon
    spent = books["a"].spent(accounting.Scope(unit="patient", owner="a", study="study"))
    assert spent.epsilon == pytest.approx(scope.epsilon, abs=1e-9)
    frame = pair.to_frame()
    assert frame.loc["DP-SGD", "accounted epsilon"] == scope.epsilon
    assert "non-private control" in pair.summary()


def test_bad_audit_input_is_refused_before_training(tmp_path):
    good = canaries(0)
    options = dict(site="a", privacy=None, delta=DELTA, guess_grid=GRID)
    with pytest.raises(fedstats.StudyConfigurationError, match="columns"):
        audit_training(trainer(), FRAMES, good.drop(columns=["x3"]), **options)
    with pytest.raises(fedstats.StudyConfigurationError, match="guess"):
        audit_training(trainer(), FRAMES, good, **{**options, "guess_grid": [50, CANARIES + 1]})
    with pytest.raises(fedstats.StudyConfigurationError, match="not one of the sites"):
        audit_training(trainer(), FRAMES, good, **{**options, "site": "c"})
    with pytest.raises(fedstats.StudyConfigurationError, match="delta"):
        audit_training(trainer(), FRAMES, good, **{**options, "delta": None})
    private = fedstats.RecordDP(epsilon=1.0, delta=DELTA)
    with pytest.raises(fedstats.StudyConfigurationError, match="ledger"):
        audit_training(trainer(), FRAMES, good, **{**options, "privacy": private})
    with pytest.raises(fedstats.StudyConfigurationError, match="numeric"):
        audit_training(trainer(), FRAMES, good.assign(x1="high"), **options)
    with pytest.raises(fedstats.StudyConfigurationError, match="0/1"):
        audit_training(FederatedTrainer("survival_mlp", formula="Surv(t, e) ~ x1",
                                        bounds={"x1": (0, 1)}, local_steps=1, progress=False),
                       FRAMES, good, **options)  # fmt: skip
    with pytest.raises(fedstats.StudyConfigurationError, match="no public bounds"):
        draw_canaries(10, FRAMES["a"], bounds={"x1": (-4, 4)}, outcome="y")
    with pytest.raises(fedstats.StudyConfigurationError, match="trained design"):
        audit_training(trainer(), FRAMES, good.assign(y=2), **options)


def test_drawn_canaries_lie_near_the_corners_of_the_public_bounds():
    drawn = canaries(3)
    assert list(drawn.columns) == list(FRAMES["a"].columns)
    values = drawn[COVARIATES].to_numpy()
    assert (np.abs(values) >= 0.6 * 4.0 - 1e-12).all() and (np.abs(values) <= 4.0).all()
    assert set(drawn["y"].unique()) == {0, 1}
    assert drawn["y"].dtype == FRAMES["a"]["y"].dtype
