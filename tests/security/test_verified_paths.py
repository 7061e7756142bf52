"""A coordinator that cannot steer an exact logistic regression: verified paths.

The attack (Huth et al., *Bioinformatics* 2022, multi-step inferential
disclosure): with ``||beta||`` huge, ``mu = expit(x' beta)`` is the indicator
of a half-space, and the score ``X'(y - mu)`` of an exact round sums rows over
it; two half-spaces that differ by one patient give that patient's row. Sites
with verified paths (:mod:`fedstats.site.verified_paths`) answer only at the
start or at the step the previous round's signed replies lead to, so every
crafted point is refused with rule ``path``, through the public API and
through raw requests; relayed replies that are tampered with, unsigned, of a
site off the roster, or missing are refused; an honest fit takes the same
rounds and gives the same numbers.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from lifelines.datasets import load_rossi

import fedstats
from fedstats import datasets
from fedstats.contract import codec
from fedstats.contract.fine_gray import (
    COUNT_FIELDS,
    censoring_from_counts,
    relayed_fields,
    relayed_inputs,
    robust_inputs,
)
from fedstats.contract.path_rules import FAIR_PATH
from fedstats.contract.paths import (
    FINE_GRAY_FIELDS,
    PATH_KEY,
    TOLERANCE,
    DampedNewtonPath,
    Evaluated,
    NewtonPath,
    PathRequest,
    deviation,
    rate_start,
    summed,
)
from fedstats.contract.secure_aggregation import MASK_FACTS
from fedstats.models import fairness
from fedstats.models.path_relay import PathRelay
from fedstats.secagg.roster import in_process_pins
from fedstats.site.silo import Silo
from tests.security.path_sites import poisson_counts, rossi_sites, served_sites

SITES = ("cleveland", "hungary")
MODEL = fedstats.LogisticRegression(datasets.HEART_EXACT_FORMULA, levels=datasets.HEART_LEVELS)


@pytest.fixture(scope="module")
def frames() -> dict[str, pd.DataFrame]:
    heart = datasets.heart_disease().frames
    return {site: heart[site] for site in SITES}


def federation(frames, verified: bool = True, **options) -> fedstats.Federation:
    return fedstats.Federation.in_process(frames, verified_paths=verified, **options)


POOLED = fedstats.DisclosurePolicy(min_count=1)
"""The Cox parity tests' policy for Rossi's pooled fits (no row threshold; cell rules on)."""


def design(fed: fedstats.Federation) -> dict:
    return MODEL.agree(fed, "agree").spec.to_wire()


def round_one(fed: fedstats.Federation, wire: dict, p: int) -> Evaluated:
    """Round 1 asked honestly: the answered point the next round relays."""
    relay = PathRelay(fed)
    beta = np.zeros(p)
    args = relay.arguments({"design": wire, "beta": beta}, beta, beta)
    fed.request("logistic.summaries", args, analysis="a")
    relay.answered(beta, beta)
    return relay.last


def path_at(previous: Evaluated, beta: np.ndarray) -> dict:
    """The wire path of a round-2 request at ``beta`` after ``previous``."""
    return PathRequest(tuple(sorted(previous.replies)), 2, beta, previous=previous).to_wire()


def derived_after(previous: Evaluated) -> tuple[np.ndarray, np.ndarray]:
    replies = {s: dict(r.reply) for s, r in previous.replies.items()}
    return NewtonPath().next_point(previous.beta, replies)


def refused_by_path(fed: fedstats.Federation, args: dict) -> fedstats.DisclosureError:
    with pytest.raises(fedstats.DisclosureError) as refused:
        fed.request("logistic.summaries", args, analysis="a")
    assert refused.value.rule == "path", refused.value
    return refused.value


# ------------------------------------------------------------------ the attack


def half_space_difference(fed: fedstats.Federation, wire: dict, p: int, target: int) -> float:
    """The attack of the issue on column ``target``: two huge coefficient vectors whose
    half-spaces differ by the patients between two thresholds; their scores' difference is
    those patients' summed ``x (y - mu)``."""
    scores = []
    for threshold in (0.5, 1.5):
        beta = np.zeros(p)
        beta[target], beta[0] = 1e6, -1e6 * threshold
        replies = fed.request("logistic.summaries", {"design": wire, "beta": beta}, analysis="a")
        scores.append(sum(r["gradient"] for r in replies.values()))
    return float(np.abs(scores[1] - scores[0]).max())


def test_the_half_space_attack_answers_without_verified_paths_and_is_refused_with_them(frames):
    """Without verification the crafted points are answered (the difference of two scores is
    a few patients' rows); with it, the same requests are refused, rule ``path``."""
    open_fed = federation(frames, verified=False)
    wire = design(open_fed)
    p = len(wire["columns"])
    target = wire["columns"].index("sex")
    assert half_space_difference(open_fed, wire, p, target) > 0
    fed = federation(frames)
    with pytest.raises(fedstats.DisclosureError) as refused:
        half_space_difference(fed, wire, p, target)
    assert refused.value.rule == "path"


def test_a_crafted_point_is_refused_at_every_round_through_raw_requests(frames):
    """Straight to one silo: no path, round 1 away from the start, and round 2 at a point
    other than the step: each refused with rule ``path`` before any row is read."""
    fed = federation(frames)
    wire = design(fed)
    p = len(wire["columns"])
    silo = fed.silos["cleveland"]
    before = silo._context.guard.entries  # refusals come before the guard remembers anything

    def ask(args: dict) -> dict:
        return codec.decode(silo.handle(codec.encode({"task": "logistic.summaries",
                                                      "args": args})))  # fmt: skip

    crafted = np.full(p, 1e6)
    for args in (
        {"design": wire, "beta": crafted},
        {"design": wire, "beta": crafted, PATH_KEY: {"sites": list(SITES), "round": 1}},
        {"design": wire, "beta": crafted, PATH_KEY: {"sites": ["cleveland"], "round": 1}},
        {"design": wire, "beta": crafted, PATH_KEY: "round 1"},
    ):
        reply = ask(args)
        assert reply["status"] == "error", args
        assert reply["error"]["values"]["rule"] == "path"
    assert silo._context.guard.entries == before
    previous = round_one(fed, wire, p)
    reply = ask({"design": wire, "beta": crafted, PATH_KEY: path_at(previous, crafted)})
    assert reply["error"]["values"]["rule"] == "path"


