"""SecAgg+ at 30 sites: exact fits equal the plain ones, private releases survive dropouts, and
each site is sent only what is addressed to it (both constructions)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

import accounting
import fedstats
from fedstats.contract import codec
from fedstats.contract.secagg_session import SEALED_BYTES
from fedstats.models.secure_aggregation import SecureAggregation, secure_sum
from fedstats.secagg import graph
from fedstats.secagg import ring as secagg_ring
from tests.fedstats.test_secure_aggregation import frames, summaries_args

SITES = 30


def survival_frames(n_sites: int, n: int = 120, seed: int = 5) -> dict[str, pd.DataFrame]:
    """Exponential event times with hazard ``exp(0.5 x1 - 0.4 x2)`` and uniform censoring."""
    rng = np.random.default_rng(seed)
    out = {}
    for i in range(n_sites):
        x1, x2 = rng.normal(size=n), rng.integers(0, 2, size=n)
        event_time = rng.exponential(1 / np.exp(0.5 * x1 - 0.4 * x2 - 0.1 * (i % 3)))
        censor = rng.uniform(0.5, 3.0, size=n)
        out[f"site{i:02d}"] = pd.DataFrame(
            {
                "time": np.round(np.minimum(event_time, censor), 3) + 0.001,
                "event": (event_time <= censor).astype(int),
                "x1": x1,
                "x2": x2,
            }
        )
    return out


def test_exact_logistic_and_cox_fits_over_secagg_plus_equal_the_plain_fits_at_30_sites():
    """30 sites, every one in every round (``t = n``): a ring of 6 neighbours per site, 5 of
    7 holders to unmask. The fits over SecAgg+ equal the fits in the clear to 1e-8 (replies
    rounded to multiples of 2^-32), on verified paths, in as many rounds."""
    options = SecureAggregation()
    shape = options.neighbourhood_for(SITES)
    assert (shape.degree, shape.share_threshold, shape.complete) == (6, 5, False)

    data = frames(SITES, n=150)
    model = fedstats.LogisticRegression("y ~ x1 + x2")
    plain = model.fit(fedstats.Federation.in_process(data))
    fed = fedstats.Federation.in_process(data)
    hidden = model.fit(fed, secure_aggregation=options)
    np.testing.assert_allclose(hidden.params, plain.params, rtol=0, atol=1e-8)
    np.testing.assert_allclose(hidden.bse, plain.bse, rtol=0, atol=1e-8)
    assert hidden.iterations == plain.iterations
    answers = [r for r in fed.inventory.records() if r.task == "logistic.summaries"]
    assert {r.path for r in answers} == {"verified"}
    assert any("SecAgg+, 6 neighbours" in note for note in hidden.notes)

    survival = survival_frames(SITES)
    formula = "Surv(time, event) ~ x1 + x2"
    for cox in (
        fedstats.CoxPH(formula, strata="site"),
        fedstats.CoxPH(formula, strata=None, width=0.25, horizon=3.0),
    ):
        clear = cox.fit(fedstats.Federation.in_process(survival))
        masked = cox.fit(fedstats.Federation.in_process(survival), secure_aggregation=options)
        np.testing.assert_allclose(masked.params, clear.params, rtol=0, atol=1e-8)
        np.testing.assert_allclose(masked.bse, clear.bse, rtol=0, atol=1e-8)


def ledgers(tmp_path, sites, epsilon=1e6) -> dict[str, accounting.Ledger]:
    out = {}
    for s in sites:
        ledger = accounting.Ledger(tmp_path / f"{s}.ledger")
        scope = accounting.Scope(unit="patient", owner=s, study="study")
        ledger.set_budget(scope, epsilon=epsilon, delta=1e-5)
        out[s] = ledger
    return out


class LostAtMaskedRound:
    """A transport whose site goes away instead of sending its masked reply."""

    def __init__(self, handle) -> None:
        self.handle = handle

    def __call__(self, request: bytes) -> bytes:
        if "secagg" in codec.decode(request)["args"]:
            raise ConnectionError("site went away")
        return self.handle(request)


def test_a_private_release_over_secagg_plus_survives_dropouts_within_the_tolerated_fraction(
    tmp_path,
):
    """30 sites at ``t = 27`` (10 neighbours each, 7 of 11 holders to unmask); 3 sites drop
    out after the keys are shared, the most ``t`` tolerates. The released sum is the
    survivors' clipped gradient plus noise whose standard deviation is
    ``sigma * Delta * sqrt(27 / 27)``: each survivor added ``1/sqrt(t)`` of it (over 40
    releases, within 15 %). The dropped sites' ledgers are charged nothing."""
    data = frames(SITES)
    base = fedstats.Federation.in_process(
        data, ledgers=ledgers(tmp_path, data), verified_paths=False
    )
    lost = ["site3", "site14", "site25"]
    transports = {
        s: LostAtMaskedRound(silo.handle) if s in lost else silo.handle
        for s, silo in base.silos.items()
    }
    fed = fedstats.Federation(transports)
    fed.silos = base.silos
    args = summaries_args(base)
    sigma, row_norm = 2.0, 2.0
    private = {
        **args,
        "clip": {"row_norm": row_norm, "scaling": np.tile([0.0, 1.0], (3, 1))},
        "release": "gradient",
    }
    survivors = [s for s in base.sites if s not in lost]
    clear = base.request("logistic.summaries", private, analysis="clear", sites=survivors)
    exact = sum(r["gradient"] for r in clear.values())
    dp = {"noise_multipliers": {"gradient": sigma}, "study": "study", "analysis": "a", "note": ""}
    options = SecureAggregation(threshold=27)
    assert options.neighbourhood_for(SITES) == graph.Neighbourhood(10, 7, False)
    draws = []
    for _ in range(40):
        summed = secure_sum(
            fed, "logistic.summaries", {**private, "dp": dp}, analysis="dp", options=options
        )
        assert list(summed.survivors) == survivors and set(summed.dropped) == set(lost)
        draws.append(summed.total["gradient"] - exact)
    noise = np.array(draws).ravel()
    inflated = row_norm + math.sqrt(3) * secagg_ring.resolution(32) / 2
    assert noise.std() == pytest.approx(sigma * inflated * math.sqrt(27 / 27), rel=0.15)
    for site in lost:
        scope = accounting.Scope(unit="patient", owner=site, study="study")
        assert base.silos[site].ledger.entries(scope) == []
    scope = accounting.Scope(unit="patient", owner="site0", study="study")
    entry = base.silos["site0"].ledger.entries(scope)[-1]
    assert entry.parameters["secure_aggregation_threshold"] == 27
    assert entry.parameters["secure_aggregation_roster"] == "pinned"


