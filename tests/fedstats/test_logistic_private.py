"""Differentially private logistic regression: charged before release, noised, accounted."""

from __future__ import annotations

import dp_accounting
import numpy as np
import pandas as pd
import pytest

import accounting
import fedstats
from fedstats.contract import codec
from fedstats.errors import BudgetExceededError, DisclosureError, FormulaError, NoBudgetError
from tests.conftest import pooled

BOUNDS = {"x1": (-4, 4), "x2": (-4, 4), "x3": (-4, 4)}
LEVELS = {"group": ["a", "b", "c"]}
FORMULA = "y ~ x1 + x2 + x3 + C(group)"


def make_ledgers(tmp_path, sites, epsilon=5.0, delta=1e-6, study="study"):
    tmp_path.mkdir(parents=True, exist_ok=True)
    ledgers = {}
    for site in sites:
        ledger = accounting.Ledger(tmp_path / f"{site}.ledger")
        ledger.set_budget(
            accounting.Scope(unit="patient", owner=site, study=study), epsilon=epsilon, delta=delta
        )
        ledgers[site] = ledger
    return ledgers


@pytest.fixture()
def big_sites():
    return fedstats.datasets.synthetic_logistic(n_sites=4, n_per_site=5000, n_covariates=3, seed=11)


def scope(site, study="study"):
    return accounting.Scope(unit="patient", owner=site, study=study)


def test_negligible_noise_recovers_the_pooled_mle(big_sites, tmp_path):
    """With a tiny noise multiplier the noisy Newton path (scaling, unscaling) is exact.

    Standard errors come from the information released at round T-1, a few
    steps before convergence, hence the looser tolerance on them.
    """
    fed = fedstats.Federation.in_process(
        big_sites, ledgers=make_ledgers(tmp_path, big_sites, epsilon=1e15)
    )
    exact = fedstats.LogisticRegression(FORMULA).fit(fed)
    data = pooled(big_sites)
    wide = {c: (data[c].min() - 1, data[c].max() + 1) for c in ["x1", "x2", "x3"]}  # never clip
    private = fedstats.LogisticRegression(FORMULA, levels=LEVELS).fit(
        fed, privacy=fedstats.RecordDP(noise_multiplier=1e-5, rounds=8, bounds=wide)
    )
    np.testing.assert_allclose(private.params[exact.params.index], exact.params, atol=1e-6)
    np.testing.assert_allclose(private.bse[exact.params.index], exact.bse, rtol=1e-2)


def test_record_dp_charges_every_site_before_release_and_reports_epsilon(big_sites, tmp_path):
    ledgers = make_ledgers(tmp_path, big_sites, epsilon=3.0)
    fed = fedstats.Federation.in_process(big_sites, ledgers=ledgers, study="study")
    privacy = fedstats.RecordDP(epsilon=1.0, delta=1e-6, rounds=3, bounds=BOUNDS)
    result = fedstats.LogisticRegression(FORMULA, levels=LEVELS).fit(fed, privacy=privacy)
    sigmas = privacy.noise_multipliers()
    assert sorted(sigmas) == [
        (0, "n_obs"),
        (1, "gradient"),
        (1, "hessian"),
        (2, "gradient"),
        (2, "hessian"),
        (3, "gradient"),
    ]
    planned = [dp_accounting.GaussianDpEvent(s) for s in sigmas.values()]
    expected = dp_accounting.rdp.RdpAccountant()
    for event in planned:
        expected.compose(event)
    # the calibration spends exactly the target (to the calibration's tolerance)
    assert expected.get_epsilon(1e-6) == pytest.approx(1.0, abs=1e-3)
    for site, ledger in ledgers.items():
        entries = ledger.entries(scope(site))
        assert [e.task for e in entries] == ["prepare"] + ["logistic.summaries"] * 3
        assert ledger.spent(scope(site)).epsilon == pytest.approx(
            expected.get_epsilon(1e-6), abs=1e-9
        )
        assert ledger.spent(scope(site)).epsilon <= 1.0 + 1e-9
    account = result.privacy
    assert {s.owner for s in account.scopes} == set(big_sites)
    for spending in account.scopes:
        assert spending.unit == "patient"
        assert spending.epsilon == pytest.approx(expected.get_epsilon(1e-6), abs=1e-9)
        assert spending.epsilon_pld is not None and spending.epsilon_pld <= spending.epsilon
        assert spending.cumulative_epsilon == pytest.approx(spending.epsilon, abs=1e-9)
        assert not spending.fixed_seed
    assert np.isnan(result.llf)
    assert "record-level DP" in result.summary()