def test_a_point_moved_by_more_than_the_tolerance_is_refused_and_within_it_answered(frames):
    """The derived round-2 point is answered; moved by 10 tolerances (in standard errors) along
    any coefficient it is refused."""
    fed = federation(frames)
    wire = design(fed)
    p = len(wire["columns"])
    previous = round_one(fed, wire, p)
    derived, information = derived_after(previous)
    se = np.sqrt(np.diag(np.linalg.inv(information)))
    fed.request("logistic.summaries",
                {"design": wire, "beta": derived, PATH_KEY: path_at(previous, derived)},
                analysis="a")  # fmt: skip
    for j in (0, p // 2, p - 1):
        moved = derived.copy()
        moved[j] += 10 * TOLERANCE * se[j]
        refused_by_path(fed, {"design": wire, "beta": moved, PATH_KEY: path_at(previous, moved)})


@settings(max_examples=25, deadline=None)
@given(order=st.permutations(range(4)), seed=st.integers(0, 2**32 - 1))
def test_sites_summing_in_another_order_agree_within_the_tolerance(order, seed):
    """Oracle: the same path derived from replies summed in a shuffled order (another BLAS
    or site order changes only the rounding) lies far within the tolerance, while a shift of
    twice the tolerance does not."""
    rng = np.random.default_rng(seed)
    p = 6
    replies = {}
    for s in range(4):
        X = rng.normal(size=(50, p)) * rng.uniform(0.1, 100, p)
        w = rng.uniform(0.01, 0.25, 50)
        replies[f"s{s}"] = {
            "gradient": X.T @ rng.normal(size=50),
            "hessian": (X * w[:, None]).T @ X,
        }
    beta = rng.normal(size=p)
    derived, information = NewtonPath().next_point(beta, replies)
    shuffled = {f"s{s}": replies[f"s{s}"] for s in order}
    score = sum(shuffled[k]["gradient"] for k in shuffled)  # the given order, not sorted
    hessian = sum(shuffled[k]["hessian"] for k in shuffled)
    other = beta + np.linalg.solve(hessian, score)
    assert deviation(other, derived, information) <= TOLERANCE / 1e3
    se = np.sqrt(np.diag(np.linalg.inv(information)))
    shifted = derived + 2 * TOLERANCE * se * np.eye(p)[seed % p]
    assert deviation(shifted, derived, information) > TOLERANCE


# ------------------------------------------------------------------ relayed replies


def test_tampered_unsigned_missing_and_off_roster_replies_are_refused(frames):
    fed = federation(frames)
    wire = design(fed)
    p = len(wire["columns"])
    previous = round_one(fed, wire, p)
    derived, _ = derived_after(previous)

    def asked(wire_path: dict) -> dict:
        return {"design": wire, "beta": derived, PATH_KEY: wire_path}

    def relayed() -> tuple[dict, dict]:
        path = path_at(previous, derived)
        return path, path["previous"]["replies"]

    tampered, replies = relayed()
    replies["hungary"]["reply"]["gradient"] = replies["hungary"]["reply"]["gradient"] * 1.001
    assert "not signed" in refused_by_path(fed, asked(tampered)).reason
    forged, replies = relayed()
    replies["hungary"]["signature"] = "00" * 64
    assert "not signed" in refused_by_path(fed, asked(forged)).reason
    missing, replies = relayed()
    del replies["hungary"]
    refused_by_path(fed, asked(missing))
    unverified, replies = relayed()
    replies["cleveland"]["verified"] = False
    refused_by_path(fed, asked(unverified))
    # a site off the roster, its reply signed by a key of its own
    stranger = in_process_pins(["cleveland", "hungary", "stranger"])["stranger"]
    off_roster, replies = relayed()
    off_roster["sites"] = sorted([*SITES, "stranger"])
    replies["stranger"] = {
        "reply": replies["hungary"]["reply"],
        "signature": stranger.sign_advert(b"anything"),
        "verified": True,
    }
    assert "roster" in refused_by_path(fed, asked(off_roster)).reason
    # the replies of another design's path do not lead to this design's points
    other = {**wire, "formula": wire["formula"].replace("+ oldpeak", "")}
    refused_by_path(fed, {"design": other, "beta": derived, PATH_KEY: path_at(previous, derived)})


def test_a_silo_needs_its_roster_to_verify_paths(frames):
    with pytest.raises(fedstats.StudyConfigurationError, match="roster"):
        Silo("cleveland", frames["cleveland"], verified_paths=True)


# ------------------------------------------------------------------ honest fits


@pytest.mark.parametrize(
    "model",
    [
        MODEL,
        fedstats.LogisticRegression("disease ~ age + sex + thalach", site_intercepts=True),
    ],
    ids=["heart", "site-intercepts"],
)
def test_an_honest_fit_takes_the_same_rounds_and_gives_the_same_numbers(frames, model):
    plain = model.fit(federation(frames, verified=False))
    verified = model.fit(federation(frames))
    assert verified.iterations == plain.iterations
    np.testing.assert_array_equal(verified.params, plain.params)
    np.testing.assert_array_equal(verified.bse, plain.bse)
    assert verified.llf == plain.llf


def test_a_fit_crosses_sites_that_verify_and_sites_that_only_sign(frames):
    """A site that does not verify still signs its replies; the verifying site checks its own
    signature at each previous point, so the fit completes and equals the plain fit."""
    pins = in_process_pins(list(SITES))
    silos = {
        s: Silo(s, frames[s], secure_aggregation=pins[s], verified_paths=s == "cleveland")
        for s in SITES
    }
    mixed = fedstats.Federation({s: silo.handle for s, silo in silos.items()})
    plain = MODEL.fit(federation(frames, verified=False))
    result = MODEL.fit(mixed)
    np.testing.assert_array_equal(result.params, plain.params)
    assert result.iterations == plain.iterations


# ------------------------------------------------------------------ GLMs: step halving


@pytest.fixture(scope="module")
def counts() -> dict[str, pd.DataFrame]:
    return poisson_counts()


def glm_at(fed, relay: PathRelay, wire: dict, beta: np.ndarray, base: np.ndarray) -> dict:
    """The summed GLM replies at ``beta`` stepped from ``base``, the path written by the
    coordinator's relay (so only ``beta`` and ``base`` are the attacker's)."""
    args = relay.arguments({"design": wire, "beta": beta, "family": "poisson"}, beta, base)
    replies = fed.request("glm.summaries", args, analysis="a")
    relay.answered(beta, base)
    return {k: sum(r[k] for r in replies.values()) for k in ("gradient", "hessian", "loglik")}


def test_a_glm_path_halves_steps_but_never_accepts_a_worse_point(counts):
    """From 0 the full Newton step of a Poisson intercept overshoots: it may be tried (a point
    on the segment), halved (a shorter trial of the same base), never taken as a base, and
    nothing off the segment is answered."""
    fed = federation(counts)
    model = fedstats.GLM("y ~ x", family="poisson")
    wire = model.agree(fed, "agree").spec.to_wire()
    relay = PathRelay(fed)
    zero = np.zeros(2)
    at_zero = glm_at(fed, relay, wire, zero, zero)
    step = np.linalg.solve(at_zero["hessian"], at_zero["gradient"])
    trial = glm_at(fed, relay, wire, zero + step, zero)  # a full step: answered
    assert trial["loglik"] < at_zero["loglik"]  # and worse than its base
    with pytest.raises(fedstats.DisclosureError) as refused:  # taken as a base: refused
        onward = np.linalg.solve(trial["hessian"], trial["gradient"])
        glm_at(fed, relay, wire, zero + step + onward, zero + step)
    assert refused.value.rule == "path"
    with pytest.raises(fedstats.DisclosureError) as refused:  # off the segment
        glm_at(fed, relay, wire, zero + 0.3 * step, zero)
    assert refused.value.rule == "path"
    halved = glm_at(fed, relay, wire, zero + step / 2, zero)  # a shorter trial: answered
    assert np.isfinite(halved["loglik"])


def test_a_poisson_fit_restarts_at_the_rates_only_at_round_two(counts):
    """Round 2 may start at the intercept-only rates derived from round 1 (a base of its own);
    another point as a base of its own, or the rates later, are refused."""
    fed = federation(counts)
    wire = fedstats.GLM("y ~ x", family="poisson").agree(fed, "agree").spec.to_wire()
    relay = PathRelay(fed)
    zero = np.zeros(2)
    glm_at(fed, relay, wire, zero, zero)
    elsewhere = np.array([3.0, 0.0])
    with pytest.raises(fedstats.DisclosureError) as refused:
        glm_at(fed, relay, wire, elsewhere, elsewhere)
    assert refused.value.rule == "path"
    replies = {s: dict(r.reply) for s, r in relay.last.replies.items()}
    rates = rate_start(wire["columns"], zero, replies)
    glm_at(fed, relay, wire, rates, rates)
    at_rates = {s: dict(r.reply) for s, r in relay.last.replies.items()}
    again = rate_start(wire["columns"], rates, at_rates)  # the rule's restart, from round 2
    assert not np.array_equal(again, rates)
    with pytest.raises(fedstats.DisclosureError) as refused:  # not from round 1 any more
        glm_at(fed, relay, wire, again, again)
    assert refused.value.rule == "path"


def test_the_half_space_attack_on_glm_summaries_is_refused(frames):
    fed = federation(frames)
    model = fedstats.GLM(
        datasets.HEART_EXACT_FORMULA, family="binomial", levels=datasets.HEART_LEVELS
    )
    wire = model.agree(fed, "agree").spec.to_wire()
    beta = np.zeros(len(wire["columns"]))
    beta[wire["columns"].index("age")], beta[0] = 1e6, -55e6
    refused_by_path(fed, {"design": wire, "beta": beta, "family": "binomial"})
    relay = PathRelay(fed)
    args = relay.arguments({"design": wire, "beta": beta, "family": "binomial"}, beta, beta)
    with pytest.raises(fedstats.DisclosureError) as refused:
        fed.request("glm.summaries", args, analysis="a")
    assert refused.value.rule == "path"


@pytest.mark.parametrize(
    ("family", "formula", "extra"),
    [
        ("poisson", "y ~ x", {}),
        ("gaussian", "y ~ x", {}),
        ("binomial", "disease ~ age + sex + thalach", {}),
    ],
)
def test_an_honest_glm_takes_the_same_rounds_and_gives_the_same_numbers(
    frames, counts, family, formula, extra
):
    data = frames if family == "binomial" else counts
    model = fedstats.GLM(formula, family=family, **extra)
    plain = model.fit(federation(data, verified=False))
    verified = model.fit(federation(data))
    assert verified.iterations == plain.iterations
    np.testing.assert_array_equal(verified.params, plain.params)
    np.testing.assert_array_equal(verified.bse, plain.bse)


# ------------------------------------------------------------------ Cox models


@pytest.fixture(scope="module")
def rossi() -> dict[str, pd.DataFrame]:
    return rossi_sites()


ROSSI = "Surv(week, arrest) ~ fin + age + race + wexp + mar + paro + prio"


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"penalizer": 0.05},
        {"strata": None, "grid": "weeks", "ties": "efron"},
        {"strata": None, "grid": "weeks", "ties": "breslow"},
    ],
    ids=["stratified", "penalised", "pooled-efron", "pooled-breslow"],
)
def test_an_honest_cox_fit_takes_the_same_rounds_and_gives_the_same_numbers(rossi, options):
    if options.get("grid") == "weeks":
        options = {**options, "grid": np.arange(4.0, 53.0, 4.0)}
    model = fedstats.CoxPH(ROSSI, **options)
    policy = {"disclosure": POOLED} if "grid" in options else {}
    plain = model.fit(federation(rossi, verified=False, **policy))
    verified = model.fit(federation(rossi, **policy))
    assert verified.iterations == plain.iterations
    np.testing.assert_array_equal(verified.params, plain.params)
    np.testing.assert_array_equal(verified.bse, plain.bse)


