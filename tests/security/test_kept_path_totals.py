"""A trial's base relayed by reference: each point's replies cross the wire once.

On a damped Newton path (GLMs, the Cox models) a round relays the last point every site
answered and, when that point was a trial, the base it was tried from. The base's replies
were relayed in full by the round before, so the coordinator sends the base alone, marked
``"kept": true`` (:attr:`fedstats.contract.paths.PathRequest.accepted_kept`), and each
verifying site reads the total it kept when it verified them
(:func:`fedstats.site.verified_paths._keep_totals`), found by everything their signatures
covered: the task, the request's digest, the sites, the round, the point and its base.

The attacks: a coordinator that names, by reference, a base the site never verified (a
restarted site, a point of its own making, another round or base) or that malforms the
reference. Each is refused with rule ``path`` before any row is read; an honest fit sends
fewer bytes and gives the same numbers, and keeps doing so when the site's bound on kept
totals drops all but the last request's.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

import fedstats
from fedstats.contract.paths import KEPT_KEY, PATH_KEY, Evaluated, PathRequest
from fedstats.models.path_relay import PathRelay
from fedstats.site import verified_paths
from fedstats.site.verified_paths import KEPT_TOTALS
from tests.security.path_sites import poisson_counts, rossi_sites, served_sites

GLM = fedstats.GLM("y ~ x", family="poisson")
ROSSI = "Surv(week, arrest) ~ fin + age + race + wexp + mar + paro + prio"


@pytest.fixture(scope="module")
def counts() -> dict[str, pd.DataFrame]:
    return poisson_counts()


@pytest.fixture(scope="module")
def rossi() -> dict[str, pd.DataFrame]:
    return rossi_sites()


def relayed_paths(monkeypatch) -> list[dict]:
    """Every path the coordinator writes, as sent."""
    sent: list[dict] = []
    to_wire = PathRequest.to_wire

    def recorded(self: PathRequest) -> dict:
        wire = to_wire(self)
        sent.append(wire)
        return wire

    monkeypatch.setattr(PathRequest, "to_wire", recorded)
    return sent


def never_kept(monkeypatch) -> None:
    """A coordinator that relays every base in full (as before kept totals)."""
    to_wire = Evaluated.to_wire
    monkeypatch.setattr(Evaluated, "to_wire", lambda self, kept=False: to_wire(self))


def request_bytes(fed: fedstats.Federation) -> int:
    return sum(record.request_bytes for record in fed.inventory)


@pytest.mark.parametrize("model", ["poisson", "pooled-cox"])
def test_an_honest_fit_relays_each_base_once_and_gives_the_same_numbers(
    counts, rossi, model, monkeypatch
):
    if model == "poisson":
        frames, fit, policy = counts, GLM, {}
    else:
        frames, policy = rossi, {"disclosure": fedstats.DisclosurePolicy(min_count=1)}
        fit = fedstats.CoxPH(ROSSI, strata=None, grid=np.arange(4.0, 53.0, 4.0), ties="efron")
    plain = fit.fit(fedstats.Federation.in_process(frames, verified_paths=False, **policy))
    with monkeypatch.context() as patched:
        never_kept(patched)
        in_full = fedstats.Federation.in_process(frames, verified_paths=True, **policy)
        full = fit.fit(in_full)
    sent = relayed_paths(monkeypatch)
    kept = fedstats.Federation.in_process(frames, verified_paths=True, **policy)
    verified = fit.fit(kept)
    by_reference = [w for w in sent if w.get("accepted", {}).get(KEPT_KEY) is True]
    assert by_reference, "no trial's base went by reference"
    assert all("replies" not in w["accepted"] for w in by_reference)
    assert request_bytes(kept) < request_bytes(in_full)
    for other in (plain, full):
        assert verified.iterations == other.iterations
        np.testing.assert_array_equal(verified.params, other.params)
        np.testing.assert_array_equal(verified.bse, other.bse)


def honest_rounds(fed: fedstats.Federation) -> tuple[dict, PathRelay, Evaluated, Evaluated]:
    """Rounds 1 (at 0) and 2 (the full step, a trial) of the Poisson path, asked honestly;
    returns the design, the relay, and the two answered points."""
    wire = GLM.agree(fed, "agree").spec.to_wire()
    relay = PathRelay(fed)
    zero = np.zeros(2)
    args = relay.arguments({"design": wire, "beta": zero, "family": "poisson"}, zero, zero)
    replies = fed.request("glm.summaries", args, analysis="a")
    relay.answered(zero, zero)
    at_zero = relay.last
    step = np.linalg.solve(*(sum(r[k] for r in replies.values()) for k in ("hessian", "gradient")))
    args = relay.arguments({"design": wire, "beta": step, "family": "poisson"}, step, zero)
    fed.request("glm.summaries", args, analysis="a")
    relay.answered(step, zero)
    return wire, relay, at_zero, relay.last


def round_three(wire: dict, trial: Evaluated, base: Evaluated, *, kept: bool = True) -> dict:
    """Round 3 at half the step (an honest halving) with the trial and, by reference, its base."""
    half = trial.base + (trial.beta - trial.base) / 2
    path = PathRequest(tuple(sorted(trial.replies)), 3, trial.base, previous=trial,
                       accepted=base, accepted_kept=kept)  # fmt: skip
    return {"design": wire, "beta": half, "family": "poisson", PATH_KEY: path.to_wire()}


def refused(fed: fedstats.Federation, args: dict) -> fedstats.DisclosureError:
    with pytest.raises(fedstats.DisclosureError) as caught:
        fed.request("glm.summaries", args, analysis="a")
    assert caught.value.rule == "path", caught.value
    return caught.value


def test_the_honest_round_three_is_answered_with_its_base_by_reference(counts):
    fed = fedstats.Federation.in_process(counts, verified_paths=True)
    wire, _, at_zero, trial = honest_rounds(fed)
    replies = fed.request("glm.summaries", round_three(wire, trial, at_zero), analysis="a")
    assert sorted(replies) == sorted(counts)


def test_a_restarted_site_refuses_a_base_by_reference_and_answers_it_in_full(counts):
    """A site that lost its kept totals (a restart) refuses the reference, never guesses; the
    same round with the base's replies in full is answered."""
    fed = fedstats.Federation.in_process(counts, verified_paths=True)
    wire, _, at_zero, trial = honest_rounds(fed)
    fed.silos["b"]._context.cache.pop(KEPT_TOTALS)
    error = refused(fed, round_three(wire, trial, at_zero))
    assert error.site == "b" and "keeps no total" in error.reason
    replies = fed.request("glm.summaries", round_three(wire, trial, at_zero, kept=False),
                          analysis="a")  # fmt: skip
    assert sorted(replies) == sorted(counts)


