"""A site's kept designs change nothing a coordinator sees: the same bytes, the same refusals.

A site keeps the designs it built across an analysis's rounds
(:mod:`fedstats.site.design_cache`). The attacks: make the site answer a request from a
design built for another (a key the coordinator can steer, or a short key two specs
share), skip a check by asking again what was refused, or outlast a round cap because the
design is already built; and make the site hold designs without bound. The oracles: a
fresh silo's reply to the same request, byte for byte, and the refusals of a site that
keeps nothing.
"""

from __future__ import annotations

import gc
import tracemalloc

import numpy as np
import pandas as pd
import pytest

import fedstats
from fedstats.contract import codec
from fedstats.contract.design import DesignSpec
from fedstats.errors import DisclosureError, from_wire
from fedstats.site import design_cache
from fedstats.site.design_cache import BoundedCache, footprint
from fedstats.site.handlers import cox as cox_site
from fedstats.site.handlers.design import build_design, site_design
from fedstats.site.silo import Silo


def frame(n: int = 400, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    data = pd.DataFrame(rng.normal(size=(n, 4)), columns=["a", "b", "c", "d"])
    data["y"] = (rng.random(n) < 1 / (1 + np.exp(-data["a"]))).astype(int)
    return data


def spec_of(formula: str, data: pd.DataFrame, **options) -> DesignSpec:
    federation = fedstats.Federation.in_process({"s": data, "t": data.copy()})
    return fedstats.LogisticRegression(formula, **options).agree(federation, "layout").spec


def summaries_request(spec: DesignSpec, beta: np.ndarray) -> bytes:
    args = {"design": spec.to_wire(), "beta": beta}
    return codec.encode({"task": "logistic.summaries", "args": args})


def refused(reply: bytes) -> Exception:
    """The typed error of an error reply (the coordinator's reading of it)."""
    message = codec.decode(reply)
    assert message["status"] == "error", message
    return from_wire(message["error"], "s")


def test_a_kept_design_answers_every_round_byte_for_byte_as_a_fresh_build():
    """Rounds answered from the kept design equal, byte for byte, the replies of silos
    that build the design afresh for each round; and the kept design is the fresh build,
    array by array."""
    data = frame()
    spec = spec_of("y ~ a + b + I(c ** 2) + log(abs(d) + 1)", data)
    keeping = Silo("s", data)
    rng = np.random.default_rng(1)
    for _ in range(4):
        beta = rng.normal(0, 0.3, len(spec.columns))
        kept = keeping.handle(summaries_request(spec, beta))
        fresh = Silo("s", data).handle(summaries_request(spec, beta))
        assert kept == fresh
        assert codec.decode(kept)["status"] == "ok"
    assert len(keeping._context.cache["designs"]) == 1
    cached = site_design(keeping._context, spec)
    rebuilt = build_design(Silo("s", data)._context, spec)
    for field in ("X", "y", "rows"):
        assert getattr(cached, field).tobytes() == getattr(rebuilt, field).tobytes()
        assert getattr(cached, field).dtype == getattr(rebuilt, field).dtype


def test_the_kept_designs_are_bounded_in_bytes_and_rebuilt_alike_when_dropped():
    data = frame()
    silo = Silo("s", data)
    formulas = ["y ~ a", "y ~ a + b", "y ~ a + b + c", "y ~ a + b + c + d"]
    specs = [spec_of(f, data) for f in formulas]
    sizes = [footprint(build_design(Silo("s", data)._context, s)) for s in specs]
    bound = sizes[2] + sizes[3]  # room for the last two designs, not three
    silo._context.cache["designs"] = cache = BoundedCache(bound)
    for spec in specs:
        beta = np.zeros(len(spec.columns))
        assert codec.decode(silo.handle(summaries_request(spec, beta)))["status"] == "ok"
        assert cache.nbytes <= bound
    assert len(cache) == 2 and cache.nbytes == sizes[2] + sizes[3]
    beta = np.full(len(specs[0].columns), 0.1)
    again = silo.handle(summaries_request(specs[0], beta))  # dropped: built again
    assert again == Silo("s", data).handle(summaries_request(specs[0], beta))
    assert cache.nbytes <= bound


def test_a_design_larger_than_the_bound_is_answered_and_not_kept():
    data = frame()
    spec = spec_of("y ~ a + b", data)
    silo = Silo("s", data)
    silo._context.cache["designs"] = cache = BoundedCache(1000)
    beta = np.array([0.1, 0.2, -0.3])
    for _ in range(2):
        assert silo.handle(summaries_request(spec, beta)) == Silo("s", data).handle(
            summaries_request(spec, beta)
        )
    assert len(cache) == 0 and cache.nbytes == 0


def test_specs_sharing_a_short_key_neither_share_a_design_nor_skip_its_checks(monkeypatch):
    """A coordinator that finds two specs whose 16-digit ``DesignSpec.key`` agree (a
    birthday search of 2^32 hashes) gets nothing from it: the site keeps designs, and
    remembers checked ones, under the whole SHA-256 of the spec. With every short key
    forced equal, a design with a one-patient indicator is still refused after an
    innocent design was answered and kept."""
    monkeypatch.setattr(DesignSpec, "key", property(lambda self: "0" * 16))
    data = frame()
    silo = Silo("s", data)
    innocent = spec_of("y ~ a + b", data)
    beta = np.zeros(len(innocent.columns))
    assert codec.decode(silo.handle(summaries_request(innocent, beta)))["status"] == "ok"
    one_patient = float(np.sort(data["c"].to_numpy())[-1])
    singling = spec_of("y ~ a + b", data)
    singling = DesignSpec.from_wire(
        {
            **singling.to_wire(),
            "formula": f"y ~ a + I(c >= {one_patient})",
            "variables": ["a", "c", "y"],
            "columns": ["Intercept", "a", f"I(c >= {one_patient})"],
        }
    )
    assert singling.key == innocent.key
    refusal = refused(silo.handle(summaries_request(singling, np.zeros(3))))
    assert isinstance(refusal, DisclosureError) and refusal.rule == "cells"
    assert len(silo._context.cache["designs"]) == 1  # the innocent design only


def test_a_refused_design_is_refused_again_and_a_kept_one_still_counts_its_rounds():
    data = frame()
    policy = fedstats.DisclosurePolicy(max_rounds_per_analysis=3)
    silo = Silo("s", data, policy=policy)
    spec = spec_of("y ~ a + b", data)
    for _ in range(3):
        reply = codec.decode(silo.handle(summaries_request(spec, np.zeros(3))))
        assert reply["status"] == "ok"
    refusal = refused(silo.handle(summaries_request(spec, np.zeros(3))))
    assert isinstance(refusal, DisclosureError) and refusal.rule == "rounds"

    x = np.sort(data["c"].to_numpy())
    fed = fedstats.Federation.in_process({"s": data})
    fedstats.LogisticRegression(f"y ~ I(c >= {x[200]})").fit(fed)  # answered and kept
    for _ in range(2):  # a threshold one patient away: refused, however often it is asked
        with pytest.raises(DisclosureError) as info:
            fedstats.LogisticRegression(f"y ~ I(c >= {x[201]})").fit(fed)
        assert info.value.rule == "differencing"


def test_a_design_counts_what_it_holds_and_the_default_bound_holds_a_large_one():
    """A kept design counts its own arrays, the row-major matrix once a round builds it,
    and not the frame's columns it reads; at 1,000,000 x 21 (a matrix of 168 MB, with the
    outcome and rows) a design fits the default bound, so its rounds are not rebuilt."""
    n = 20_000
    data = pd.DataFrame({c: v for c, v in frame(n).items()})  # each column contiguous
    spec = spec_of("y ~ a + b + c + d", data)
    silo = Silo("s", data)
    assert codec.decode(silo.handle(summaries_request(spec, np.zeros(5))))["status"] == "ok"
    cache = silo._context.cache["designs"]
    design = site_design(silo._context, spec)
    own = design.y.nbytes + design.rows.nbytes + 8 * n  # outcome, rows, the intercept column
    assert design.held_bytes == own == cache.nbytes  # a, b, c, d are the frame's arrays
    held = silo._context.frame  # the site's own copy (fedstats.site.frame_layout)
    assert all(np.shares_memory(design.columns[j + 1], held[v].to_numpy())
               for j, v in enumerate("abcd"))  # fmt: skip
    assert not any(np.shares_memory(held[v].to_numpy(), data[v].to_numpy()) for v in "abcd")
    matrix = design.X  # a Cox or fairness round builds the matrix
    assert site_design(silo._context, spec) is design
    assert cache.nbytes == own + matrix.nbytes  # measured again when read
    per_row = (own + matrix.nbytes / 5 * 21) / n  # the same design with 21 columns
    assert 1_000_000 * per_row < design_cache.DESIGN_CACHE_BYTES


def survival_frame(n: int = 300, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    data = pd.DataFrame(rng.normal(size=(n, 3)), columns=["a", "b", "c"])
    data["days"] = np.ceil(rng.exponential(100 / np.exp(0.3 * data["a"])))
    data["dead"] = rng.integers(0, 2, n)
    return data


def cox_args(formula: str, data: pd.DataFrame) -> dict:
    federation = fedstats.Federation.in_process({"s": data, "t": data.copy()})
    spec = fedstats.CoxPH(formula).agree(federation, "layout").spec
    return {"design": spec.to_wire(), "beta": np.full(spec.n_params, 0.1), "ties": "efron"}


def cox_request(args: dict) -> bytes:
    return codec.encode({"task": "cox.summaries", "args": args})


def test_a_cox_models_sorted_rows_are_bounded_and_rebuilt_alike_when_dropped():
    data = survival_frame()
    formulas = ["Surv(days, dead) ~ a", "Surv(days, dead) ~ a + b", "Surv(days, dead) ~ a + c"]
    requests = [cox_args(f, data) for f in formulas]
    sizes = [footprint(cox_site._sorted(Silo("s", data)._context, args)) for args in requests]
    bound = sizes[1] + sizes[2]  # room for the last two, not three
    silo = Silo("s", data)
    silo._context.cache["survival"] = cache = BoundedCache(bound)
    for args in requests:
        assert codec.decode(silo.handle(cox_request(args)))["status"] == "ok"
        assert cache.nbytes <= bound
    assert len(cache) == 2
    again = silo.handle(cox_request(requests[0]))  # dropped: sorted again
    assert again == Silo("s", data).handle(cox_request(requests[0]))
    assert cache.nbytes <= bound


def test_rows_sorted_for_a_private_round_never_answer_an_exact_one():
    """A Cox handler keeps its sorted rows under the design's own key, exact or private: a
    design built for a private round (which runs no cell rule and leaves out rows an exact
    round refuses for) is never what an exact round is answered from. The wire refuses a
    private ``cox.summaries`` before its handler today; the key must not rest on that. The
    oracle: a site that never built the design refuses the exact round."""
    data = survival_frame()
    x = np.sort(data["a"].to_numpy())
    innocent = cox_args(f"Surv(days, dead) ~ b + I(a >= {x[150]})", data)
    singling = {  # one patient above the threshold
        **innocent,
        "design": {
            **innocent["design"],
            "formula": f"Surv(days, dead) ~ b + I(a >= {x[-1]})",
            "columns": ["b", f"I(a >= {x[-1]})"],
        },
    }
    with pytest.raises(DisclosureError) as fresh:
        cox_site.summaries(Silo("s", data)._context, singling)
    assert fresh.value.rule == "cells"
    context = Silo("s", data)._context
    context.exact = False
    cox_site.summaries(context, singling)  # the private round's rows, sorted and kept
    context.exact = True
    with pytest.raises(DisclosureError) as info:
        cox_site.summaries(context, singling)
    assert info.value.rule == "cells"


@pytest.mark.parametrize(
    ("formula", "options"),
    [
        ("y ~ a + b", {}),  # the frame's own columns
        ("y ~ a * b", {}),  # formulaic's model matrix
        ("y ~ a + C(g)", {}),  # agreed levels
        ("y ~ a + b + c", {"missing": "drop"}),  # the rows left when incomplete ones drop
    ],
)
def test_a_design_counts_every_buffer_it_keeps_in_memory(formula, options):
    """The bound holds in bytes of memory, whatever the formula: a coordinator that asks
    for designs whose columns are views of a larger buffer (formulaic's model matrix, the
    complete rows) must not make each count less than it keeps. The oracle is tracemalloc
    (numpy reports its buffers to it): what dropping the built design frees."""
    n = 20_000
    data = frame(n)
    data["g"] = np.arange(n) % 3
    data.loc[::997, "c"] = np.nan
    spec = spec_of(formula, data, **options)
    context = Silo("s", data)._context
    gc.collect()
    tracemalloc.start()
    try:
        design = build_design(context, spec)
        gc.collect()
        kept = tracemalloc.get_traced_memory()[0]
        counted = design.held_bytes
        del design
        gc.collect()
        freed = kept - tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert freed > 8 * n  # at least the outcome
    assert abs(counted - freed) <= 8192  # a few Python objects, against 160,000 per column


def test_the_guard_remembers_its_own_copies_of_the_columns_a_design_reads():
    """A numeric design reads the frame's own column arrays (no copy is made to build it);
    what the differencing guard remembers of them must still be its own: values written
    into the frame's arrays afterwards change nothing it compares new requests against."""
    data = frame()
    silo = Silo("s", data)
    spec = spec_of("y ~ a + b", data)
    assert codec.decode(silo.handle(summaries_request(spec, np.zeros(3))))["status"] == "ok"
    guard = silo._context.guard
    remembered = [column.copy() for group in guard._answered.values() for column in group]
    assert len(remembered) == 2  # a and b
    data["a"].to_numpy()[:] = 0.0  # the frame's own array, edited in place
    data["b"].to_numpy()[:] = 0.0
    now = [column for group in guard._answered.values() for column in group]
    assert all(np.array_equal(a, b) for a, b in zip(remembered, now, strict=True))
    assert not any(np.shares_memory(c, data[v].to_numpy()) for c in now for v in ("a", "b"))