def test_the_cox_highest_score_attack_is_refused(rossi):
    """The issue's Cox attack: at a huge ``beta`` a risk set's ``S1/S0`` is its highest-scoring
    patient's covariates. Refused on ``cox.summaries`` and the pooled grid task, with or
    without a path; a ridge other than the one the relayed replies were signed under, or a
    negative one, leads nowhere either."""
    fed = federation(rossi)
    model = fedstats.CoxPH(ROSSI)
    wire = model.agree(fed, "agree").spec.to_wire()
    p = len(wire["columns"])
    huge = np.zeros(p)
    huge[wire["columns"].index("age")] = 1e3
    refused_by_path_on(fed, "cox.summaries", {"design": wire, "beta": huge, "ties": "efron"})
    relay = PathRelay(fed)
    zero = np.zeros(p)
    args = {"design": wire, "ties": "efron", "ridge": 0.0}
    fed.request("cox.summaries", relay.arguments({**args, "beta": zero}, zero, zero),
                analysis="a")  # fmt: skip
    relay.answered(zero, zero)
    crafted = relay.arguments({**args, "beta": huge}, huge, zero)
    refused_by_path_on(fed, "cox.summaries", crafted)
    replies = {s: dict(r.reply) for s, r in relay.last.replies.items()}
    for ridge in (-1.0, 5.0):  # a first step asked under another ridge than the replies'
        step, _ = DampedNewtonPath().step(replies, zero, {"ridge": max(ridge, 0.0)})
        other = relay.arguments({**args, "ridge": ridge, "beta": zero + step}, zero + step, zero)
        refused_by_path_on(fed, "cox.summaries", other)


def refused_by_path_on(fed: fedstats.Federation, task: str, args: dict) -> None:
    with pytest.raises(fedstats.DisclosureError) as refused:
        fed.request(task, args, analysis="a")
    assert refused.value.rule == "path", refused.value


def test_the_pooled_cox_grid_task_answers_only_on_its_path(rossi):
    fed = federation(rossi, disclosure=POOLED)
    weeks = np.arange(4.0, 53.0, 4.0)
    model = fedstats.CoxPH(ROSSI, strata=None, grid=weeks)
    wire = model.agree(fed, "agree").spec.to_wire()
    huge = np.zeros(len(wire["columns"]))
    huge[wire["columns"].index("prio")] = 1e3
    refused_by_path_on(fed, "cox.grid_summaries", {"design": wire, "beta": huge, "grid": weeks})
    relay = PathRelay(fed)
    args = relay.arguments({"design": wire, "beta": huge, "grid": weeks, "ties": "efron"},
                           huge, huge)  # fmt: skip
    refused_by_path_on(fed, "cox.grid_summaries", args)


# ------------------------------------------------------------------ site.toml


def test_site_toml_switches_verified_paths_on_only_with_the_keys_that_sign(tmp_path):
    """``[disclosure] verified_paths`` (true by default) needs ``[secure_aggregation]``'s
    roster and signing key (they sign and check the relayed replies): without them the
    configuration is refused naming the field, unless it says ``verified_paths = false``."""
    from fedstats.jobs.site_config import load_site_config
    from fedstats.toml_config import ConfigError

    base = (
        '[site]\nname = "cleveland"\nworkdir = "work"\n[data]\nframe = "frame.parquet"\n'
        '[privacy]\nledger = "site.ledger"\n[disclosure]\nverified_paths = true\n'
    )
    path = tmp_path / "site.toml"
    path.write_text(base)
    with pytest.raises(ConfigError, match="verified_paths"):
        load_site_config(path)
    path.write_text(base + '[secure_aggregation]\nroster = "roster.toml"\nsigning_key = "key"\n')
    assert load_site_config(path).disclosure.verified_paths
    default = base.replace("[disclosure]\nverified_paths = true\n", "")  # on by default
    path.write_text(default)
    with pytest.raises(ConfigError, match="verified_paths"):
        load_site_config(path)
    path.write_text(default + "[disclosure]\nverified_paths = false\n")  # said off
    assert not load_site_config(path).disclosure.verified_paths


