"""The data-flow table reports every message that left each site."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

import fedstats
from reports import data_flows


def test_data_flows_sum_the_inventory(synthetic_sites):
    fed = fedstats.Federation.in_process(synthetic_sites)
    result = fedstats.LogisticRegression("y ~ x1 + C(group)").fit(fed)
    table = data_flows(fed.inventory, result.provenance.analysis)
    inventory = fed.inventory.to_frame(result.provenance.analysis)
    assert table["bytes_out"].sum() == inventory["reply_bytes"].sum()
    assert table["messages"].sum() == len(inventory)
    site01 = table.loc["site01"]
    assert list(site01.index) == ["describe", "prepare", "logistic.summaries"]
    assert site01.loc["logistic.summaries", "messages"] == result.provenance.rounds
    assert (table["refused"] == 0).all()


def test_refusals_are_counted():
    rng = np.random.default_rng(0)
    frames = {
        "big": pd.DataFrame({"x": rng.normal(size=50), "y": rng.integers(0, 2, 50)}),
        "tiny": pd.DataFrame({"x": rng.normal(size=5), "y": [0, 1, 0, 1, 1]}),
    }
    fed = fedstats.Federation.in_process(frames)
    with pytest.raises(fedstats.DisclosureError):
        fedstats.LogisticRegression("y ~ x").fit(fed)
    table = data_flows(fed.inventory)
    assert table.loc[("tiny", "describe"), "refused"] == 1
    assert table.loc[("big", "describe"), "refused"] == 0


def test_empty_inventory_gives_an_empty_table():
    assert data_flows(fedstats.MessageInventory()).empty