def test_private_fit_is_useful(big_sites, tmp_path):
    fed = fedstats.Federation.in_process(big_sites, ledgers=make_ledgers(tmp_path, big_sites))
    exact = fedstats.LogisticRegression(FORMULA).fit(fed)
    private = fedstats.LogisticRegression(FORMULA, levels=LEVELS).fit(
        fed, privacy=fedstats.RecordDP(epsilon=2.0, rounds=3, bounds=BOUNDS)
    )
    data = pooled(big_sites)
    X = pd.get_dummies(data[["x1", "x2", "x3", "group"]], columns=["group"], drop_first=True)
    X.insert(0, "Intercept", 1.0)
    X.columns = ["Intercept", "x1", "x2", "x3", "C(group)[T.b]", "C(group)[T.c]"]
    from sklearn.metrics import roc_auc_score

    auc = {
        name: roc_auc_score(data["y"], X.astype(float) @ res.params[X.columns])
        for name, res in [("exact", exact), ("private", private)]
    }
    assert auc["private"] > auc["exact"] - 0.01


def test_noise_is_fresh_unless_a_seed_is_fixed(big_sites, tmp_path):
    privacy = fedstats.RecordDP(noise_multiplier=5.0, rounds=2, bounds=BOUNDS)
    fed = fedstats.Federation.in_process(
        big_sites, ledgers=make_ledgers(tmp_path, big_sites, epsilon=100)
    )
    a = fedstats.LogisticRegression(FORMULA, levels=LEVELS).fit(fed, privacy=privacy)
    b = fedstats.LogisticRegression(FORMULA, levels=LEVELS).fit(fed, privacy=privacy)
    assert not np.allclose(a.params, b.params)
    seeded = []
    for run in range(2):
        ledgers = make_ledgers(tmp_path / f"seeded{run}", big_sites, epsilon=100)
        fed = fedstats.Federation.in_process(big_sites, ledgers=ledgers, noise_seed=42)
        seeded.append(fedstats.LogisticRegression(FORMULA, levels=LEVELS).fit(fed, privacy=privacy))
    np.testing.assert_array_equal(seeded[0].params, seeded[1].params)
    assert all(s.fixed_seed for s in seeded[0].privacy.scopes)
    assert "FIXED NOISE SEED" in seeded[0].summary()


def test_plan_over_budget_is_refused_before_anything_is_charged(big_sites, tmp_path):
    ledgers = make_ledgers(tmp_path, big_sites, epsilon=3.0)
    small = ledgers["site02"]
    small.set_budget(scope("site02"), epsilon=0.5, delta=1e-6)
    fed = fedstats.Federation.in_process(big_sites, ledgers=ledgers)
    with pytest.raises(fedstats.PlannedBudgetError, match="site02"):
        fedstats.LogisticRegression(FORMULA, levels=LEVELS).fit(
            fed, privacy=fedstats.RecordDP(epsilon=1.0, rounds=3, bounds=BOUNDS)
        )
    for site, ledger in ledgers.items():
        assert ledger.entries(scope(site)) == []
    assert {r.task for r in fed.inventory} == {"privacy.status"}


