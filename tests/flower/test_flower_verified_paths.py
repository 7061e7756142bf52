"""Verified paths over Flower: every site re-derives each point, and the fits are unchanged.

The shared study (``conftest.py``): one SuperLink and three SuperNodes (separate
processes), each site pinning the study's roster of node keys with ``[disclosure]
verified_paths = true``. The coordinator relays each round's signed replies through
Flower; every exact round of logistic regression, the Poisson rate model and the
site-stratified Cox model was answered on a verified path, and those fits equal the
embedded runtime (``test_flower_equality.py``: 1e-10, same rounds).
"""

from __future__ import annotations

from flower_study import SITES

PATH_TASKS = {"logistic.summaries", "glm.summaries", "cox.summaries"}


def test_every_exact_round_was_answered_on_a_verified_path(tcga_over_flower) -> None:
    status = tcga_over_flower["status"]
    assert status["site_paths"] == sorted(SITES)
    rounds = [row for row in tcga_over_flower["inventory"] if row["task"] in PATH_TASKS]
    assert {row["task"] for row in rounds} == PATH_TASKS
    assert {row["site"] for row in rounds} == set(SITES)
    assert all(row["status"] == "ok" and row["path"] == "verified" for row in rounds)
