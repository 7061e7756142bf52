"""The differencing guard and the round caps.

The attack: two exact fits whose populations differ by one patient — the
second dropping one row through a missing value, or a threshold moved past
one patient — give that patient's contribution by subtraction, though each
covers many patients. A site remembers the row sets it answered about and
refuses a new one within ``k_cell - 1`` rows of an old one (or of its
complement), in the same request, in a later one, or after a restart.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import fedstats
from fedstats.errors import DisclosureError
from fedstats.site.differencing import DifferencingGuard
from fedstats.site.silo import Silo

K = fedstats.DisclosurePolicy().k_cell


def frame(n: int = 300, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    x = np.round(rng.normal(size=n), 3)
    z = rng.normal(size=n)
    z[[5, 17]] = np.nan  # two patients' z is missing
    return pd.DataFrame({"x": x, "z": z, "y": (rng.random(n) < 0.4).astype(int)})


def federation(data: pd.DataFrame, **policy) -> fedstats.Federation:
    return fedstats.Federation.in_process(
        {"s": data}, disclosure=fedstats.DisclosurePolicy(**policy)
    )


def test_a_population_two_patients_smaller_is_refused():
    fed = federation(frame())
    fedstats.LogisticRegression("y ~ x").fit(fed)
    with pytest.raises(DisclosureError) as info:
        fedstats.LogisticRegression("y ~ x + z", missing="drop").fit(fed)
    assert info.value.site == "s" and info.value.rule == "differencing"


def test_a_threshold_moved_past_a_few_patients_is_refused():
    data = frame()
    x = np.sort(data.x.to_numpy())
    low, high = x[150], x[152]  # two patients lie in [low, high)
    fed = federation(data)
    fedstats.LogisticRegression(f"y ~ I(x >= {low})").fit(fed)
    with pytest.raises(DisclosureError) as info:
        fedstats.LogisticRegression(f"y ~ I(x >= {high})").fit(fed)
    assert info.value.rule == "differencing" and info.value.task == "prepare"


def test_the_same_pair_in_one_request_is_refused():
    data = frame()
    x = np.sort(data.x.to_numpy())
    with pytest.raises(DisclosureError) as info:
        fedstats.LogisticRegression(f"y ~ I(x >= {x[150]}) + I(x >= {x[152]})").fit(
            federation(data)
        )
    assert info.value.rule == "differencing"


def test_sets_far_apart_are_answered():
    fed = federation(frame())
    fedstats.LogisticRegression("y ~ I(x >= 0)").fit(fed)
    fedstats.LogisticRegression("y ~ I(x >= 0.5)").fit(fed)  # dozens of patients apart


def test_the_guard_remembers_across_restarts(tmp_path):
    data = frame()
    path = tmp_path / "guard.sqlite"
    first = Silo("s", data, guard_path=path)
    fed = fedstats.Federation({"s": first.handle})
    fedstats.LogisticRegression("y ~ x").fit(fed)
    first._context.guard.close()
    again = Silo("s", data, guard_path=path)
    with pytest.raises(DisclosureError) as info:
        fedstats.LogisticRegression("y ~ x + z", missing="drop").fit(
            fedstats.Federation({"s": again.handle})
        )
    assert info.value.rule == "differencing"
    # a re-harmonised frame (other rows) starts a new record
    changed = Silo("s", frame(seed=1), guard_path=path)
    fedstats.LogisticRegression("y ~ x + z", missing="drop").fit(
        fedstats.Federation({"s": changed.handle})
    )


def test_rounds_per_analysis_are_capped():
    fed = federation(frame(), max_rounds_per_analysis=3)
    with pytest.raises(DisclosureError) as info:
        fedstats.LogisticRegression("y ~ x").fit(fed)
    assert info.value.rule == "rounds"


def test_analyses_per_study_are_capped():
    fed = federation(frame(), max_analyses_per_study=2)
    fedstats.LogisticRegression("y ~ x").fit(fed)
    fedstats.LogisticRegression("y ~ x").fit(fed)  # the same design is the same analysis
    fedstats.LogisticRegression("y ~ I(x >= 0)").fit(fed)
    with pytest.raises(DisclosureError) as info:
        fedstats.LogisticRegression("y ~ I(x >= 0.5)").fit(fed)
    assert info.value.rule == "rounds"


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(20, 200),
    first=st.sets(st.integers(0, 199)),
    flips=st.sets(st.integers(0, 199), max_size=12),
)
def test_a_row_set_is_refused_exactly_when_it_is_near_a_kept_one(n, first, flips):
    """Oracle: the symmetric difference counted with Python sets."""
    guard = DifferencingGuard(fedstats.DisclosurePolicy(), pd.DataFrame({"a": range(n)}))
    a = np.zeros(n, bool)
    a[[i for i in first if i < n]] = True
    guard.check_row_sets("s", "t", [("a", a)])
    b = a.copy()
    flipped = [i for i in flips if i < n]
    b[flipped] = ~b[flipped]
    differ = len(flipped)
    near = 0 < differ < K or 0 < n - differ < K
    if near:
        with pytest.raises(DisclosureError):
            guard.check_row_sets("s", "t", [("b", b)])
    else:
        guard.check_row_sets("s", "t", [("b", b)])