def test_over_budget_request_is_refused_before_any_row_is_touched(big_sites, tmp_path, monkeypatch):
    ledgers = make_ledgers(tmp_path, big_sites, epsilon=0.2)
    fed = fedstats.Federation.in_process(big_sites, ledgers=ledgers)
    from fedstats.site.handlers import design as site_design

    spec = fedstats.models.agree.agree_design(fed, FORMULA, analysis="a").spec
    touched = []
    real = site_design.build_design
    monkeypatch.setattr(
        site_design, "build_design", lambda ctx, s: touched.append(ctx.name) or real(ctx, s)
    )
    before = {
        s: (ledger.spent(scope(s)), ledger.entries(scope(s))) for s, ledger in ledgers.items()
    }
    frames_before = {s: f.copy() for s, f in big_sites.items()}
    args = {
        "design": spec.to_wire(),
        "beta": np.zeros(spec.n_params),
        "clip": {"row_norm": 3.0, "scaling": np.tile([0.0, 4.0], (spec.n_params, 1))},
        "dp": {
            "noise_multipliers": {"gradient": 1.0, "hessian": 1.0},
            "study": "study",
            "analysis": "a",
            "note": "round 1",
        },
    }
    with pytest.raises(BudgetExceededError) as info:
        fed.request("logistic.summaries", args, analysis="a")
    error = info.value
    assert error.site == "site01" and error.study == "study"
    assert error.spent == 0 and error.budget == pytest.approx(0.2)
    assert error.requested > 0.2 and error.remaining == pytest.approx(0.2)
    assert "spent epsilon 0" in str(error) and "remaining 0.2" in str(error)
    assert touched == []
    for s, ledger in ledgers.items():
        assert (ledger.spent(scope(s)), ledger.entries(scope(s))) == before[s]
        pd.testing.assert_frame_equal(big_sites[s], frames_before[s])


def test_no_ledger_or_no_budget_is_refused(big_sites, tmp_path):
    privacy = fedstats.RecordDP(epsilon=1.0, rounds=2, bounds=BOUNDS)
    fed = fedstats.Federation.in_process(big_sites)
    with pytest.raises(NoBudgetError, match="no privacy ledger"):
        fedstats.LogisticRegression(FORMULA, levels=LEVELS).fit(fed, privacy=privacy)
    ledgers = make_ledgers(tmp_path, big_sites, study="another-study")
    fed = fedstats.Federation.in_process(big_sites, ledgers=ledgers, study="study")
    with pytest.raises(NoBudgetError, match="no privacy budget is set for this study"):
        fedstats.LogisticRegression(FORMULA, levels=LEVELS).fit(fed, privacy=privacy)


def test_private_fit_needs_declared_levels_and_bounds(big_sites, tmp_path):
    fed = fedstats.Federation.in_process(big_sites, ledgers=make_ledgers(tmp_path, big_sites))
    with pytest.raises(FormulaError, match=r"levels of \['group'\] must be declared"):
        fedstats.LogisticRegression(FORMULA).fit(
            fed, privacy=fedstats.RecordDP(epsilon=1.0, bounds=BOUNDS)
        )
    with pytest.raises(FormulaError, match=r"bounds for the numeric design columns \['x3'\]"):
        fedstats.LogisticRegression(FORMULA, levels=LEVELS).fit(
            fed, privacy=fedstats.RecordDP(epsilon=1.0, bounds={"x1": (-4, 4), "x2": (-4, 4)})
        )


def test_tasks_without_a_private_form_are_refused_under_dp(big_sites, tmp_path):
    ledgers = make_ledgers(tmp_path, big_sites)
    silo = fedstats.Silo("site01", big_sites["site01"], ledger=ledgers["site01"])
    request = {
        "task": "describe",
        "args": {
            "variables": ["x1"],
            "levels_for": [],
            "list_levels": False,
            "levels_known": [],
            "dp": {"noise_multipliers": {"x": 1.0}, "study": "study", "analysis": "a", "note": ""},
        },
    }
    reply = codec.decode(silo.handle(codec.encode(request)))
    assert reply["error"]["type"] == "DisclosureError"
    assert "no differentially private form" in reply["error"]["values"]["reason"]
    assert ledgers["site01"].entries(scope("site01")) == []


