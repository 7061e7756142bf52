"""What statsmodels, lifelines and Opacus users reach for: ``plot()`` returning a figure
everywhere, and one client-level option named where the other belongs."""

from __future__ import annotations

import matplotlib.figure
import pandas as pd
import pytest

import fedstats
from fedstats import datasets

HEART = datasets.heart_disease().only(("cleveland", "hungary"))


@pytest.fixture(scope="module")
def fed():
    return fedstats.Federation.in_process(HEART.frames)


def test_a_fits_plot_is_a_figure_with_one_row_per_coefficient_but_the_intercept(fed):
    fit = fedstats.LogisticRegression("disease ~ age + sex + C(cp) + chol").fit(fed)
    figure = fit.plot()
    assert isinstance(figure, matplotlib.figure.Figure)
    (ax,) = figure.axes
    labels = [tick.get_text() for tick in ax.get_yticklabels()]
    assert sorted(labels) == sorted(t for t in fit.params.index if t != "Intercept")
    km = fedstats.KaplanMeier("chol", "disease", width=100, horizon=400)
    assert isinstance(km.fit(fed).plot(), matplotlib.figure.Figure)


def test_a_statistical_fit_given_dpfedavg_names_clientdp(fed):
    option = fedstats.DPFedAvg(noise_multiplier=1.0, clip=1.0, expected_sites=2)
    with pytest.raises(fedstats.StudyConfigurationError, match=r"fedstats\.ClientDP\(epsilon="):
        fedstats.LogisticRegression("disease ~ age + sex").fit(fed, privacy=option)


def test_a_training_given_clientdp_names_dpfedavg(fed):
    pytest.importorskip("torch")
    trainer = fedstats.FederatedTrainer(
        "mlp", {"hidden": [4]}, formula="disease ~ age + sex",
        bounds={"age": (20, 90), "sex": (0, 1)}, rounds=1, local_steps=1, progress=False,
    )  # fmt: skip
    option = fedstats.ClientDP(epsilon=1.0, gradient_clip=1.0, hessian_clip=1.0)
    with pytest.raises(fedstats.StudyConfigurationError, match=r"DPFedAvg\.for_budget"):
        trainer.fit(fed, privacy=option)
    assert len(fed.inventory) == 0 or all(m.task != "deep.train" for m in fed.inventory)


def test_kaplan_meier_takes_privacy_in_fit_as_every_model_does_and_strata_as_r_names_groups(
    tmp_path,
):
    """``fit(fed, privacy=...)`` releases what ``KaplanMeier(..., privacy=...)`` releases (the
    same seeded noise), both at once is refused; ``strata=`` is ``group=``."""
    import accounting

    frames = {s: f for s, f in datasets.tcga_brca().frames.items() if s in ("region_0", "region_1")}
    option = fedstats.RecordDP(epsilon=1.0, delta=1e-5)

    runs = iter(range(10))

    def fed():
        ledgers, run = {}, next(runs)
        for site in frames:
            ledgers[site] = accounting.Ledger(tmp_path / f"{site}-{run}.ledger")
            scope = accounting.Scope(unit="patient", owner=site, study="km")
            ledgers[site].set_budget(scope, epsilon=5.0, delta=1e-5)
        return fedstats.Federation.in_process(frames, study="km", ledgers=ledgers, noise_seed=3)

    grid = {"width": 730, "horizon": 3650}
    in_fit = fedstats.KaplanMeier("time", "event", **grid).fit(fed(), privacy=option)
    in_model = fedstats.KaplanMeier("time", "event", privacy=option, **grid).fit(fed())
    assert in_fit.survival_function_.notna().to_numpy().any()  # values, not only NaN
    pd.testing.assert_frame_equal(in_fit.survival_function_, in_model.survival_function_)
    assert in_fit.analysis and in_fit.analysis.startswith("kaplan_meier-")
    with pytest.raises(fedstats.StudyConfigurationError, match="give it once"):
        fedstats.KaplanMeier("time", "event", privacy=option, **grid).fit(
            fed(), privacy=fedstats.RecordDP(epsilon=2.0, delta=1e-5)
        )
    exact = fedstats.Federation.in_process(
        frames, disclosure=fedstats.DisclosurePolicy(min_count=1)
    )
    by_strata = fedstats.KaplanMeier("time", "event", strata="ajcc_pathologic_n_n0_i", **grid)
    by_group = fedstats.KaplanMeier("time", "event", group="ajcc_pathologic_n_n0_i", **grid)
    curves = by_strata.fit(exact).survival_function_
    assert curves.shape[1] == 2 and curves.notna().to_numpy().any()
    pd.testing.assert_frame_equal(curves, by_group.fit(exact).survival_function_)
