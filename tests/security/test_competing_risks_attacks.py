"""Competing-risks requests reveal no small cell: the attacks a coordinator can make with
causes, grids and censoring weights, each refused or rendered harmless by the site.

* a rare cause: its per-point event counts would give a few patients' event times;
* differencing across causes: the competing count of one request (every other cause)
  minus the cause count of another leaves a third cause's events;
* differencing across grids: a second grid against the first;
* crafted censoring weights: a ``G`` with a spike (or outside ``(0, 1]``) to make a few
  patients dominate the Fine–Gray weighted sums;
* status codes that are not non-negative integers, and causes that are not positive integers.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fedstats
from fedstats.contract import codec
from fedstats.contract.fine_gray import COMPETING_FIELDS
from fedstats.errors import StatusCodeError, StudyConfigurationError
from fedstats.site.handlers import competing, fine_gray
from fedstats.site.protocol import Protocol
from fedstats.site.silo import Silo

K = 5
POLICY = fedstats.DisclosurePolicy(min_count=K, k_cell=K)


def ask(silo: Silo, task: str, args: dict) -> dict:
    return codec.decode(silo.handle(codec.encode({"task": task, "args": args})))


def counts_args(grid, cause: int, group=None, levels=None) -> dict:
    args = {"time": "t", "event": "status", "cause": cause, "group": group,
            "grid": np.asarray(grid, dtype=float)}  # fmt: skip
    if group is not None:
        args["levels"] = levels
    return args


def cohort(seed: int = 0, n: int = 300, rare: int = 6) -> pd.DataFrame:
    """Causes 1 and 2 common; cause 3 for ``rare`` patients (at least ``k`` in total, so the
    code passes the cell rule) whose event times are spread out: each grid interval holds
    fewer than ``k`` of them."""
    rng = np.random.default_rng(seed)
    time = rng.uniform(0.0, 100.0, n)
    status = rng.choice([0, 1, 2], n, p=[0.4, 0.35, 0.25])
    status[:rare] = 3
    time[:rare] = np.linspace(12.0, 88.0, rare)
    return pd.DataFrame({"t": time, "status": status, "arm": rng.choice(["a", "b"], n)})


def released_cells(reply: dict) -> list[np.ndarray]:
    """Every count a reply releases or gives by difference: at risk, events, competing events,
    and censorings (``n_j - n_{j+1} - d_j - c_j``)."""
    result = reply["result"]
    at_risk, events, other = result["at_risk"], result["events"], result["competing"]
    after = np.concatenate([at_risk[:, 1:], np.zeros((len(at_risk), 1))], axis=1)
    return [at_risk, events, other, at_risk - after - events - other]


def small(values: np.ndarray) -> bool:
    return bool(((values > 0) & (values < K)).any())


def test_a_rare_cause_gives_no_event_time_and_no_difference_across_causes():
    """Cause 3 holds 1 event per interval: no request, for any cause, releases a cell of 1 to
    ``k - 1`` patients, and cause 1's competing count minus cause 2's events (cause 3's events)
    holds 0 or at least ``k`` patients at every grid point."""
    silo = Silo("site", cohort(), policy=POLICY)
    grid = np.arange(10.0, 101.0, 10.0)
    replies = {c: ask(silo, competing.TASK, counts_args(grid, c)) for c in (1, 2, 3)}
    assert all(r["status"] == "ok" for r in replies.values())
    for reply in replies.values():
        assert not any(small(cell) for cell in released_cells(reply))
    third = replies[1]["result"]["competing"] - replies[2]["result"]["events"]
    assert not small(third)
    assert not replies[3]["result"]["events"].any()  # cause 3 never released
    # the curves end before the first interval holding 1 to k - 1 events of cause 3
    assert not replies[1]["result"]["at_risk"][0, 1:].any()


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 10_000),
    width=st.sampled_from([5.0, 10.0, 25.0]),
    rare=st.integers(5, 20),
    grouped=st.booleans(),
)
def test_no_request_releases_a_small_cell(seed, width, rare, grouped):
    """Any cohort, grid and cause, grouped or not: every released count and every difference
    across causes is 0 or at least ``k``."""
    frame = cohort(seed=seed, rare=rare)
    silo = Silo("site", frame, policy=POLICY)
    grid = np.arange(width, 100.0 + width, width)
    group, levels = ("arm", ["a", "b"]) if grouped else (None, None)
    replies = {c: ask(silo, competing.TASK, counts_args(grid, c, group, levels)) for c in (1, 2, 3)}
    for reply in replies.values():
        assert reply["status"] == "ok"
        assert not any(small(cell) for cell in released_cells(reply))
    for a in (1, 2, 3):
        for b in (1, 2, 3):
            if a != b:
                assert not small(replies[a]["result"]["competing"] - replies[b]["result"]["events"])


def test_a_cause_on_fewer_than_k_patients_is_refused():
    frame = cohort(rare=3)
    reply = ask(Silo("site", frame, policy=POLICY), competing.TASK, counts_args([50.0, 100.0], 1))
    assert reply["status"] == "error"
    assert reply["error"]["type"] == "DisclosureError"
    assert reply["error"]["values"]["rule"] == "cells"


def test_a_second_grid_is_refused():
    silo = Silo("site", cohort(), policy=POLICY)
    assert ask(silo, competing.TASK, counts_args([50.0, 100.0], 1))["status"] == "ok"
    shifted = ask(silo, competing.TASK, counts_args([49.0, 100.0], 2))
    assert shifted["status"] == "error"
    assert shifted["error"]["values"]["rule"] == "grid"
    prefix = ask(silo, competing.TASK, counts_args([50.0], 2))
    assert prefix["status"] == "ok"


def fine_gray_args(censoring: np.ndarray, grid: np.ndarray, frame: pd.DataFrame) -> dict:
    spec = fedstats.FineGray("Surv(t, status) ~ x", cause=1, grid=grid)
    fed = fedstats.Federation.in_process({"site": frame}, disclosure=POLICY)
    design = spec.agree(fed, "probe").to_wire()
    return {"design": design, "cause": 1, "beta": np.zeros(1), "grid": grid,
            "censoring": censoring}  # fmt: skip


@pytest.mark.parametrize(
    "censoring",
    [
        np.array([1.0, 0.9, 1.0, 0.5]),  # a spike: one interval's competitors weigh more
        np.array([1.0, 0.9, 0.8, 0.0]),  # zero: infinite weights after it
        np.array([1.2, 1.1, 1.0, 0.9]),  # above 1: weights above 1
        np.array([1.0, np.nan, 0.8, 0.7]),
        np.array([1.0, 0.9, 0.8, -0.1]),
    ],
)
def test_crafted_censoring_weights_are_refused(censoring):
    frame = cohort().assign(x=np.random.default_rng(1).normal(size=300))
    frame["status"] = np.minimum(frame["status"], 2)
    grid = np.array([25.0, 50.0, 75.0, 100.0])
    silo = Silo("site", frame, policy=POLICY)
    reply = ask(silo, fine_gray.TASK, fine_gray_args(censoring, grid, frame))
    assert reply["status"] == "error"
    assert reply["error"]["type"] == "DisclosureError"
    assert "censoring weights" in reply["error"]["values"]["reason"]
    honest = ask(silo, fine_gray.TASK, fine_gray_args(np.array([1.0, 0.9, 0.8, 0.5]), grid, frame))
    assert honest["status"] == "ok"


def test_censoring_weights_of_the_wrong_length_are_malformed():
    frame = cohort().assign(x=np.random.default_rng(1).normal(size=300))
    frame["status"] = np.minimum(frame["status"], 2)
    grid = np.array([25.0, 50.0, 75.0, 100.0])
    reply = ask(Silo("site", frame, policy=POLICY), fine_gray.TASK,
                fine_gray_args(np.ones(3), grid, frame))  # fmt: skip
    assert reply["error"]["type"] == "MalformedRequestError"


def test_fine_gray_weights_never_exceed_one_so_no_patient_dominates_a_risk_set():
    """With a valid ``G`` every weight is in (0, 1] and each released risk set holds at least
    ``k`` patients of weight 1: at ``beta = 0``, ``S0_j >= at_risk_j >= k`` wherever released,
    and ``S0_j - at_risk_j`` (the competitors' weights) is at most their number."""
    frame = cohort().assign(x=np.random.default_rng(1).normal(size=300))
    frame["status"] = np.minimum(frame["status"], 2)
    grid = np.array([25.0, 50.0, 75.0, 100.0])
    cliff = np.array([1.0, 1e-9, 1e-9, 1e-9])
    reply = ask(Silo("site", frame, policy=POLICY), fine_gray.TASK,
                fine_gray_args(cliff, grid, frame))  # fmt: skip
    result = reply["result"]
    released = result["at_risk"] > 0
    assert (result["at_risk"][released] >= K).all()
    competitors_before = np.concatenate([[0.0], np.cumsum(result["competing"])[:-1]])
    extra = result["S0"] - result["at_risk"]
    assert (extra >= 0).all() and (extra <= competitors_before + 1e-12).all()


@pytest.mark.parametrize("bad", [-1, 1.5, "two"])
def test_status_codes_that_are_not_non_negative_integers_are_refused(bad):
    frame = cohort()
    frame["status"] = frame["status"].astype(object)
    frame.loc[:6, "status"] = bad
    reply = ask(Silo("site", frame, policy=POLICY), competing.TASK, counts_args([100.0], 1))
    assert reply["error"]["type"] == "StatusCodeError"
    assert reply["error"]["values"]["column"] == "status"
    assert reply["error"]["values"]["count"] == 7
    error = StatusCodeError(site="site", column="status", count=7)
    assert "'site'" in str(error) and "'status'" in str(error) and "7" in str(error)


@pytest.mark.parametrize("cause", [0, -2, True, "1", 1.0])
def test_the_cause_must_be_a_positive_integer(cause):
    with pytest.raises(StudyConfigurationError, match="positive integer"):
        fedstats.CumulativeIncidence("t", "status", cause=cause, grid=[1.0])
    with pytest.raises(StudyConfigurationError, match="positive integer"):
        fedstats.FineGray("Surv(t, status) ~ x", cause=cause, grid=[1.0])
    reply = ask(Silo("site", cohort(), policy=POLICY), competing.TASK,
                counts_args([100.0], 1) | {"cause": cause})  # fmt: skip
    assert reply["error"]["type"] == "MalformedRequestError"


def test_a_protocol_admits_only_its_competing_risks_analyses():
    protocol = Protocol.from_mapping(
        {
            "title": "competing risks",
            "analysis": [
                {
                    "name": "incidence",
                    "model": "cumulative_incidence",
                    "outcome": "Surv(t, status)",
                    "time_grid": [50.0, 100.0],
                },
            ],
        }
    )
    silo = Silo("site", cohort(), policy=POLICY, protocol=protocol)
    assert ask(silo, competing.TASK, counts_args([50.0, 100.0], 1))["status"] == "ok"
    grouped = ask(silo, competing.TASK, counts_args([50.0, 100.0], 1, "arm", ["a", "b"]))
    assert grouped["error"]["type"] == "ProtocolError"
    other_grid = ask(silo, competing.TASK, counts_args([40.0, 100.0], 1))
    assert other_grid["error"]["values"]["rule"] == "grid"


@pytest.mark.parametrize(
    ("hazard", "means"),
    [
        (np.array([0.1, -0.1, 0.1, 0.1]), np.zeros((4, 1))),  # a negative increment
        (np.array([0.1, np.inf, 0.1, 0.1]), np.zeros((4, 1))),
        (np.full(4, 0.1), np.full((4, 1), np.nan)),
        (np.full(4, 0.1), np.zeros((4, 2))),  # another design's size
    ],
)
def test_crafted_robust_variance_inputs_are_refused(hazard, means):
    frame = cohort().assign(x=np.random.default_rng(1).normal(size=300))
    frame["status"] = np.minimum(frame["status"], 2)
    grid = np.array([25.0, 50.0, 75.0, 100.0])
    args = fine_gray_args(np.array([1.0, 0.9, 0.8, 0.5]), grid, frame)
    silo = Silo("site", frame, policy=POLICY)
    reply = ask(silo, fine_gray.ROBUST_TASK, args | {"hazard": hazard, "means": means})
    assert reply["error"]["type"] == "MalformedRequestError"
    honest = ask(silo, fine_gray.ROBUST_TASK, args | {"hazard": np.full(4, 0.1),
                                                     "means": np.zeros((4, 1))})  # fmt: skip
    assert honest["status"] == "ok" and honest["result"]["meat"].shape == (1, 1)


def test_fine_gray_refuses_a_cause_on_fewer_than_k_patients():
    """The competing causes are cells too: a cause held by 3 patients is refused even when
    another cause is modelled (its rows would otherwise follow from the weighted sums)."""
    frame = cohort(rare=3).assign(x=np.random.default_rng(1).normal(size=300))
    grid = np.array([25.0, 50.0, 75.0, 100.0])
    open_frame = frame.assign(status=np.minimum(frame["status"], 2))
    args = fine_gray_args(np.ones(4), grid, open_frame)
    reply = ask(Silo("site", frame, policy=POLICY), fine_gray.TASK, args)
    assert reply["error"]["type"] == "DisclosureError"
    assert reply["error"]["values"]["rule"] == "cells"


def test_a_protocol_admits_only_its_fine_gray_terms():
    frame = cohort().assign(x=np.random.default_rng(1).normal(size=300))
    frame["status"] = np.minimum(frame["status"], 2)
    frame["z"] = np.random.default_rng(2).normal(size=300)
    protocol = Protocol.from_mapping(
        {
            "title": "competing risks",
            "analysis": [
                {
                    "name": "relapse",
                    "model": "fine_gray",
                    "formula": "Surv(t, status) ~ x",
                    "time_grid": [25.0, 50.0, 75.0, 100.0],
                },
            ],
        }
    )
    fed = fedstats.Federation.in_process(
        {"site": frame}, disclosure=POLICY, protocols={"site": protocol}
    )
    grid = [25.0, 50.0, 75.0, 100.0]
    result = fedstats.FineGray("Surv(t, status) ~ x", cause=1, grid=grid).fit(fed)
    assert result.converged
    with pytest.raises(fedstats.errors.ProtocolError, match="'z'"):
        fedstats.FineGray("Surv(t, status) ~ x + z", cause=1, grid=grid).fit(fed)


# ------------------------------------------------------------------ cmprsk::crr's convention


def crr_args(censoring: np.ndarray, grid: np.ndarray, frame: pd.DataFrame) -> dict:
    """A Fine–Gray request of ``cmprsk::crr``'s convention (Breslow's ties)."""
    return fine_gray_args(censoring, grid, frame) | {"convention": "crr", "ties": "breslow"}


def crr_cohort(seed: int = 0) -> pd.DataFrame:
    frame = cohort(seed=seed).assign(x=np.random.default_rng(seed + 1).normal(size=300))
    frame["status"] = np.minimum(frame["status"], 2)
    return frame


CRR_GRID = np.array([25.0, 50.0, 75.0, 100.0])
HONEST_G = np.array([1.0, 0.9, 0.8, 0.5])


def crr_robust(term: np.ndarray, hazard: np.ndarray) -> dict:
    """A ``"crr"`` robust request's inputs: increments and means, and the censoring term."""
    return {"hazard": np.full(4, 0.1), "means": np.zeros((4, 1)),
            "censoring_term": term, "censoring_hazard": hazard}  # fmt: skip


@pytest.mark.parametrize(
    "censoring",
    [
        np.array([1.0, 0.9, 1.0, 0.5]),
        np.array([1.0, 0.9, 0.8, 0.0]),
        np.array([1.2, 1.1, 1.0, 0.9]),
    ],
)
def test_crafted_censoring_weights_are_refused_under_the_crr_convention(censoring):
    """The censoring curve of a ``"crr"`` request passes the same check as any other."""
    frame = crr_cohort()
    silo = Silo("site", frame, policy=POLICY)
    reply = ask(silo, fine_gray.TASK, crr_args(censoring, CRR_GRID, frame))
    assert reply["error"]["type"] == "DisclosureError"
    assert "censoring weights" in reply["error"]["values"]["reason"]
    honest = ask(silo, fine_gray.TASK, crr_args(HONEST_G, CRR_GRID, frame))
    assert honest["status"] == "ok"
    assert set(COMPETING_FIELDS) <= set(honest["result"])


@pytest.mark.parametrize(
    ("inputs", "convention"),
    [
        (crr_robust(np.zeros((4, 1)), np.array([0.1, 1.5, 0.1, 0.1])), "crr"),  # above 1
        (crr_robust(np.zeros((4, 1)), np.array([0.1, -0.1, 0.1, 0.1])), "crr"),
        (crr_robust(np.full((4, 1), np.inf), np.full(4, 0.1)), "crr"),
        (crr_robust(np.zeros((4, 2)), np.full(4, 0.1)), "crr"),  # another design's size
        (crr_robust(np.zeros((3, 1)), np.full(3, 0.1)), "crr"),  # another grid's length
        ({"hazard": np.full(4, 0.1), "means": np.zeros((4, 1))}, "crr"),  # term missing
        (crr_robust(np.zeros((4, 1)), np.full(4, 0.1)), "finegray"),  # not its convention
    ],
)
def test_crafted_crr_variance_inputs_are_refused(inputs, convention):
    frame = crr_cohort()
    silo = Silo("site", frame, policy=POLICY)
    args = crr_args(HONEST_G, CRR_GRID, frame) if convention == "crr" else (
        fine_gray_args(HONEST_G, CRR_GRID, frame))  # fmt: skip
    reply = ask(silo, fine_gray.ROBUST_TASK, args | inputs)
    assert reply["error"]["type"] == "MalformedRequestError"
    honest_inputs = crr_robust(np.ones((4, 1)), np.full(4, 0.1))
    honest = ask(silo, fine_gray.ROBUST_TASK, crr_args(HONEST_G, CRR_GRID, frame) | honest_inputs)
    assert honest["status"] == "ok" and honest["result"]["meat"].shape == (1, 1)


def test_a_crr_request_with_efron_ties_or_an_unknown_convention_is_malformed():
    frame = crr_cohort()
    silo = Silo("site", frame, policy=POLICY)
    for changed in ({"ties": "efron"}, {"convention": "cmprsk"}, {"convention": 1}):
        reply = ask(silo, fine_gray.TASK, crr_args(HONEST_G, CRR_GRID, frame) | changed)
        assert reply["error"]["type"] == "MalformedRequestError"


def swapped_within_cells(frame: pd.DataFrame, grid: np.ndarray) -> pd.DataFrame:
    """``frame`` with the covariate of two patients swapped in every (grid point, status) cell
    that holds two: the same cells, each holding the same values, but not on the same
    patients, nor at the same raw times."""
    point = np.searchsorted(grid, frame["t"].to_numpy(), side="left")
    swapped = frame.copy()
    for _, rows in frame.groupby([point, frame["status"].to_numpy()]).groups.items():
        if len(rows) >= 2:
            a, b = rows[0], rows[-1]
            swapped.loc[[a, b], "x"] = frame.loc[[b, a], "x"].to_numpy()
    assert not swapped["x"].equals(frame["x"])
    return swapped


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    beta=st.floats(-3, 3),
    drops=st.lists(st.floats(0.0, 0.5), min_size=4, max_size=4),
    term=st.lists(st.floats(-1e3, 1e3), min_size=4, max_size=4),
    hazard=st.lists(st.floats(0.0, 1.0), min_size=4, max_size=4),
    seed=st.integers(0, 1000),
)
def test_crafted_crr_inputs_cannot_tell_apart_patients_of_one_cell(beta, drops, term, hazard, seed):
    """The attack: a malicious coordinator crafts ``beta``, the censoring curve, the censoring
    term ``q(u)/n_u`` and hazard ``c_u/n_u`` of a ``"crr"`` request (any values the site's
    checks let through) to make the competing events' sums or the robust variance's
    cross-products isolate one patient. Every patient enters them only through their grid
    point and status, so the replies stay the same when two patients of each (point, status)
    cell swap covariates: no crafted input singles out a patient within a cell, and every
    cell holds 0 or at least ``k`` patients (the horizon rule)."""
    frame = crr_cohort(seed)
    swapped = swapped_within_cells(frame, CRR_GRID)
    G = np.cumprod(1 - np.asarray(drops))
    G = np.maximum(G, 1e-3)
    inputs = crr_robust(np.asarray(term).reshape(4, 1), np.asarray(hazard))
    replies = []
    for rows in (frame, swapped):
        silo = Silo("site", rows, policy=POLICY)
        args = crr_args(G, CRR_GRID, rows) | {"beta": np.array([beta])}
        summaries = ask(silo, fine_gray.TASK, args)
        robust = ask(silo, fine_gray.ROBUST_TASK, args | inputs)
        assert summaries["status"] == "ok" and robust["status"] == "ok"
        replies.append((summaries["result"], robust["result"]["meat"]))
    (first, meat), (second, swapped_meat) = replies
    for field in (*COMPETING_FIELDS, "S0", "S1"):
        np.testing.assert_allclose(first[field], second[field], rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(meat, swapped_meat, rtol=1e-10, atol=1e-9)
    released = first["competing_S0"] != 0
    assert (first["competing"][released] >= K).all()