# ------------------------------------------------------------------ hostile paths

ARRAYS = st.sampled_from(
    [np.zeros(3), np.zeros(11), np.full(11, np.nan), np.ones((11, 11)), np.zeros(11, np.int64)]
)
VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 10**6) | st.floats() | st.text(max_size=8)
    | ARRAYS,
    lambda inner: st.lists(inner, max_size=3)
    | st.dictionaries(st.sampled_from(["sites", "round", "base", "previous", "accepted",
                                       "beta", "replies", "reply", "signature", "verified",
                                       "cleveland", "hungary", "x"]), inner, max_size=5),
    max_leaves=12,
)  # fmt: skip


@settings(max_examples=150, deadline=None)
@given(path=VALUES, beta=ARRAYS)
def test_any_path_a_coordinator_sends_is_refused_typed_or_answered_never_a_crash(
    frames, path, beta
):
    """Whatever the ``path`` argument holds, a verifying site answers at an allowed point or
    refuses with a typed error (rule ``path`` for a path it cannot follow); it never fails
    with an internal error."""
    fed = federation(frames)
    silo = fed.silos["cleveland"]
    wire = design(fed)
    reply = codec.decode(
        silo.handle(codec.encode({"task": "glm.summaries", "args": {
            "design": wire, "beta": beta, "family": "binomial", PATH_KEY: path}}))
    )  # fmt: skip
    if reply["status"] == "error":
        assert reply["error"]["type"] in ("DisclosureError", "MalformedRequestError"), reply
    else:
        assert np.array_equal(beta, np.zeros(len(wire["columns"])))  # only the start


# ------------------------------------------------------------------ the compliance report


def fitted_report(frames, folder, *, verified: bool):
    """The compliance report of one exact logistic fit on ``frames``, and the fit."""
    from reports import build_report
    from reports.recorder import StudyRecorder
    from reports.study import Study

    fed = federation(frames, verified=verified)
    result = MODEL.fit(fed)
    recorder = StudyRecorder(folder / "study", study="paths")
    spec = folder / "spec.toml"
    spec.write_text('[study]\nname = "paths"\n', encoding="utf-8")
    recorder.record_spec(spec)
    recorder.record_configuration(
        {"study": "paths", "noise_seed": None, "site_paths": sorted(fed.path_sites)}
    )
    recorder.record_fit("exact", result, description="exact logistic regression")
    recorder.record_inventory(fed.inventory)
    return build_report(Study.load(recorder.finish())), result


def test_the_report_names_each_site_that_verifies_paths_and_counts_its_answers(frames, tmp_path):
    """Section 5 says, per site, whether it verifies paths and how many answers it gave on
    verified paths (the message inventory records each answer's path)."""
    from reports.render import render_html

    report, result = fitted_report(frames, tmp_path, verified=True)
    rules = {r.site: r for r in report.site_rules}
    for site in SITES:
        assert rules[site].verifies_paths
        assert rules[site].verified_answers == result.iterations
    assert f"yes: {result.iterations} answers on verified paths" in render_html(report)
    assert "did not verify paths" not in report.verdict.text


def test_a_site_that_does_not_verify_paths_is_a_warning_on_page_one(frames, tmp_path):
    """The verdict (page 1) names each site that answered exact fits without verifying
    their paths; section 5 says "no" for it."""
    report, _ = fitted_report(frames, tmp_path, verified=False)
    assert not any(r.verifies_paths for r in report.site_rules)
    assert report.verdict.text.count("WARNING: cleveland and hungary did not verify paths") == 1


# ------------------------------------------------------------------ evaluations


def test_cox_evaluations_only_at_points_of_a_verified_path(rossi):
    """The robust variance's meat and Harrell's C at the fit's own coefficients are answered
    (a Cox fit ends at a point every site answered on its path) and equal the plain fit's;
    at crafted coefficients, or at a path point of another design, they are refused."""
    model = fedstats.CoxPH(ROSSI, robust=True)
    plain_fed, fed = federation(rossi, verified=False), federation(rossi)
    plain, verified = model.fit(plain_fed), model.fit(fed)
    np.testing.assert_array_equal(verified.bse, plain.bse)
    assert fedstats.concordance_index(verified, fed) == fedstats.concordance_index(plain, plain_fed)
    huge = verified.params.to_numpy() * 1e3
    for task, extra in (("cox.robust", {"cluster": None}), ("cox.concordance", {})):
        refused_by_path_on(fed, task, {"design": verified.design, "beta": huge, **extra})
    other = fedstats.CoxPH("Surv(week, arrest) ~ fin + age + race + wexp + mar + paro")
    other_fit = other.fit(fed)
    wider = {**verified.design}
    refused_by_path_on(
        fed,
        "cox.concordance",
        {"design": wider, "beta": np.r_[other_fit.params.to_numpy(), 0.0]},
    )


# ------------------------------------------------------------------ TPR-parity penalised fits
FAIR_GROUPS = {"group": "sex", "levels": [0, 1], "temperature": 0.25}


def fair_at(fed, relay: PathRelay, wire: dict, beta, base, gamma: float) -> dict:
    """One point of a fair fit through ``relay`` (raw request), every site's reply summed."""
    args = {"design": wire, "beta": beta, **FAIR_GROUPS, "auc": False, "likelihood": True,
            "gamma": gamma}  # fmt: skip
    replies = fed.request("fairness.summaries", relay.arguments(args, beta, base), analysis="a")
    relay.answered(beta, base)
    return replies


def test_the_half_space_attack_on_fairness_summaries_is_refused(frames):
    """The soft true-positive sums at huge coefficients count the positives of a half-space: the
    same attack as on the likelihood. Answered by sites that do not verify; refused, rule
    ``path``, by sites that do, whether the request carries a path or not."""
    wire = design(federation(frames, verified=False))
    p = len(wire["columns"])
    crafted = np.zeros(p)
    crafted[wire["columns"].index("age")], crafted[0] = 1e6, -60e6  # positives aged over 60
    args = {"design": wire, "beta": crafted, **FAIR_GROUPS, "auc": False}
    open_fed = federation(frames, verified=False)
    assert open_fed.request("fairness.summaries", args, analysis="a")
    fed = federation(frames)
    with pytest.raises(fedstats.DisclosureError) as refused:
        fed.request("fairness.summaries", args, analysis="a")
    assert refused.value.rule == "path"
    relay = PathRelay(fed)
    zero = np.zeros(p)
    fair_at(fed, relay, wire, zero, zero, gamma=10.0)
    with pytest.raises(fedstats.DisclosureError) as refused:  # round 2 at the crafted point
        fair_at(fed, relay, wire, crafted, zero, gamma=10.0)
    assert refused.value.rule == "path"
    with pytest.raises(fedstats.DisclosureError) as refused:  # the AUC: an evaluation
        fed.request("fairness.summaries", {**args, "auc": True}, analysis="a")
    assert refused.value.rule == "path"


