"""What statsmodels, lifelines and Opacus users reach for: ``plot()`` returning a figure
everywhere, and one client-level option named where the other belongs."""

from __future__ import annotations

import matplotlib.figure
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
