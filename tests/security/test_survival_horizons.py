"""Where each site's survival counts stop is stated, and that tells a coordinator nothing new.

A federated Kaplan–Meier result names, per site and group, the last grid time
its counts reach (``horizons_``, the curve record's ``horizons``), and does not
release the pooled curve past the earliest one. The attack: learn how many
deaths a site holds in the interval its counts were cut at (1 to ``k - 1``).
Two worlds differ only there (site ``x``: 1 death and 8 censorings, or 9
deaths, in its last grid interval); every request a coordinator can make --
the study grid, its prefixes, grouped or not, deferred or not, and a crafted
grid -- gets byte-identical replies in both worlds, and the results
(horizons, what is released, warnings, records) are identical: the horizon is
computed from the released counts, so it cannot tell the worlds apart either.
"""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd
import pytest

import fedstats
from fedstats.contract import codec
from fedstats.contract.tasks.survival import TASK
from fedstats.models.survival_horizons import site_reach

GRID = np.array([10.0, 20.0, 30.0, 40.0, 50.0, 60.0])
K = fedstats.DisclosurePolicy().min_count


def site_x(deaths_in_cut: int) -> pd.DataFrame:
    """100 patients: 12, 0, 15, 0 and 11 deaths in the first five intervals (each >= k),
    9 patients leaving in the sixth (``deaths_in_cut`` of them dying, the rest censored),
    the others followed beyond the grid; two arms alike in both worlds."""
    times, events = [], []

    def add(n, time, event):
        times.extend([time] * n)
        events.extend([event] * n)

    add(12, 5.0, 1)
    add(10, 15.0, 0)
    add(15, 25.0, 1)
    add(10, 35.0, 0)
    add(11, 45.0, 1)
    add(deaths_in_cut, 55.0, 1)
    add(9 - deaths_in_cut, 55.0, 0)
    add(100 - len(times), 80.0, 0)
    arm = np.where(np.arange(100) % 2 == 0, "a", "b")
    return pd.DataFrame({"time": times, "event": events, "arm": arm})


def site_y() -> pd.DataFrame:
    rng = np.random.default_rng(8)
    death, censor = rng.exponential(60.0, 400), rng.uniform(0, 90, 400)
    return pd.DataFrame(
        {
            "time": np.minimum(death, censor),
            "event": (death <= censor).astype(int),
            "arm": np.where(rng.random(400) < 0.5, "a", "b"),
        }
    )


def recorded_federation(frames: dict[str, pd.DataFrame]):
    """A federation over silos whose every reply is kept, as the coordinator receives it."""
    replies: list[bytes] = []

    def transport(silo: fedstats.Silo):
        def send(request: bytes) -> bytes:
            reply = silo.handle(request)
            if codec.decode(request)["task"] == TASK:
                replies.append(reply)
            return reply

        return send

    silos = {name: fedstats.Silo(name, frame) for name, frame in frames.items()}
    return fedstats.Federation({n: transport(s) for n, s in silos.items()}), replies


REQUESTS = [
    {"grid": GRID},
    {"grid": GRID[:5]},  # a prefix ending before the cut
    {"grid": GRID[:6]},
    {"grid": GRID, "group": "arm", "levels": ["a", "b"]},
    {"grid": GRID, "sparse_events": "defer"},
    {"grid": GRID, "group": "arm", "levels": ["a", "b"], "sparse_events": "defer"},
    {"grid": np.array([10.0, 20.0, 30.0, 40.0, 50.0, 55.0, 60.0])},  # crafted: refused
]


def world(deaths_in_cut: int) -> tuple[list[bytes], list]:
    """Every request's replies and the coordinator's view of each result (or its refusal)."""
    federation, replies = recorded_federation({"x": site_x(deaths_in_cut), "y": site_y()})
    seen = []
    for options in REQUESTS:
        model = fedstats.KaplanMeier("time", "event", **options)
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                result = model.fit(federation)
        except fedstats.DisclosureError as refusal:
            seen.append(("refused", str(refusal)))
            continue
        record = result.to_record()
        seen.append(
            (
                result.horizons_,
                result.released_.to_numpy().tolist(),
                result.horizon_warnings,
                [str(w.message) for w in caught],
                {key: record[key] for key in sorted(record) if key != "ledger_heads"},
            )
        )
    return replies, seen


def test_the_count_in_a_cut_interval_is_not_learnt_from_any_request_or_its_horizon():
    one, nine = site_x(1), site_x(9)
    assert (one.event[one.time == 55.0].sum(), nine.event[nine.time == 55.0].sum()) == (1, K - 1)
    replies_one, seen_one = world(1)
    replies_nine, seen_nine = world(K - 1)
    assert len(replies_one) == len(replies_nine) >= 2 * (len(REQUESTS) - 1)
    assert replies_one == replies_nine  # every byte the coordinator receives
    assert seen_one == seen_nine  # and every horizon, release mark, warning and record
    # not a vacuous comparison: the cut is stated, and the crafted grid was refused
    assert [view[0] == "refused" for view in seen_one] == [False] * 6 + [True]
    (first, *_, crafted) = seen_one
    horizons, released, messages, _, _ = first
    assert horizons["x"] == {"all": 50.0} and horizons["y"]["all"] >= 50.0
    assert released == [[True]] * 5 + [[False]]
    assert len(messages) == 1 and "x at 50" in messages[0]
    assert crafted[0] == "refused" and "grid" in crafted[1]


@pytest.mark.parametrize("deaths_in_cut", [1, K - 1])
def test_the_stated_horizons_are_a_function_of_the_released_counts(deaths_in_cut):
    """The coordinator's horizons come from each reply's numbers at risk and truncation
    count (:func:`site_reach`), nothing else: recomputed from the replies, they agree."""
    federation, replies = recorded_federation({"x": site_x(deaths_in_cut), "y": site_y()})
    model = fedstats.KaplanMeier("time", "event", grid=GRID, group="arm", levels=["a", "b"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = model.fit(federation)
    assert len(replies) == 2
    for name, reply in zip(("x", "y"), replies, strict=True):
        released = codec.decode(reply)["result"]
        reach = site_reach(released["at_risk"], int(released["truncated"]))
        stated = [result.horizons_[name][level] for level in ("a", "b")]
        assert stated == [None if h < 0 else float(GRID[h]) for h in reach]
    # nothing per grid point leaves the coordinator's own computation: the record adds only
    # per-site horizons, the first time not released and the warnings
    record = result.to_record()
    assert set(record["horizons"]) == {"x", "y"}
    assert all(set(groups) == {"a", "b"} for groups in record["horizons"].values())
