"""Kaplan–Meier curves and a deep model over Flower equal the embedded runtime.

One SuperLink and three SuperNodes (separate processes) make the fits of one
study.toml (``conftest.py``, shared with the logistic and Cox equality
tests), among them site-pooled Kaplan–Meier curves by nodal status on a yearly grid,
and a small MLP trained with FedAvg for three rounds from a fixed seed. The
same study on ``Federation.in_process`` with the same frames is the reference:
the survival and counts tables agree to 1e-10 (counts exactly), and the
trained weights, per-round history and evaluation table agree to 1e-10 —
non-private training is deterministic given the seed (initial weights from
it, each round's batch order from ``round_seed(seed, round)``), whichever
process a site's training runs in.
"""

from __future__ import annotations

import tomllib

import numpy as np
import pydantic
import pytest
from flower_study import COVARIATES, DEEP_FIT

from fedstats.jobs.study_config import DeepFit

TOLERANCE = 1e-10


@pytest.fixture(scope="module")
def both_runtimes(tcga_over_flower) -> tuple[dict, dict]:
    """The study's results over Flower and in process (made once, in ``conftest.py``)."""
    return tcga_over_flower["over_flower"], tcga_over_flower["embedded"]


def assert_close(a: object, b: object, what: str) -> None:
    """Equal numbers (``None`` where the other has ``None``) within :data:`TOLERANCE`."""
    x = np.array(a, dtype=np.float64)  # None -> nan
    y = np.array(b, dtype=np.float64)
    assert x.shape == y.shape, what
    assert np.array_equal(np.isnan(x), np.isnan(y)), what
    assert np.nanmax(np.abs(x - y), initial=0.0) <= TOLERANCE, (what, x - y)


def test_kaplan_meier_over_flower_equals_the_embedded_runtime(both_runtimes) -> None:
    """Survival, its interval and Greenwood variance to 1e-10; counts exactly."""
    over_flower, embedded = both_runtimes
    a, b = over_flower["survival_by_nodes"], embedded["survival_by_nodes"]
    assert a["grid"] == b["grid"] and a["groups"] == b["groups"] == ["0", "1"]
    for table in ("survival", "lower", "upper", "greenwood"):
        for group in a["groups"]:
            assert_close(a[table][group], b[table][group], f"{table}[{group}]")
    for table in ("at_risk", "events"):
        assert a[table] == b[table], table
    assert a["n_obs"] == b["n_obs"] and a["truncated"] == b["truncated"]
    assert a["median"] == b["median"]
    assert sum(a["events"]["0"]) > 0  # a curve that moves, not an empty table


@pytest.mark.deep
def test_deep_model_over_flower_equals_the_embedded_runtime(both_runtimes) -> None:
    """Final weights, history and evaluation of the seeded FedAvg MLP to 1e-10."""
    over_flower, embedded = both_runtimes
    a, b = over_flower["event_mlp"], embedded["event_mlp"]
    assert a["columns"] == b["columns"] == COVARIATES
    assert_close(a["scaling"], b["scaling"], "scaling")
    assert a["weight_names"] == b["weight_names"]
    for name, mine, theirs in zip(a["weight_names"], a["weights"], b["weights"], strict=True):
        assert_close(mine, theirs, f"weights[{name}]")
    assert len(a["history"]) == len(b["history"]) == 3
    for mine, theirs in zip(a["history"], b["history"], strict=True):
        assert mine["round"] == theirs["round"] and mine["sites"] == theirs["sites"] == 3
        for key in ("train_loss", "update_norm"):
            assert_close(mine[key], theirs[key], f"round {mine['round']} {key}")
    assert a["evaluation"]["table"].keys() == b["evaluation"]["table"].keys()
    for row, values in a["evaluation"]["table"].items():
        assert values.keys() == b["evaluation"]["table"][row].keys()
        for key, value in values.items():
            assert_close(value, b["evaluation"]["table"][row][key], f"evaluation {row} {key}")
    assert a["provenance"]["n_obs"] == b["provenance"]["n_obs"]


@pytest.mark.deep
def test_the_deep_model_trained(both_runtimes) -> None:
    """The weights moved from the seeded start: the fit is not a no-op that trivially agrees."""
    over_flower, _embedded = both_runtimes
    history = over_flower["event_mlp"]["history"]
    assert all(row["update_norm"] > 0 for row in history)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"local_epochs": 1}, "exactly one of local_steps and local_epochs"),
        ({"bounds": {"age_at_index": [95, 20]}}, "must be below high"),
        ({"bounds": {"age_at_index": [20]}}, "at least 2 items"),
        ({"algorithm": "fedprox"}, "fedprox needs mu > 0"),
        ({"dropout": 0.1}, "Extra inputs are not permitted"),
    ],
)
def test_a_deep_fit_entry_is_checked_strictly(change: dict, message: str) -> None:
    """A ``[[fits]]`` entry of kind ``deep`` that the trainer would refuse fails at load."""
    entry = tomllib.loads(DEEP_FIT)["fits"][0] | change
    with pytest.raises(pydantic.ValidationError, match=message):
        DeepFit.model_validate(entry)
    unchanged = DeepFit.model_validate(tomllib.loads(DEEP_FIT)["fits"][0])
    assert unchanged.bounds["age_at_index"] == [20, 95]