def test_a_fair_path_answers_its_armijo_trials_and_refuses_a_shifted_step(frames):
    """The step the site re-derives from the relayed replies (the penalised objective's
    Gauss–Newton step) and its halvings are answered; the step moved by more than the
    tolerance, or a gamma changed mid-path, is refused."""
    fed = federation(frames)
    wire = design(fed)
    p = len(wire["columns"])
    relay = PathRelay(fed)
    zero = np.zeros(p)
    at_zero = fair_at(fed, relay, wire, zero, zero, gamma=10.0)
    replies = {s: dict(r) for s, r in at_zero.items()}
    step, information = FAIR_PATH.step(replies, zero, {"gamma": 10.0})
    se = np.sqrt(np.diag(np.linalg.inv(information)))
    shifted = zero + step
    shifted[1] += 1e-3 * se[1]  # a thousand times the tolerance
    with pytest.raises(fedstats.DisclosureError) as refused:
        fair_at(fed, relay, wire, shifted, zero, gamma=10.0)
    assert refused.value.rule == "path"
    with pytest.raises(fedstats.DisclosureError) as refused:  # another objective mid-path
        fair_at(fed, relay, wire, zero + step, zero, gamma=20.0)
    assert refused.value.rule == "path"
    assert fair_at(fed, relay, wire, zero + step / 2, zero, gamma=10.0)  # a halving: answered


def test_fits_along_the_penalty_start_where_a_verified_fit_ended_and_nowhere_else(frames):
    """``minimal_penalty`` refits each gamma from the last fit's end: round 1 at a point the
    site answered on a verified fair path (another gamma) is answered; round 1 at a point
    it never answered is refused."""
    fed = federation(frames)
    model = fedstats.LogisticRegression(datasets.HEART_EXACT_FORMULA, levels=datasets.HEART_LEVELS)
    result = fairness.minimal_penalty(model, fed, groups="sex", delta_max=0.05)
    assert len(result.path) >= 2  # at least one warm-started fit was answered
    wire = design(fed)
    start = result.fit.params.to_numpy() + 1e-3
    with pytest.raises(fedstats.DisclosureError) as refused:
        fair_at(fed, PathRelay(fed), wire, start, start, gamma=3.0)
    assert refused.value.rule == "path"


def test_an_honest_fair_fit_gives_the_same_numbers_with_verification(frames):
    model = fedstats.LogisticRegression(datasets.HEART_EXACT_FORMULA, levels=datasets.HEART_LEVELS)
    plain = fairness.fit_penalized(model, federation(frames, verified=False), groups="sex",
                                   gamma=5.0)  # fmt: skip
    verified = fairness.fit_penalized(model, federation(frames), groups="sex", gamma=5.0)
    assert verified.iterations == plain.iterations
    np.testing.assert_array_equal(verified.params, plain.params)
    assert verified.auc == plain.auc and verified.disparity == plain.disparity


# ------------------------------------------------------------------ Fine–Gray
FG_GRID = np.array([10.0, 20.0, 30.0, 40.0, 50.0, 60.0, 70.0, 80.0, 90.0, 100.0])


@pytest.fixture(scope="module")
def competing() -> dict[str, pd.DataFrame]:
    """Two sites, causes 1 and 2 and censoring, a covariate that shifts cause 1."""
    out = {}
    for i, site in enumerate(("north", "south")):
        rng = np.random.default_rng(40 + i)
        n = 400
        x = rng.normal(size=n)
        status = np.where(rng.uniform(size=n) < 0.35 + 0.1 * (x > 0), 1,
                          rng.choice([0, 2], n, p=[0.6, 0.4]))  # fmt: skip
        out[site] = pd.DataFrame({"t": rng.uniform(1.0, 99.0, n), "status": status, "x": x})
    return out


FG_MODEL = fedstats.FineGray("Surv(t, status) ~ x", cause=1, grid=FG_GRID)


def fg_at(fed, relay: PathRelay, wire: dict, beta, base, censoring, **extra) -> dict:
    """One point of a Fine–Gray path through ``relay`` (raw request; ``extra`` fields such as
    the convention)."""
    args = {"design": wire, "cause": 1, "grid": FG_GRID, "ties": "efron", "beta": beta,
            "censoring": censoring, **extra}  # fmt: skip
    replies = fed.request("fine_gray.grid_summaries", relay.arguments(args, beta, base),
                          analysis="a")  # fmt: skip
    relay.answered(beta, base)
    return replies


def fg_censoring(replies: dict) -> np.ndarray:
    return censoring_from_counts({f: summed(replies, f) for f in COUNT_FIELDS})


def test_an_honest_fine_gray_fit_takes_the_same_rounds_and_gives_the_same_numbers(competing):
    plain = FG_MODEL.fit(federation(competing, verified=False))
    verified = FG_MODEL.fit(federation(competing))
    assert verified.iterations == plain.iterations
    np.testing.assert_array_equal(verified.params, plain.params)
    np.testing.assert_array_equal(verified.bse, plain.bse)  # robust errors, relayed inputs


def test_a_fine_gray_path_refuses_crafted_weights_and_crafted_coefficients(competing):
    """Round 1 only with every weight 1; round 2 only with the censoring curve round 1's
    relayed counts give (a valid but other curve is refused); no round may skip round 2; a
    huge coefficient is refused at any round; the honest path is answered."""
    fed = federation(competing)
    wire = FG_MODEL.agree(fed, "agree").to_wire()
    zero, ones = np.zeros(1), np.ones(len(FG_GRID))
    halved = np.linspace(1.0, 0.5, len(FG_GRID))  # a valid survival curve, not the derived one
    with pytest.raises(fedstats.DisclosureError) as refused:
        fg_at(fed, PathRelay(fed), wire, zero, zero, halved)
    assert refused.value.rule == "path"
    relay = PathRelay(fed)
    first = fg_at(fed, relay, wire, zero, zero, ones)
    G = fg_censoring(first)
    assert not np.allclose(G, halved)
    skipping = PathRelay(fed)  # round 3 straight after round 1, weights 1
    skipping.round, skipping.last = relay.round + 1, relay.last
    with pytest.raises(fedstats.DisclosureError) as refused:
        fg_at(fed, skipping, wire, np.array([0.3]), zero, ones)
    assert refused.value.rule == "path"
    for crafted in (halved, G * 0.999):
        attempt = PathRelay(fed)
        attempt.round, attempt.last = relay.round, relay.last
        with pytest.raises(fedstats.DisclosureError) as refused:
            fg_at(fed, attempt, wire, zero, zero, crafted)
        assert refused.value.rule == "path"
    fg_at(fed, relay, wire, zero, zero, G)  # round 2 as derived: answered
    with pytest.raises(fedstats.DisclosureError) as refused:
        fg_at(fed, relay, wire, np.array([1e6]), zero, G)
    assert refused.value.rule == "path"