def test_a_base_by_reference_the_sites_never_verified_is_refused(counts):
    """The coordinator names a base of its own making (another point, another round, another
    base of the same point): no site kept a total for it, and nothing is answered."""
    fed = fedstats.Federation.in_process(counts, verified_paths=True)
    wire, _, at_zero, trial = honest_rounds(fed)
    crafted = [
        Evaluated(at_zero.beta, 2, at_zero.base, at_zero.replies),  # another round
        Evaluated(at_zero.beta, 1, at_zero.beta + 0.25, at_zero.replies),  # another base
        Evaluated(at_zero.beta + 1e-3, 1, at_zero.beta + 1e-3, at_zero.replies),  # moved
    ]
    for base in crafted:
        error = refused(fed, round_three(wire, trial, base))
        assert "keeps no total" in error.reason


@pytest.mark.parametrize(
    "change",
    [
        lambda w: {**w, KEPT_KEY: 1},
        lambda w: {**w, KEPT_KEY: "true"},
        lambda w: {**w, "replies": {}},
        lambda w: {**w, "seeds": {}},
        lambda w: {k: v for k, v in w.items() if k != "round"},
    ],
    ids=["kept-1", "kept-text", "with-replies", "with-seeds", "no-round"],
)
def test_a_malformed_reference_is_refused_typed(counts, change):
    fed = fedstats.Federation.in_process(counts, verified_paths=True)
    wire, _, at_zero, trial = honest_rounds(fed)
    args = round_three(wire, trial, at_zero)
    args[PATH_KEY] = {**args[PATH_KEY], "accepted": change(args[PATH_KEY]["accepted"])}
    error = refused(fed, args)
    assert "malformed" in error.reason


def test_an_honest_fit_keeps_going_when_the_bound_drops_all_but_the_last_requests_totals(
    counts, monkeypatch
):
    monkeypatch.setattr(verified_paths, "KEPT_TOTAL_BYTES", 1)
    plain = GLM.fit(fedstats.Federation.in_process(counts, verified_paths=False))
    fed = fedstats.Federation.in_process(counts, verified_paths=True)
    verified = GLM.fit(fed)
    np.testing.assert_array_equal(verified.params, plain.params)
    for silo in fed.silos.values():
        assert len(silo._context.cache[KEPT_TOTALS]) <= 2  # the last request's points only


def test_a_sites_own_audit_re_derives_the_rounds_whose_base_went_by_reference(counts, tmp_path):
    """``fedstats site verify`` replays the archived requests in order with the pinned roster
    alone, keeping totals as the site did: a fit whose trials' bases went by reference
    verifies again, every answer."""
    from fedstats.jobs.path_audit import audit_site
    from fedstats.jobs.site_config import load_site_config
    from fedstats.jobs.site_service import SiteService

    configs = served_sites(counts, tmp_path)
    services = {site: SiteService.from_file(path) for site, path in configs.items()}
    sent = []
    to_wire = PathRequest.to_wire
    try:
        fed = fedstats.Federation({s: service.answer for s, service in services.items()},
                                  study="audit-study")  # fmt: skip
        with pytest.MonkeyPatch.context() as patched:
            patched.setattr(PathRequest, "to_wire", lambda self: sent.append(to_wire(self))
                            or sent[-1])  # fmt: skip
            result = GLM.fit(fed)
    finally:
        for service in services.values():
            service.close()
    assert any(w.get("accepted", {}).get(KEPT_KEY) is True for w in sent)
    for path in configs.values():
        audit = audit_site(load_site_config(path))
        assert audit.ok, audit.problems
        (fit,) = audit.fits
        assert fit.task == "glm.summaries" and fit.answers == result.iterations


def test_the_last_point_never_goes_by_reference(counts):
    """Only a trial's base may go by reference: the last point's replies are new to every site,
    and a ``previous`` marked kept (with or without its replies) is refused as malformed."""
    fed = fedstats.Federation.in_process(counts, verified_paths=True)
    wire, _, at_zero, trial = honest_rounds(fed)
    args = round_three(wire, trial, at_zero, kept=False)
    previous = args[PATH_KEY]["previous"]
    without_replies = {k: v for k, v in previous.items() if k != "replies"}
    for marked in ({**previous, KEPT_KEY: True}, {**without_replies, KEPT_KEY: True}):
        refused_args = {**args, PATH_KEY: {**args[PATH_KEY], "previous": marked}}
        assert "malformed" in refused(fed, refused_args).reason