def test_private_reply_carries_only_noised_fields(big_sites, tmp_path):
    ledgers = make_ledgers(tmp_path, big_sites)
    fed = fedstats.Federation.in_process(big_sites, ledgers=ledgers)
    spec = fedstats.models.agree.agree_design(fed, FORMULA, analysis="a").spec
    args = {
        "design": spec.to_wire(),
        "beta": np.zeros(spec.n_params),
        "clip": {"row_norm": 3.0, "scaling": np.tile([0.0, 4.0], (spec.n_params, 1))},
        "dp": {
            "noise_multipliers": {"gradient": 2.0, "hessian": 2.0},
            "study": "study",
            "analysis": "a",
            "note": "r1",
        },
    }
    replies = fed.request("logistic.summaries", args, analysis="a")
    for reply in replies.values():
        assert set(reply) == {
            "gradient",
            "hessian",
            "dp_epsilon_spent",
            "dp_budget_epsilon",
            "dp_fixed_seed",
            "dp_ledger_entries",
            "dp_ledger_head",
        }
        np.testing.assert_allclose(reply["hessian"], reply["hessian"].T)


def test_noise_scale_is_sigma_times_sensitivity():
    from fedstats.contract.dp_request import NoisyGroup
    from fedstats.site.private_release import add_noise, draw_noise

    rng = np.random.default_rng(0)
    payload = {"v": np.ones(200_000), "m": np.ones((300, 300))}
    groups = [NoisyGroup(("v",), 2.0), NoisyGroup(("m",), 0.5, symmetric=True)]
    noise = draw_noise(payload, groups, [3.0, 3.0], rng, site="s", task="t")
    noisy = add_noise(payload, noise)
    np.testing.assert_array_equal(noisy["v"], 1.0 + noise["v"])
    assert noisy["v"].std() == pytest.approx(6.0, rel=0.01)
    upper = noisy["m"][np.triu_indices(300)]
    assert upper.std() == pytest.approx(1.5, rel=0.02)
    np.testing.assert_array_equal(noisy["m"], noisy["m"].T)
    with pytest.raises(DisclosureError, match="without noise"):
        draw_noise({"v": np.zeros(3), "secret": 1.0}, groups[:1], [1.0], rng, site="s", task="t")


def test_client_dp_charges_the_coordinator_ledger(big_sites, tmp_path):
    coordinator = accounting.Ledger(tmp_path / "coordinator.ledger")
    coordinator.set_budget(
        accounting.Scope(unit="site", owner="coordinator", study="study"), epsilon=10.0, delta=1e-6
    )
    fed = fedstats.Federation.in_process(big_sites, ledger=coordinator, trusts_client_level=True)
    privacy = fedstats.ClientDP(
        epsilon=5.0, rounds=3, gradient_clip=2000.0, hessian_clip=2000.0, bounds=BOUNDS
    )
    result = fedstats.LogisticRegression(FORMULA, levels=LEVELS).fit(fed, privacy=privacy)
    client_scope = accounting.Scope(unit="site", owner="coordinator", study="study")
    assert len(coordinator.entries(client_scope)) == 3  # one charge per round
    spending = result.privacy.scopes[0]
    assert spending.unit == "site" and spending.epsilon <= 5.0 + 1e-9
    assert coordinator.spent(client_scope).epsilon == pytest.approx(spending.epsilon, abs=1e-9)
    with pytest.raises(fedstats.StudyConfigurationError, match="coordinator ledger"):
        fedstats.LogisticRegression(FORMULA, levels=LEVELS).fit(
            fedstats.Federation.in_process(big_sites), privacy=privacy
        )


def test_sites_that_verify_paths_answer_a_client_level_fit_only_when_they_trust_it(
    big_sites, tmp_path
):
    """A client-level fit's coefficients carry the coordinator's own noise, which no site can
    re-derive: sites that verify paths refuse its exact rounds (rule ``path``) unless they
    trust the coordinator with client-level fits (``trusts_client_level``)."""
    coordinator = accounting.Ledger(tmp_path / "coordinator.ledger")
    coordinator.set_budget(
        accounting.Scope(unit="site", owner="coordinator", study="study"), epsilon=10.0, delta=1e-6
    )
    privacy = fedstats.ClientDP(
        epsilon=1.0, rounds=2, gradient_clip=2000.0, hessian_clip=2000.0, bounds=BOUNDS
    )
    with pytest.raises(fedstats.DisclosureError) as refused:
        fedstats.LogisticRegression(FORMULA, levels=LEVELS).fit(
            fedstats.Federation.in_process(big_sites, ledger=coordinator), privacy=privacy
        )
    assert refused.value.rule == "path"


