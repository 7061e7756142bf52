"""In-process sites answering a round at once give the fits, replies and logs of sites asked
one after the other.

:class:`fedstats.in_process.SiteThreads` runs an exact statistical round at every
in-process site in worker threads. The oracle is the same federation with the threads off
(``site_threads = None``): every estimate bit for bit, every reply byte for byte (the
message inventory's sizes and statuses), and each site's own log in the same order.
Private rounds stay in the calling thread: a site's ledger is an SQLite connection of the
thread that opened it.
"""

from __future__ import annotations

import multiprocessing
import os
import threading

import numpy as np
import pandas as pd
import pytest

import fedstats
from fedstats import datasets
from fedstats.in_process import SiteThreads, answers_concurrently


def pair(frames, **options):
    threaded = fedstats.Federation.in_process(frames, **options)
    alone = fedstats.Federation.in_process(frames, **options)
    alone.site_threads = None
    assert threaded.site_threads is not None
    return threaded, alone


def same_messages(a: fedstats.Federation, b: fedstats.Federation) -> None:
    key = lambda r: (r.task, r.site, r.status, r.request_bytes, r.reply_bytes, r.reason)  # noqa: E731
    assert [key(r) for r in a.inventory.records()] == [key(r) for r in b.inventory.records()]
    for site in a.silos:
        logs = [[(e.task, e.status, e.reply_bytes) for e in f.silos[site].log] for f in (a, b)]
        assert logs[0] == logs[1]


def test_logistic_and_poisson_fits_equal_the_fits_of_sites_asked_in_turn():
    frames = datasets.synthetic_logistic(
        n_sites=4, n_per_site=[300, 800, 500, 650], n_covariates=3, seed=11
    )
    rng = np.random.default_rng(2)
    for frame in frames.values():  # before the sites start: each holds its own copy
        frame["visits"] = rng.poisson(np.exp(0.3 * frame["x1"]))
    threaded, alone = pair(frames)
    model = fedstats.LogisticRegression("y ~ x1 + x2 + x3")
    ours, theirs = model.fit(threaded), model.fit(alone)
    assert np.array_equal(ours.params, theirs.params) and np.array_equal(ours.bse, theirs.bse)
    glm = fedstats.GLM("visits ~ x1 + x2", family="poisson")
    ours, theirs = glm.fit(threaded), glm.fit(alone)
    assert np.array_equal(ours.params, theirs.params) and np.array_equal(ours.bse, theirs.bse)
    same_messages(threaded, alone)


def test_a_pooled_cox_fit_equals_the_fit_of_sites_asked_in_turn():
    rng = np.random.default_rng(4)
    frames = {}
    for s in range(3):
        n = 400
        x = rng.normal(size=n)
        t = np.ceil(rng.exponential(200 / np.exp(0.4 * x)))
        c = rng.uniform(20, 400, n)
        frames[f"s{s}"] = pd.DataFrame(
            {"x": x, "days": np.minimum(t, np.ceil(c)), "dead": (t <= c).astype(int)}
        )
    threaded, alone = pair(frames, disclosure=fedstats.DisclosurePolicy(min_count=1))
    grid = np.arange(1.0, 401.0)
    model = fedstats.CoxPH("Surv(days, dead) ~ x", strata=None, grid=grid)
    ours, theirs = model.fit(threaded), model.fit(alone)
    assert np.array_equal(ours.params, theirs.params) and np.array_equal(ours.bse, theirs.bse)
    same_messages(threaded, alone)


def test_refusals_are_the_same_at_threaded_sites():
    data = datasets.synthetic_logistic(n_sites=2, n_per_site=300, n_covariates=2, seed=3)
    threaded, alone = pair(data)
    x = np.sort(data["site01"]["x1"].to_numpy())
    fedstats.LogisticRegression(f"y ~ I(x1 >= {x[150]})").fit(threaded)
    fedstats.LogisticRegression(f"y ~ I(x1 >= {x[150]})").fit(alone)
    for federation in (threaded, alone):
        with pytest.raises(fedstats.errors.DisclosureError) as info:
            fedstats.LogisticRegression(f"y ~ I(x1 >= {x[151]})").fit(federation)
        assert info.value.rule == "differencing"
    same_messages(threaded, alone)


def test_only_exact_statistical_rounds_run_in_worker_threads():
    assert answers_concurrently("logistic.summaries", {"beta": [0.0]})
    assert not answers_concurrently("logistic.summaries", {"dp": {"noise": 1}})
    assert not answers_concurrently("glm.summaries", {"secagg": {"session": "s"}})
    assert not answers_concurrently("deep.train", {})
    assert not answers_concurrently("harmonize.fingerprint", {})


def test_a_site_answers_its_requests_one_at_a_time_in_order():
    seen: list[tuple[str, bytes, str]] = []
    lock = threading.Lock()
    busy: set[str] = set()

    def handler(site):
        def handle(request: bytes) -> bytes:
            with lock:
                assert site not in busy  # never two requests at one site at once
                busy.add(site)
            seen.append((site, request, threading.current_thread().name))
            with lock:
                busy.discard(site)
            return request[::-1]

        return handle

    sites = SiteThreads({s: handler(s) for s in ("a", "b", "c")})
    first, second = b"first round", b"second round"
    sites.start(["a", "b", "c"], first)
    sites.start(["a", "b"], second)  # the first round left unread: collected first
    assert sites.answer("a", second) == second[::-1]
    assert sites.answer("c", b"asked directly") == b"asked directly"[::-1]
    assert [r for s, r, _ in seen if s == "a"] == [first, second]
    assert [r for s, r, _ in seen if s == "c"] == [first, b"asked directly"]
    assert sites.answer("b", second) == second[::-1]


def _fit_in_child(frames, queue) -> None:
    federation = fedstats.Federation.in_process(frames)
    queue.put(fedstats.LogisticRegression("y ~ x1").fit(federation).params.to_numpy())


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_fits_with_threads_of_its_own():
    """The workers are threads of the process that started them; a child forked after a
    threaded fit starts its own instead of waiting on threads it does not have."""
    frames = datasets.synthetic_logistic(n_sites=2, n_per_site=300, n_covariates=1, seed=8)
    here = fedstats.LogisticRegression("y ~ x1").fit(fedstats.Federation.in_process(frames))
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    child = context.Process(target=_fit_in_child, args=(frames, queue))
    child.start()
    there = queue.get(timeout=120)
    child.join(timeout=60)
    assert child.exitcode == 0
    assert np.array_equal(there, here.params.to_numpy())