def test_the_fine_gray_robust_variance_only_at_the_fits_relayed_sums(competing):
    """The robust variance's ``hazard`` and ``means`` come from the coordinator: a verifying site
    answers only with the fit's last point relayed and inputs equal to what its summed replies
    give; crafted inputs, another point, or no relayed point are refused."""
    fed = federation(competing)
    fit = FG_MODEL.fit(fed)
    assert np.isfinite(fit.bse).all()
    robust = [r for r in fed.inventory if r.task == "fine_gray.robust"]
    assert robust and all(r.status == "ok" for r in robust)
    wire = FG_MODEL.agree(fed, "agree").to_wire()
    beta = fit.params.to_numpy()
    args = {"design": wire, "cause": 1, "grid": FG_GRID, "ties": "efron", "beta": beta,
            "censoring": fit.censoring_survival_, "hazard": np.full(len(FG_GRID), 0.01),
            "means": np.zeros((len(FG_GRID), 1))}  # fmt: skip
    with pytest.raises(fedstats.DisclosureError) as refused:  # no relayed point
        fed.request("fine_gray.robust", args, analysis="a")
    assert refused.value.rule == "path"
    relay = PathRelay(fed)
    zero, ones = np.zeros(1), np.ones(len(FG_GRID))
    G = fg_censoring(fg_at(fed, relay, wire, zero, zero, ones))
    at_zero = fg_at(fed, relay, wire, zero, zero, G)
    hazard, means = robust_inputs({f: summed(at_zero, f) for f in FINE_GRAY_FIELDS})
    honest = {**args, "beta": zero, "censoring": G, "hazard": hazard, "means": means,
              PATH_KEY: PathRequest(relay.sites, relay.round + 1, zero,
                                    previous=relay.last).to_wire()}  # fmt: skip
    assert fed.request("fine_gray.robust", honest, analysis="a")
    for crafted in (
        {"hazard": hazard * 1.01},
        {"means": means + 1.0},
        {"beta": np.array([0.5])},
    ):
        with pytest.raises(fedstats.DisclosureError) as refused:
            fed.request("fine_gray.robust", {**honest, **crafted}, analysis="a")
        assert refused.value.rule == "path"


CRR = {"ties": "breslow", "convention": "crr"}
"""The request fields of a Fine–Gray path of ``cmprsk::crr``'s convention."""


def test_a_crr_path_refuses_the_other_conventions_censoring_curve(competing):
    """Round 2 of a ``"crr"`` path only with the censoring curve of ``crr``'s convention: the
    curve of ``finegray()``'s (valid, from the same relayed counts) is refused, and the other
    way round."""
    fed = federation(competing)
    wire = FG_MODEL.agree(fed, "agree").to_wire()
    zero, ones = np.zeros(1), np.ones(len(FG_GRID))
    for convention, other in (("crr", "finegray"), ("finegray", "crr")):
        extra = CRR if convention == "crr" else {"convention": "finegray"}
        relay = PathRelay(fed)
        first = fg_at(fed, relay, wire, zero, zero, ones, **extra)
        counts = {f: summed(first, f) for f in COUNT_FIELDS}
        mine, theirs = (censoring_from_counts(counts, c) for c in (convention, other))
        assert not np.allclose(mine, theirs)
        attempt = PathRelay(fed)
        attempt.round, attempt.last = relay.round, relay.last
        with pytest.raises(fedstats.DisclosureError) as refused:
            fg_at(fed, attempt, wire, zero, zero, theirs, **extra)
        assert refused.value.rule == "path"
        fg_at(fed, relay, wire, zero, zero, mine, **extra)  # as derived: answered


def test_the_crr_variance_only_with_the_censoring_terms_the_relayed_sums_give(competing):
    """A ``"crr"`` robust variance also carries the censoring term and hazard of its
    censoring-estimation term: a verifying site answers only when both are what the fit's
    relayed last round gives; crafted values, a missing or an extra term are refused. The
    fit itself (the default convention) is answered at every round."""
    fed = federation(competing)
    fit = FG_MODEL.fit(fed)
    assert fit.convention == "crr" and np.isfinite(fit.bse).all()
    robust = [r for r in fed.inventory if r.task == "fine_gray.robust"]
    assert robust and all(r.status == "ok" for r in robust)
    wire = FG_MODEL.agree(fed, "agree").to_wire()
    relay = PathRelay(fed)
    zero, ones = np.zeros(1), np.ones(len(FG_GRID))
    first = fg_at(fed, relay, wire, zero, zero, ones, **CRR)
    G = censoring_from_counts({f: summed(first, f) for f in COUNT_FIELDS}, "crr")
    at_zero = fg_at(fed, relay, wire, zero, zero, G, **CRR)
    # the fit's arguments in fg_at's order: the codec writes them so, into the signed digest
    fit_args = {"design": wire, "cause": 1, "grid": FG_GRID, "ties": "breslow", "beta": zero,
                "censoring": G, "convention": "crr"}  # fmt: skip
    total = {f: summed(at_zero, f) for f in relayed_fields(fit_args)}
    inputs = relayed_inputs(total, fit_args)
    assert set(inputs) == {"hazard", "means", "censoring_term", "censoring_hazard"}
    assert np.abs(inputs["censoring_term"]).max() > 0  # the term is there to be crafted
    honest = {**fit_args, **inputs,
              PATH_KEY: PathRequest(relay.sites, relay.round + 1, zero,
                                    previous=relay.last).to_wire()}  # fmt: skip
    assert fed.request("fine_gray.robust", honest, analysis="a")
    spike = np.zeros_like(inputs["censoring_term"])
    spike[3] = 1e3  # the whole term on one grid point
    for crafted in (
        {"censoring_term": inputs["censoring_term"] * 1.01},
        {"censoring_term": spike},
        {"censoring_hazard": np.minimum(inputs["censoring_hazard"] + 0.01, 1.0)},
        {"censoring_hazard": np.zeros(len(FG_GRID))},
    ):
        with pytest.raises(fedstats.DisclosureError) as refused:
            fed.request("fine_gray.robust", {**honest, **crafted}, analysis="a")
        assert refused.value.rule == "path"
    missing = {k: v for k, v in honest.items() if k != "censoring_term"}
    with pytest.raises(fedstats.DisclosureError) as refused:
        fed.request("fine_gray.robust", missing, analysis="a")
    assert refused.value.rule == "path"


def test_a_crr_fit_inside_secure_aggregation_is_verified_and_equals_the_clear_fit(competing):
    """Inside secure aggregation the competing events' sums are masked like every field, and
    verifying sites re-derive the censoring inputs from the unmasked total: the fit is
    answered at every round and equals the clear one."""
    fed = federation(competing)
    clear = FG_MODEL.fit(fed)
    hidden = FG_MODEL.fit(fed, secure_aggregation=fedstats.SecureAggregation())
    robust = [r for r in fed.inventory if r.task == "fine_gray.robust"]
    assert len(robust) >= 2 and all(r.status == "ok" for r in robust)
    assert np.max(np.abs(hidden.params - clear.params)) <= 1e-9
    assert np.max(np.abs(hidden.bse - clear.bse)) <= 1e-9


# ------------------------------------------------------------------ the site's own audit


def test_a_site_re_derives_every_answer_on_its_paths_from_its_own_records(frames, tmp_path):
    """``fedstats site verify`` replays the archived requests with the pinned roster alone:
    every answer of an honest fit verifies again (in the clear and inside secure aggregation,
    whose masked answers are signed with their session's facts), and the last point is the
    released coefficients'; an archived request changed afterwards is a problem (exit 6)."""
    from typer.testing import CliRunner

    from fedstats.cli.main import app
    from fedstats.jobs.path_audit import ARCHIVE_DIR, audit_site
    from fedstats.jobs.site_config import load_site_config
    from fedstats.jobs.site_service import SiteService

    configs = served_sites(frames, tmp_path)
    services = {site: SiteService.from_file(path) for site, path in configs.items()}
    try:
        fed = fedstats.Federation({s: service.answer for s, service in services.items()},
                                  study="audit-study")  # fmt: skip
        result = MODEL.fit(fed)
        hidden = MODEL.fit(fed, secure_aggregation=fedstats.SecureAggregation())
    finally:
        for service in services.values():
            service.close()
    for path in configs.values():
        audit = audit_site(load_site_config(path))
        assert audit.ok, audit.problems
        clear, masked = audit.fits  # the masked fit's answers verify again from its relays
        for fit, fitted in ((clear, result), (masked, hidden)):
            assert fit.task == "logistic.summaries" and fit.answers == fitted.iterations
            assert fit.rounds == fitted.iterations and len(fit.last_point) == 64
    runner = CliRunner()
    shown = runner.invoke(app, ["site", "verify", "--config", str(configs["cleveland"])])
    assert shown.exit_code == 0, shown.output
    answers = result.iterations + hidden.iterations
    assert f"{answers} answers on 2 verified paths" in shown.output
    archived = sorted((tmp_path / "cleveland" / "work" / ARCHIVE_DIR).glob("*.request"))
    archived[-1].write_bytes(archived[-1].read_bytes()[:-1] + b"\0")
    changed = runner.invoke(app, ["site", "verify", "--config", str(configs["cleveland"])])
    assert changed.exit_code == 6
    assert "not the one the journal recorded" in changed.output


