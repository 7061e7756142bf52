"""Result objects: statsmodels-style tables, HTML for Jupyter, provenance."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

import fedstats
from fedstats import datasets


@pytest.fixture(scope="module")
def result(heart_exact):
    """The reference model with the abnormal resting ECGs as one level, at the least small-cell
    threshold a site may set (VA's cross-cell of sex and disease holds two women)."""
    small_cells = fedstats.DisclosurePolicy(k_cell=2)
    fed = fedstats.Federation.in_process(heart_exact.frames, study="heart", disclosure=small_cells)
    return fedstats.LogisticRegression(datasets.HEART_EXACT_FORMULA).fit(fed)


def test_params_are_named_series_keeping_column_names(result):
    assert isinstance(result.params, pd.Series)
    assert {"Intercept", "age", "sex", "chol", "C(cp)[T.4]", "I(restecg > 0)"} <= set(
        result.params.index
    )
    for attribute in ("bse", "zvalues", "tvalues", "pvalues"):
        assert list(getattr(result, attribute).index) == list(result.params.index)


def test_to_frame_and_conf_int_agree(result):
    table = result.to_frame(alpha=0.1)
    assert list(table.columns) == ["coef", "std err", "z", "P>|z|", "[90% lower", "90% upper]"]
    np.testing.assert_allclose(table["[90% lower"], result.conf_int(0.1)["lower"])
    with pytest.raises(ValueError):
        result.conf_int(1.5)


def test_summary_text_and_html(result):
    text = result.summary()
    assert "Federated logistic regression" in text
    assert "Log-likelihood:" in text and "-290.9503" in text  # statsmodels pooled: -290.95029
    assert "odds ratio" in text and "C(cp)[T.4]" in text
    assert "cleveland=303" in text
    html = result._repr_html_()
    assert html.startswith("<div") and "<table" in html and "C(cp)[T.4]" in html


def test_provenance_counts_sites_rounds_and_bytes(result):
    prov = result.provenance
    assert prov.study == "heart"
    assert prov.sites == ("cleveland", "hungary", "va")
    assert prov.rounds == result.iterations >= 4
    assert prov.messages == 3 * (2 + prov.rounds)
    assert prov.request_bytes > 0 and prov.reply_bytes > 0
    assert list(prov.bytes_by_site.index) == sorted(prov.sites)
    assert prov.finished >= prov.started
    assert result.n_events_by_site.to_dict() == {
        "cleveland": 139,
        "hungary": 98,
        "va": 101,
    }
    assert result.n_obs_by_site.to_dict() == prov.n_obs


def test_cov_params_is_symmetric_and_matches_bse(result):
    cov = result.cov_params()
    np.testing.assert_allclose(cov, cov.T)
    np.testing.assert_allclose(np.sqrt(np.diag(cov)), result.bse)