class Recording:
    """A transport that keeps every request its site is sent."""

    def __init__(self, handle) -> None:
        self.handle, self.seen = handle, []

    def __call__(self, request: bytes) -> bytes:
        self.seen.append(codec.decode(request))
        return self.handle(request)


@pytest.mark.parametrize(("construction", "degree"), [("secagg+", 4), ("secagg", 11)])
def test_each_site_is_sent_only_what_is_addressed_to_it(construction, degree):
    """At 12 sites: each site receives the signed keys of its neighbours and of the site that
    seeds the graph, and, in the masked round, one sealed share pair from each neighbour —
    never another site's shares, never the n x n matrix (which the complete graph of the
    classic construction also no longer sends)."""
    base = fedstats.Federation.in_process(frames(12), verified_paths=False)
    recorders = {s: Recording(silo.handle) for s, silo in base.silos.items()}
    fed = fedstats.Federation(recorders)
    fed.silos = base.silos
    options = SecureAggregation(construction=construction)
    secure_sum(fed, "logistic.summaries", summaries_args(base), analysis="sa", options=options)
    for site, recorder in recorders.items():
        asked = {m["task"]: m["args"] for m in recorder.seen}
        neighbours = asked["secagg.share"]["neighbours"]["sites"]
        assert len(neighbours) == degree and site not in neighbours
        assert asked["secagg.share"]["contributor"]["sites"] == ["site0"]
        assert asked["logistic.summaries"]["secagg"]["sealed"].shape == (degree, SEALED_BYTES)
        assert asked["secagg.unmask"]["holders"] == degree + 1
    pairs = {
        (s, v)
        for s, r in recorders.items()
        for m in r.seen
        if m["task"] == "secagg.share"
        for v in m["args"]["neighbours"]["sites"]
    }
    assert all((v, s) in pairs for s, v in pairs)  # the neighbour relation is symmetric