def test_held_out_sites_evaluate_a_cox_fit_only_at_its_relayed_last_point(rossi):
    """Held-out sites pinned with the study's keys check the fit's relayed, signed last point
    and answer Harrell's C there; the same request at coefficients moved by 1e-6, or with the
    relayed point's replies changed, is refused (rule ``path``)."""
    from fedstats.models.cox import concordance_index

    training = federation(rossi, disclosure=POOLED)
    fit = fedstats.CoxPH(ROSSI).fit(training)
    held_out_frames = {"h0": load_rossi().iloc[::3].reset_index(drop=True)}
    held_out = fedstats.Federation.in_process(held_out_frames, disclosure=POOLED,
                                              keys_of=training)  # fmt: skip
    assert 0.5 < concordance_index(fit, held_out) < 1.0
    moved = fit.params.to_numpy().copy()
    moved[0] += 1e-6
    args = {"design": fit.design, "beta": moved, PATH_KEY: fit.path_evidence}
    with pytest.raises(fedstats.DisclosureError) as refused:
        held_out.request("cox.concordance", args, analysis="a")
    assert refused.value.rule == "path"
    evidence = {**fit.path_evidence, "previous": {**fit.path_evidence["previous"]}}
    replies = dict(evidence["previous"]["replies"])
    site = sorted(replies)[0]
    changed = {**replies[site], "reply": {**replies[site]["reply"]}}
    changed["reply"]["loglik"] = changed["reply"]["loglik"] + 1.0
    evidence["previous"]["replies"] = {**replies, site: changed}
    args = {"design": fit.design, "beta": fit.params.to_numpy(), PATH_KEY: evidence}
    with pytest.raises(fedstats.DisclosureError) as refused:
        held_out.request("cox.concordance", args, analysis="a")
    assert refused.value.rule == "path"


def test_the_counting_process_cox_fit_is_on_its_path_and_crafted_points_are_refused(rossi):
    """``Surv(start, stop, event)`` (delayed entry, time-varying covariates) fits with
    ``cox.summaries`` on the same path rule: the honest fit gives the same numbers with and
    without verification, and a huge coefficient after round 1 is refused."""
    frames = {s: f.assign(start=0.0, stop=f["week"]) for s, f in rossi.items()}
    formula = "Surv(start, stop, arrest) ~ fin + age + prio"
    plain = fedstats.CoxPH(formula).fit(federation(frames, verified=False))
    fed = federation(frames)
    verified = fedstats.CoxPH(formula).fit(fed)
    assert verified.iterations == plain.iterations
    np.testing.assert_array_equal(verified.params, plain.params)
    wire = fedstats.CoxPH(formula).agree(fed, "agree").spec.to_wire()
    p = len(wire["columns"])
    relay = PathRelay(fed)
    zero, huge = np.zeros(p), np.zeros(p)
    huge[wire["columns"].index("age")] = 1e3
    args = {"design": wire, "ties": "efron", "ridge": 0.0}
    fed.request("cox.summaries", relay.arguments({**args, "beta": zero}, zero, zero),
                analysis="a")  # fmt: skip
    relay.answered(zero, zero)
    refused_by_path_on(fed, "cox.summaries", relay.arguments({**args, "beta": huge}, huge, zero))


# ------------------------------------------------ inside secure aggregation


class Tampering:
    """A coordinator that rewrites the arguments of masked path requests (``secagg`` with a
    ``path``) before each site sees them, with ``change(args)``."""

    def __init__(self, handle, change) -> None:
        self.handle, self.change = handle, change

    def __call__(self, request: bytes) -> bytes:
        message = codec.decode(request)
        args = message["args"]
        if "secagg" in args and "path" in args:
            message["args"] = self.change(args)
            request = codec.encode(message)
        return self.handle(request)


def tampered(base: fedstats.Federation, change) -> fedstats.Federation:
    fed = fedstats.Federation({s: Tampering(silo.handle, change)
                               for s, silo in base.silos.items()})  # fmt: skip
    fed.silos, fed.path_sites = base.silos, base.path_sites
    return fed


def path_refusals(fed: fedstats.Federation) -> list[str]:
    return [e.detail for silo in fed.silos.values() for e in silo.log if e.reason == "path"]


def three_sites(seed: int = 3) -> dict[str, pd.DataFrame]:
    rng = np.random.default_rng(seed)
    out = {}
    for i in range(3):
        x = rng.normal(size=150)
        y = (rng.random(150) < 1 / (1 + np.exp(-(0.8 * x - 0.3)))).astype(int)
        out[f"s{i}"] = pd.DataFrame({"x": x, "y": y})
    return out


def test_an_exact_fit_over_secure_aggregation_is_verified_at_every_masked_round(frames):
    """Each masked round's path is checked: the sites sign their masked replies with the
    session and a commitment to their self-mask seed, the next round relays them with the
    seeds the coordinator rebuilt, and every site recomputes the total and the step. The fit
    equals the clear one to fixed-point precision, every answer on a verified path."""
    seen: list[dict] = []

    def record(args):
        seen.append(args["path"])
        return args

    fed = tampered(federation(frames), record)
    hidden = MODEL.fit(fed, secure_aggregation=fedstats.SecureAggregation())
    plain = MODEL.fit(federation(frames))
    np.testing.assert_allclose(hidden.params, plain.params, atol=1e-6)
    assert hidden.iterations == plain.iterations
    answers = [r for r in fed.inventory.records() if r.task == "logistic.summaries"]
    assert answers and {r.path for r in answers} == {"verified"}
    later = [path for path in seen if path["round"] > 1]
    assert later and all(set(path["previous"]["seeds"]) == set(SITES) for path in later)
    # what a site is shown is what the coordinator holds: each site's masked vector with the
    # facts it signed, and the seeds the coordinator rebuilt; no site's sums in the clear
    relayed = [r["reply"] for path in later for r in path["previous"]["replies"].values()]
    assert relayed and all(set(reply) == {"masked", *MASK_FACTS} for reply in relayed)
    assert not path_refusals(fed)


@pytest.mark.parametrize("at_round", [1, 3])
def test_a_crafted_point_inside_secure_aggregation_is_refused(frames, at_round):
    """The half-space attack wrapped in a secure session (a huge coefficient vector at round 1
    or 3): every site refuses it, rule ``path``, and nothing is unmasked."""

    def craft(args):
        if args["path"]["round"] == at_round:
            args = {**args, "beta": args["beta"] + 1e6 * np.eye(len(args["beta"]))[1]}
        return args

    fed = tampered(federation(frames), craft)
    with pytest.raises(fedstats.SecureAggregationAborted, match=r"path|coefficients|start"):
        MODEL.fit(fed, secure_aggregation=fedstats.SecureAggregation())
    assert len(path_refusals(fed)) == len(SITES)


