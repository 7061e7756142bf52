"""The pooled Cox model's grid sums never describe fewer than ``k`` censored patients.

The attack: a site's reply to ``cox.grid_summaries`` holds, per grid point,
the risk-set sums ``S1_j`` and the event sums ``E1_j``. Their difference,
``S1_j - S1_{j+1} - E1_j``, is the covariate sum of the patients censored in
``(g_j, g_{j+1}]``, and ``S1_j - E1_j`` at the last point that of the patients
still at risk there without an event. Both must stand for 0 or at least ``k``
patients, or a few censored patients' covariates (one patient's, with one
censored) can be read off a reply whose every count is ``k`` or more.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from hypothesis import given, settings
from hypothesis import strategies as st

import fedstats

K = fedstats.DisclosurePolicy().min_count


def grid_reply(frame: pd.DataFrame, grid: np.ndarray) -> dict:
    fed = fedstats.Federation.in_process({"s": frame}, verified_paths=False)  # a raw request
    model = fedstats.CoxPH("Surv(t, e) ~ x", strata=None, grid=grid)
    spec = model.agree(fed, "a").spec
    args = {"design": spec.to_wire(), "beta": np.zeros(1), "grid": grid}
    return fed.request("cox.grid_summaries", args, analysis="a")["s"]


def censored_counts(reply: dict) -> tuple[np.ndarray, np.ndarray]:
    """At ``beta = 0``: the patients censored after each point, and those at risk at each
    point without an event there, from the released counts alone."""
    at_risk, died = reply["S0"], reply["d"]
    leaving = at_risk - np.append(at_risk[1:], 0.0)
    return leaving - died, at_risk - died


def test_one_censored_patient_among_many_deaths_is_not_released():
    rng = np.random.default_rng(0)
    # 3 x K deaths at time 1, 2 x K at time 2 plus one patient censored at 2, K at time 3
    times = np.r_[np.full(3 * K, 1.0), np.full(2 * K + 1, 2.0), np.full(K, 3.0), np.full(K, 4.0)]
    events = np.r_[np.ones(3 * K), np.ones(2 * K), [0], np.ones(K), np.zeros(K)]
    frame = pd.DataFrame({"t": times, "e": events.astype(int), "x": rng.normal(size=times.size)})
    lone = float(frame.loc[(frame.t == 2.0) & (frame.e == 0), "x"].iloc[0])
    reply = grid_reply(frame, np.array([1.0, 2.0, 3.0, 4.0]))
    S1, E1 = reply["S1"][:, 0], reply["E1"][:, 0]
    revealed = S1 - np.append(S1[1:], 0.0) - E1
    assert not np.isclose(revealed, lone).any()
    censored, survivors = censored_counts(reply)
    assert ((censored == 0) | (censored >= K)).all()
    assert ((survivors == 0) | (survivors >= K)).all()


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 10_000))
def test_no_released_point_stands_for_one_to_k_minus_one_censored_patients(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(80, 300))
    frame = pd.DataFrame(
        {
            "t": rng.integers(1, 8, n).astype(float),
            "e": (rng.random(n) < rng.uniform(0.3, 0.95)).astype(int),
            "x": rng.normal(size=n),
        }
    )
    reply = grid_reply(frame, np.arange(1.0, 8.0))
    censored, survivors = censored_counts(reply)
    released = reply["S0"] > 0
    assert ((censored[released] == 0) | (censored[released] >= K)).all()
    assert ((survivors[released] == 0) | (survivors[released] >= K)).all()