def test_a_client_level_plan_over_the_coordinators_budget_is_refused_before_any_message(
    big_sites, tmp_path
):
    coordinator = accounting.Ledger(tmp_path / "coordinator.ledger")
    client_scope = accounting.Scope(unit="site", owner="coordinator", study="study")
    coordinator.set_budget(client_scope, epsilon=1.0, delta=1e-6)
    fed = fedstats.Federation.in_process(big_sites, ledger=coordinator, trusts_client_level=True)
    privacy = fedstats.ClientDP(
        epsilon=5.0, rounds=3, gradient_clip=2000.0, hessian_clip=2000.0, bounds=BOUNDS
    )
    with pytest.raises(fedstats.PlannedBudgetError, match="coordinator's client-level budget"):
        fedstats.LogisticRegression(FORMULA, levels=LEVELS).fit(fed, privacy=privacy)
    assert coordinator.entries(client_scope) == []
    assert len(fed.inventory) == 0


def test_private_confidence_intervals_cover_the_non_private_estimate(tmp_path):
    """The reported SEs include the privacy noise: 95% intervals of repeated private fits
    cover the exact MLE (the quantity the noisy run estimates) about as often as they say."""
    sites = fedstats.datasets.synthetic_logistic(n_sites=4, n_per_site=600, n_covariates=3, seed=5)
    fed = fedstats.Federation.in_process(sites)
    exact = fedstats.LogisticRegression(FORMULA).fit(fed)
    covered = []
    for run in range(30):
        ledgers = make_ledgers(tmp_path / str(run), sites, epsilon=10.0)
        fed = fedstats.Federation.in_process(sites, ledgers=ledgers)
        private = fedstats.LogisticRegression(FORMULA, levels=LEVELS).fit(
            fed, privacy=fedstats.RecordDP(epsilon=2.0, rounds=4, bounds=BOUNDS)
        )
        ci = private.conf_int().loc[exact.params.index]
        covered += list((ci["lower"] <= exact.params) & (exact.params <= ci["upper"]))
    assert np.mean(covered) >= 0.85, np.mean(covered)


def test_a_private_only_site_refuses_exact_requests(big_sites, tmp_path):
    policy = fedstats.DisclosurePolicy(require_privacy=True)
    ledgers = make_ledgers(tmp_path, big_sites)
    fed = fedstats.Federation.in_process(big_sites, ledgers=ledgers, disclosure=policy)
    with pytest.raises(DisclosureError, match="releases no categorical levels"):
        fedstats.LogisticRegression(FORMULA).fit(fed)
    with pytest.raises(DisclosureError, match="only as a differentially private release"):
        fedstats.LogisticRegression(FORMULA, levels=LEVELS).fit(fed)
    private = fedstats.LogisticRegression(FORMULA, levels=LEVELS).fit(
        fed, privacy=fedstats.RecordDP(epsilon=1.0, rounds=3, bounds=BOUNDS)
    )
    assert private.privacy is not None
    assert all(ledger.spent(scope(s)).entries == 4 for s, ledger in ledgers.items())


def test_noisy_counts_are_kept_consistent(big_sites, tmp_path):
    fed = fedstats.Federation.in_process(big_sites, ledgers=make_ledgers(tmp_path, big_sites))
    result = fedstats.LogisticRegression(FORMULA, levels=LEVELS).fit(
        fed, privacy=fedstats.RecordDP(noise_multiplier=200.0, rounds=2, bounds=BOUNDS)
    )
    n_obs = result.provenance.n_obs
    for site, events in result.n_events_by_site.items():
        assert 0 <= events <= n_obs[site]
