"""A result's ``summary()`` shows as a table in a notebook, as statsmodels' does, and is still
text: a bare ``res.summary()`` in Jupyter used to show an escaped string full of ``\\n``."""

from __future__ import annotations

import numpy as np
import pandas as pd

import fedstats
from fedstats.models.summary import Summary


def sites() -> dict[str, pd.DataFrame]:
    rng = np.random.default_rng(4)
    out = {}
    for name in ("a", "b"):
        x = rng.normal(size=300)
        time = np.ceil(rng.exponential(200 / np.exp(0.5 * x)))
        out[name] = pd.DataFrame(
            {"x": x, "y": (rng.random(300) < 1 / (1 + np.exp(-x))).astype(int),
             "time": np.minimum(time, 400), "event": (time <= 400).astype(int)}
        )  # fmt: skip
    return out


def test_every_summary_is_text_that_displays_as_a_table():
    fed = fedstats.Federation.in_process(sites())
    summaries = [
        fedstats.LogisticRegression("y ~ x").fit(fed).summary(),
        fedstats.CoxPH("Surv(time, event) ~ x").fit(fed).summary(),
        fedstats.KaplanMeier("time", "event", width=100, horizon=400).fit(fed).summary(),
    ]
    for summary in summaries:
        assert isinstance(summary, Summary) and isinstance(summary, str)
        assert repr(summary) == str(summary) and "\\n" not in repr(summary)
        assert "\n" in repr(summary)  # lines, not an escaped one-liner
        assert summary._repr_html_().startswith("<div class='fedstats-summary'>")
        assert "<table" in summary.as_html() and summary.as_text() == str(summary)
        assert "Federated" in summary and summary.splitlines()[0].startswith("=")


def test_a_private_fits_header_says_what_was_not_released(tmp_path):
    """A private fit releases no log-likelihood: its header says so instead of ``nan``."""
    import accounting

    frames = sites()
    ledgers = {}
    for name in frames:
        ledgers[name] = accounting.Ledger(tmp_path / f"{name}.ledger")
        scope = accounting.Scope(unit="patient", owner=name, study="display")
        ledgers[name].set_budget(scope, epsilon=3.0, delta=1e-5)
    fed = fedstats.Federation.in_process(frames, study="display", ledgers=ledgers)
    private = fedstats.LogisticRegression("y ~ x").fit(
        fed, privacy=fedstats.RecordDP(epsilon=1.0, delta=1e-5, bounds={"x": (-4.0, 4.0)})
    )
    header = private.summary().split("-" * 20, 1)[0]
    assert "Log-likelihood:" in header and "nan" not in header.lower()
    assert header.count("not released (private fit)") == 3  # log-likelihood, deviance, AIC
