"""Resource limits per request: refused before any work, or stopped at the deadline.

The attack: one ``deep.train`` request asks for 100,000 local steps of a
network with millions of parameters (hours of a hospital server's time), or
a request carries arrays of hundreds of millions of values.
"""

from __future__ import annotations

import time

import numpy as np
import pandas as pd
import pytest

import fedstats
from fedstats.contract import codec
from fedstats.errors import ResourceLimitError
from fedstats.site.resource_limits import RequestLimits
from fedstats.site.silo import Silo


def frame(n: int, seed: int) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    x1, x2 = rng.normal(size=n), rng.normal(size=n)
    return pd.DataFrame({"x1": x1, "x2": x2, "y": (rng.random(n) < 0.4).astype(int)})


def federation(limits: RequestLimits | None = None) -> fedstats.Federation:
    silos = {f"s{i}": Silo(f"s{i}", frame(200, i), limits=limits) for i in range(2)}
    fed = fedstats.Federation({name: silo.handle for name, silo in silos.items()})
    fed.silos = silos
    return fed


BOUNDS = {"x1": (-4.0, 4.0), "x2": (-4.0, 4.0)}


@pytest.mark.deep
def test_a_huge_training_request_is_refused_before_any_work():
    """100,000 local steps of a ~4M-parameter network: refused at the site, in well under a
    second, naming the site, the task and the limit."""
    from fedstats.deep import FederatedTrainer

    fed = federation()
    trainer = FederatedTrainer(
        "mlp", {"hidden": [2000, 2000]}, formula="y ~ x1 + x2", bounds=BOUNDS, rounds=1,
        local_steps=100_000, lr=0.1, batch_size=32, seed=1, progress=False,
    )  # fmt: skip
    started = time.monotonic()
    with pytest.raises(ResourceLimitError) as info:
        trainer.fit(fed, evaluation=False)
    assert time.monotonic() - started < 30  # no training happened (it would take hours)
    error = info.value
    assert error.site in fed.sites and error.task == "deep.train" and error.limit == "max_work"
    for silo in fed.silos.values():
        assert [e.reason for e in silo.log if e.status == "refused"] in ([], ["resources"])


@pytest.mark.deep
def test_training_stops_at_the_request_deadline_with_nothing_released():
    from fedstats.deep import FederatedTrainer

    fed = federation(RequestLimits(max_seconds=1e-9))
    trainer = FederatedTrainer(
        "mlp", {"hidden": [4]}, formula="y ~ x1 + x2", bounds=BOUNDS, rounds=1,
        local_steps=50, lr=0.1, batch_size=32, seed=1, progress=False,
    )  # fmt: skip
    with pytest.raises(ResourceLimitError) as info:
        trainer.fit(fed, evaluation=False)
    assert info.value.limit == "max_seconds" and info.value.task == "deep.train"


def test_oversized_requests_and_arrays_are_refused_before_parsing_the_work():
    silo = Silo("s0", frame(200, 0), limits=RequestLimits(max_request_bytes=10_000))
    big = codec.encode({"task": "describe", "args": {"variables": ["x1"] * 5_000}})
    reply = codec.decode(silo.handle(big))
    assert reply["status"] == "error"
    assert reply["error"]["type"] == "ResourceLimitError"
    assert reply["error"]["values"]["limit"] == "max_request_bytes"

    silo = Silo("s0", frame(200, 0), limits=RequestLimits(max_array_items=1_000))
    request = {
        "task": "survival.counts",
        "args": {"grid": np.arange(1.0, 5_001.0), "time": "x1", "event": "y", "group": None},
    }
    reply = codec.decode(silo.handle(codec.encode(request)))
    assert reply["error"]["type"] == "ResourceLimitError"
    assert reply["error"]["values"]["limit"] == "max_array_items"
    assert silo.log[-1].status == "refused" and silo.log[-1].reason == "resources"


LIMITS = ["max_seconds", "max_request_bytes", "max_array_items", "max_work"]


@pytest.mark.parametrize("field", LIMITS)
@pytest.mark.parametrize("value", [0, -1, True, "10"])
def test_limits_must_be_positive_numbers(field, value):
    with pytest.raises(fedstats.errors.StudyConfigurationError, match=field):
        RequestLimits(**{field: value})