def test_a_relayed_seed_other_than_the_committed_one_is_refused(frames):
    """A coordinator that relays another self-mask seed (to move the total the sites
    recompute) is refused: the seed must be the one its site committed to in its signed
    masked reply."""

    def swap(args):
        previous = args["path"].get("previous")
        if previous is not None and "seeds" in previous:
            seeds = {**previous["seeds"], SITES[0]: "ab" * 32}
            path = {**args["path"], "previous": {**previous, "seeds": seeds}}
            args = {**args, "path": path}
        return args

    fed = tampered(federation(frames), swap)
    with pytest.raises(fedstats.SecureAggregationAborted):
        MODEL.fit(fed, secure_aggregation=fedstats.SecureAggregation())
    refusals = path_refusals(fed)
    assert len(refusals) == len(SITES)
    assert all("is not the one it signed" in why for why in refusals)


def test_a_tampered_masked_vector_is_refused(frames):
    """One entry of a relayed masked reply moved by one (a coordinator steering the total):
    the site's signature no longer covers it, rule ``path``."""

    def nudge(args):
        previous = args["path"].get("previous")
        if previous is not None and "seeds" in previous:
            signed = previous["replies"][SITES[1]]
            vector = signed["reply"]["masked"].copy()
            vector[0] += np.uint64(1)
            moved = {**signed, "reply": {**signed["reply"], "masked": vector}}
            replies = {**previous["replies"], SITES[1]: moved}
            args = {**args, "path": {**args["path"], "previous": {**previous, "replies": replies}}}
        return args

    fed = tampered(federation(frames), nudge)
    with pytest.raises(fedstats.SecureAggregationAborted):
        MODEL.fit(fed, secure_aggregation=fedstats.SecureAggregation())
    refusals = path_refusals(fed)
    assert len(refusals) == len(SITES) and all("not signed" in why for why in refusals)


def test_a_masked_round_leaving_a_site_out_of_its_session_is_refused():
    """A coordinator that runs a masked round of the path in a session without one of the
    path's sites (here: s2 fails to advertise, so the session starts over without it): the
    pairwise masks of the path's sites would not cancel in the total, so the sites refuse the
    round, rule ``path``, before they mask anything. Leaving one site's shares out of a
    session it is in is refused by the protocol itself (rule ``secagg-shares``:
    ``tests/security/test_secure_aggregation_graph.py``)."""
    base = fedstats.Federation.in_process(three_sites())

    class LeavesOut:
        def __init__(self, handle) -> None:
            self.handle = handle

        def __call__(self, request: bytes) -> bytes:
            message = codec.decode(request)
            if message["task"] == "secagg.advertise" and len(message["args"]["sites"]) == 3:
                raise ConnectionError("s2 is left out")
            return self.handle(request)

    fed = fedstats.Federation(
        {s: LeavesOut(silo.handle) if s == "s2" else silo.handle for s, silo in base.silos.items()}
    )
    fed.silos, fed.path_sites = base.silos, base.path_sites
    with pytest.raises(fedstats.SecureAggregationAborted):
        fedstats.LogisticRegression("y ~ x").fit(
            fed, secure_aggregation=fedstats.SecureAggregation(threshold=2)
        )
    refusals = [d for silo in ("s0", "s1") for e in base.silos[silo].log
                if e.reason == "path" for d in [e.detail]]  # fmt: skip
    assert len(refusals) == 2 and all("pairwise masks must cancel" in d for d in refusals)


@pytest.mark.parametrize(
    "fields",
    [{"gamma": -1.0}, {"gamma": float("nan")}, {"gamma": "1"}, {"gamma": True},
     {"likelihood": "yes"}, {"likelihood": 1}],
)  # fmt: skip
def test_a_fair_requests_penalty_fields_are_checked_before_any_row_is_read(
    frames, monkeypatch, fields
):
    """``gamma`` and ``likelihood``, as a malicious coordinator could send them: refused as
    malformed before the design is built; a crafted point on the path is refused (rule
    ``path``) before it too."""
    import fedstats.site.handlers.fairness as fairness_site

    read: list[str] = []
    real = fairness_site.site_design
    monkeypatch.setattr(fairness_site, "site_design",
                        lambda *a, **k: read.append("rows") or real(*a, **k))  # fmt: skip
    fed = federation(frames)
    wire = design(fed)
    zero = np.zeros(len(wire["columns"]))
    args = {"design": wire, "beta": zero, **FAIR_GROUPS, "auc": False, "likelihood": True,
            "gamma": 1.0, **fields}  # fmt: skip
    relay = PathRelay(fed)
    with pytest.raises(fedstats.errors.MalformedRequestError):
        fed.request("fairness.summaries", relay.arguments(args, zero, zero), analysis="a")
    huge = zero.copy()
    huge[1] = 1e6
    with pytest.raises(fedstats.DisclosureError) as refused:
        fed.request("fairness.summaries", {**args, "gamma": 1.0, "likelihood": True,
                                           "beta": huge}, analysis="a")  # fmt: skip
    assert refused.value.rule == "path"
    assert read == []


@pytest.mark.parametrize("ties", ["exact", 1, None])
def test_a_fine_gray_requests_ties_are_checked(competing, ties):
    """``ties`` binds the Fine–Gray objective a site re-derives: anything but Breslow or
    Efron is malformed."""
    fed = federation(competing)
    wire = FG_MODEL.agree(fed, "agree").to_wire()
    args = {"design": wire, "cause": 1, "grid": FG_GRID, "ties": ties, "beta": np.zeros(1),
            "censoring": np.ones(len(FG_GRID))}  # fmt: skip
    with pytest.raises(fedstats.errors.MalformedRequestError, match="ties"):
        fed.request("fine_gray.grid_summaries", args, analysis="a")


@settings(max_examples=100, deadline=None)
@given(
    task=st.text(max_size=20),
    sites=st.lists(st.text(max_size=8), min_size=1, max_size=5),
    round_=st.integers(1, 10_000),
    beta=st.lists(st.floats(allow_nan=False), min_size=1, max_size=4),
    verified=st.booleans(),
)
def test_a_statement_is_the_canonical_json_of_its_record(task, sites, round_, beta, verified):
    """What a site signs is the sorted-key, spaceless JSON of its record (the record's format
    before the point's parts were written once): archived signatures stay checkable."""
    import json

    from fedstats.contract.paths import point_digest, reply_digest, statements

    point = np.asarray(beta, dtype=np.float64)
    reply = {"gradient": point[::-1].copy(), "loglik": -1.5, "all_extreme": False, "n": 3}
    record = {"kind": "fedstats path reply v2", "task": task, "request": "ab" * 32,
              "sites": sorted(sites), "round": round_, "beta": point_digest(point),
              "base": point_digest(-point), "reply": reply_digest(reply),
              "verified": verified}  # fmt: skip
    expected = json.dumps(record, sort_keys=True, separators=(",", ":")).encode()
    at = dict(task=task, request="ab" * 32, sites=sites, round=round_, beta=point, base=-point)
    assert statements(**at)(reply, verified) == expected
