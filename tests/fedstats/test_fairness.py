"""TPR-parity penalty: exact gradients, the smallest sufficient penalty, its path and its cost."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

import fedstats
from fedstats import datasets
from fedstats.models import fairness
from fedstats.models.path_relay import PathRelay


def tpr_gap_sites(seed: int = 4) -> dict[str, pd.DataFrame]:
    """Three sites; group "b"'s positives have lower x1 and the model under-detects them."""
    rng = np.random.default_rng(seed)
    frames = {}
    for site, n in (("north", 3000), ("south", 2500), ("east", 2000)):
        group = rng.choice(["a", "b"], n)
        x1 = rng.normal(size=n) - 0.8 * (group == "b")
        x2 = rng.normal(size=n)
        eta = -0.3 + 1.2 * x1 + 0.5 * x2 + 0.9 * (group == "b")
        y = (rng.random(n) < 1 / (1 + np.exp(-eta))).astype(int)
        frames[site] = pd.DataFrame({"x1": x1, "x2": x2, "group": group, "y": y})
    return frames


def assert_path_decreases(path: pd.DataFrame, tolerance: float = 2e-3) -> None:
    disparity = path["disparity"].to_numpy()
    assert (np.diff(disparity) <= tolerance).all(), path


def test_synthetic_known_gap_is_closed_by_the_smallest_sufficient_penalty():
    fed = fedstats.Federation.in_process(tpr_gap_sites())
    model = fedstats.LogisticRegression("y ~ x1 + x2")  # group-blind model
    result = fairness.minimal_penalty(model, fed, groups="group", delta_max=0.05)
    unpenalised = result.path.iloc[0]
    assert unpenalised["gamma"] == 0.0 and unpenalised["disparity"] > 0.15  # the known gap
    assert result.fit.disparity <= 0.05 and result.gamma > 0
    assert_path_decreases(result.path)
    below = result.path[result.path["gamma"] < result.gamma]
    assert (below["disparity"] > 0.05).all()  # every smaller gamma tried falls short
    assert 0 <= result.auc_cost < 0.1
    print(f"synthetic: gamma* = {result.gamma:.4g}, disparity {unpenalised['disparity']:.3f} -> "
          f"{result.fit.disparity:.3f}, AUC cost {result.auc_cost:.4f}")  # fmt: skip


def test_heart_disease_by_sex():
    """Two sites have 3 women with disease: the study's threshold for this analysis is 3, its
    small-cell threshold the least a site may set (``k_cell = 2``: VA holds two women without
    disease). The reference model crossed with ``disease`` holds cells of one patient
    (Cleveland's ST-T abnormalities, rule ``cross-cells``); the model with the abnormal resting
    ECGs as one level (:data:`fedstats.datasets.HEART_EXACT_FORMULA`) is answered.
    Switzerland, whose cells are smaller still, refuses exact analyses."""
    heart = datasets.heart_disease().only(datasets.HEART_EXACT_SITES)
    policy = fedstats.DisclosurePolicy(min_count=3, k_cell=2)
    fed = fedstats.Federation.in_process(heart.frames, disclosure=policy)
    with pytest.raises(fedstats.DisclosureError) as refused:
        fedstats.LogisticRegression(datasets.HEART_FORMULA).fit(fed)
    assert refused.value.rule == "cross-cells" and "'C(restecg)[T.1]'" in str(refused.value)
    model = fedstats.LogisticRegression(datasets.HEART_EXACT_FORMULA)
    plain = model.fit(fed)
    zero = fairness.fit_penalized(model, fed, groups="sex", gamma=0.0)
    assert np.max(np.abs(zero.params.to_numpy() - plain.params.to_numpy())) < 1e-8
    result = fairness.minimal_penalty(model, fed, groups="sex", delta_max=0.05)
    assert result.fit.disparity <= 0.05
    assert_path_decreases(result.path)
    print(f"heart disease by sex: gamma* = {result.gamma:.4g}, disparity "
          f"{result.path['disparity'].iloc[0]:.3f} -> {result.fit.disparity:.3f}, "
          f"AUC {result.path['auc'].iloc[0]:.3f} -> {result.fit.auc:.3f}")  # fmt: skip
    with pytest.raises(fedstats.DisclosureError, match=r"va.*fewer than 10"):
        small_cells = fedstats.DisclosurePolicy(k_cell=2)  # the default threshold of 10
        fairness.fit_penalized(model, fedstats.Federation.in_process(heart.frames,
                               disclosure=small_cells), groups="sex", gamma=1.0)  # fmt: skip


def test_the_penalty_gradient_is_exact():
    """The sites' soft-TPR gradients against central differences of the objective (at points
    off any fit's path: sites that do not verify paths)."""
    fed = fedstats.Federation.in_process(tpr_gap_sites(), verified_paths=False)
    problem = fairness._Problem(fedstats.LogisticRegression("y ~ x1 + x2"), fed, "group", None,
                                0.25)  # fmt: skip
    beta = np.array([-0.2, 0.9, 0.4])
    gamma = 50.0

    def objective(point: np.ndarray) -> dict:
        return problem.evaluate(point, gamma, point, PathRelay(fed, enabled=False))

    state = objective(beta)
    numeric = np.zeros(3)
    for j in range(3):
        h = np.zeros(3)
        h[j] = 1e-6
        up = objective(beta + h)["state"][0]
        down = objective(beta - h)["state"][0]
        numeric[j] = (up - down) / 2e-6
    assert np.allclose(state["state"][1], numeric, rtol=1e-6, atol=1e-5)


def test_sites_as_groups():
    fed = fedstats.Federation.in_process(tpr_gap_sites())
    fit = fairness.fit_penalized(fedstats.LogisticRegression("y ~ x1 + x2"), fed, groups="site",
                                 gamma=10.0)  # fmt: skip
    assert list(fit.tpr.index) == ["north", "south", "east"]
    assert fit.converged and fit.disparity == pytest.approx(fit.tpr.max() - fit.tpr.min())