def bell_conditions(n: int, t: int, k: int, t_k: int) -> bool:
    """The graph conditions of fedstats.secagg.graph, evaluated with scipy's hypergeometric
    distribution (an independent implementation of the tails)."""
    from scipy.stats import hypergeom

    colluders = math.ceil(n / 20)
    return (
        t_k >= k // 2 + 2
        and n * hypergeom(n - 1, n - t, k).sf(k - t_k) <= 2.0**-30  # random dropouts
        and n * hypergeom(n - 1, colluders, k).sf(t_k - 1) <= 2.0**-40  # colluding holders
        and n * hypergeom(n, colluders, k // 2).sf(k // 2 - 1) <= 2.0**-40  # a cut ring
    )


@pytest.mark.parametrize(
    ("n", "t"), [(10, 10), (30, 30), (30, 27), (50, 45), (100, 100), (100, 90), (256, 240)]
)
def test_the_degree_is_the_least_meeting_bell_et_als_conditions(n, t):
    """``k`` and ``t_k`` meet the conditions (checked with scipy), and no smaller even degree
    meets them with any threshold; the degree grows slowly with n."""
    shape = graph.neighbourhood(n, t)
    assert not shape.complete
    assert bell_conditions(n, t, shape.degree, shape.share_threshold)
    for k in range(graph.LEAST_DEGREE, shape.degree, 2):
        assert not any(bell_conditions(n, t, k, t_k) for t_k in range(k // 2 + 2, k + 1))


def test_many_tolerated_dropouts_or_few_sites_give_the_complete_graph():
    for n, t in [(8, 8), (20, 16), (100, 51), (30, 16)]:
        shape = graph.neighbourhood(n, t)
        assert shape.complete and shape == graph.Neighbourhood(n - 1, t, True)
    sizes = [graph.neighbourhood(n, n).degree for n in (10, 30, 100, 200, 256)]
    assert sizes == sorted(sizes) and sizes[-1] <= 20  # logarithmic, not linear, growth


class Garbling:
    """A transport whose site answers one task with a field of the declared shape but not
    bytes (floats): a reply the schema passes and the protocol must still refuse."""

    def __init__(self, handle, task: str, field: str) -> None:
        self.handle, self.task, self.field = handle, task, field

    def __call__(self, request: bytes) -> bytes:
        reply = self.handle(request)
        if codec.decode(request)["task"] != self.task:
            return reply
        message = codec.decode(reply)
        value = message["result"][self.field]
        message["result"][self.field] = value.astype(np.float64)
        return codec.encode(message)


@pytest.mark.parametrize(
    ("task", "field", "survivors"),
    [
        ("secagg.advertise", "keys", 19),  # the session starts over without it
        ("secagg.share", "sealed", 19),
        ("secagg.confirm", "signature", 20),  # still a survivor: its reply is in the sum
        ("secagg.unmask", "shares", 20),
    ],
)
def test_a_malformed_protocol_reply_counts_its_site_as_dropped(task, field, survivors):
    base = fedstats.Federation.in_process(frames(20), verified_paths=False)
    transports = {s: silo.handle for s, silo in base.silos.items()}
    transports["site7"] = Garbling(transports["site7"], task, field)
    fed = fedstats.Federation(transports)
    fed.silos = base.silos
    args = summaries_args(base)
    options = SecureAggregation(threshold=18)
    summed = secure_sum(fed, "logistic.summaries", args, analysis="sa", options=options)
    assert list(summed.dropped) == ["site7"] and "malformed" in summed.dropped["site7"]
    assert len(summed.survivors) == survivors
    clear = base.request("logistic.summaries", args, analysis="c", sites=list(summed.survivors))
    expected = sum(r["gradient"] for r in clear.values())
    np.testing.assert_allclose(summed.total["gradient"], expected, rtol=0, atol=1e-7)
