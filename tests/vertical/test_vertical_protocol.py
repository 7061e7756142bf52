"""An approved protocol admits a vertical fit only as a ``vertical_logistic`` analysis.

Linking a site's rows to another site's (a registry's outcomes) is a different study
from fitting the same formula on the site's own rows: a protocol that approves a
``logistic`` analysis of ``y ~ age + x`` does not approve its vertical fit, at the
registry or at the hospital, and one that approves the vertical analysis answers it
exactly (the fit still equals statsmodels on the joined rows).
"""

from __future__ import annotations

import numpy as np
import pytest
import statsmodels.api as sm

import fedstats
from fedstats.errors import ProtocolError
from fedstats.site.protocol import Protocol
from tests.vertical.linked_frames import vertical_study
from tests.vertical.test_vertical_attacks import FORMULA, joined


def protocol(model: str) -> Protocol:
    return Protocol.from_mapping(
        {"title": "linked registry study",
         "analysis": [{"name": "risk", "model": model, "formula": FORMULA}]}
    )  # fmt: skip


def fit(model: str):
    study = vertical_study(
        {"clinic": joined()}, ["y"], seed=4,
        protocols={"registry": protocol(model), "clinic": protocol(model)},
    )  # fmt: skip
    return fedstats.VerticalLogisticRegression(
        FORMULA, outcome_site="registry", covariate_sites=["clinic"], linkage_id="L-clinic"
    ).fit(study.federation)


def test_a_logistic_analysis_does_not_approve_its_vertical_fit():
    with pytest.raises(ProtocolError) as caught:
        fit("logistic")
    assert "vertical_logistic" in str(caught.value)


def test_a_vertical_logistic_analysis_is_answered_exactly():
    result = fit("vertical_logistic")
    frame = joined()
    X = sm.add_constant(frame[["age", "x"]].to_numpy())
    reference = sm.GLM(frame["y"].to_numpy(), X, family=sm.families.Binomial()).fit(tol=1e-12)
    assert np.abs(result.params.to_numpy() - reference.params).max() <= 1e-6
    assert np.abs(result.bse.to_numpy() - reference.bse).max() <= 1e-6
