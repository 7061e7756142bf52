"""Fits over Flower (a SuperLink, three SuperNodes: separate processes) equal the embedded runtime.

Each site's SuperNode reads its own site.toml (frame, ledger, policy); the
coordinator's ServerApp makes the fits of study.toml through the codec's
bytes carried in Flower messages. The same fits on ``Federation.in_process``
with the same frames are the reference: coefficients, standard errors and
log-likelihoods agree to 1e-10. (The study, shared with
``test_flower_models.py``, is made once in ``conftest.py``.)
"""

from __future__ import annotations

import json

import numpy as np
from flower_study import SITES

from fedstats.jobs.site_journal import SiteJournal, reconcile


def test_flower_fits_equal_the_embedded_runtime(tcga_over_flower) -> None:
    """Logistic regression, a Poisson rate model and site-stratified Cox: Flower vs
    in-process, |diff| <= 1e-10."""
    for name in ("event_logistic", "death_rate", "survival_cox"):
        over_flower = tcga_over_flower["over_flower"][name]
        reference = tcga_over_flower["embedded"][name]
        assert list(over_flower["params"]) == list(reference["params"])
        for key in ("params", "bse"):
            a = np.array(list(over_flower[key].values()))
            b = np.array(list(reference[key].values()))
            assert np.max(np.abs(a - b)) <= 1e-10, (name, key, a - b)
        assert abs(over_flower["llf"] - reference["llf"]) <= 1e-10
        assert over_flower["provenance"]["rounds"] == reference["provenance"]["rounds"]


def test_every_message_went_through_flower_and_every_site_journaled_it(tcga_over_flower) -> None:
    """The inventory counts the fingerprint check and every fit's messages; each site's
    journal records as many answered requests as the coordinator sent it, and reconciles."""
    status = tcga_over_flower["status"]
    inventory = [
        json.loads(line)
        for line in (tcga_over_flower["out"] / f"inventory-{status['run_id']}.jsonl")
        .read_text()
        .splitlines()
    ]
    assert len(inventory) == status["messages"]
    assert inventory[0]["task"] == "harmonize.fingerprint"
    assert all(row["status"] == "ok" for row in inventory)
    for site in SITES:
        folder = tcga_over_flower["site_configs"][site].parent
        journal = SiteJournal(folder / "work" / "journal.jsonl")
        sent = [row for row in inventory if row["site"] == site]
        answered = [r for r in journal.records() if r["event"] == "answered"]
        assert len(answered) == len(sent)
        assert [r["task"] for r in answered] == [row["task"] for row in sent]
        assert reconcile(journal, None).ok
