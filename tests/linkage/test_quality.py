"""Linkage quality against a hand computation; report counts below k suppressed."""

from __future__ import annotations

import math

import numpy as np
import pytest

from linkage import quality


def test_precision_recall_f1_by_hand():
    linked = [(0, 0), (1, 1), (2, 3)]
    truth = [(0, 0), (1, 1), (2, 2), (3, 3)]
    measured = quality.quality(linked, truth)
    # 2 of 3 links are true; 2 of 4 true matches are found; F1 = 2(2/3)(1/2)/(2/3+1/2) = 4/7
    assert (measured.true_positives, measured.linked, measured.true_matches) == (2, 3, 4)
    assert measured.precision == pytest.approx(2 / 3)
    assert measured.recall == pytest.approx(1 / 2)
    assert measured.f1 == pytest.approx(4 / 7)


def test_nothing_linked_or_nothing_true_gives_nan_not_an_error():
    assert math.isnan(quality.quality([], [(0, 0)]).precision)
    assert quality.quality([], [(0, 0)]).recall == 0
    assert math.isnan(quality.quality([(0, 0)], []).recall)


def test_the_histogram_counts_by_hand_and_suppresses_small_cells():
    scores = np.array([0.81, 0.83, 0.95, 0.99, 1.0])
    # edges 0.8, 0.9, 1.0: two scores in the first bin, three (1.0 included) in the last
    open_counts = quality.score_histogram(scores, 0.8, bins=2, k=1)
    assert [b["count"] for b in open_counts] == [2, 3]
    assert [(b["low"], b["high"]) for b in open_counts] == [(0.8, 0.9), (0.9, 1.0)]
    report = quality.score_histogram(scores, 0.8, bins=2, k=3)
    assert [b["count"] for b in report] == [None, 3]
    empty_bin = quality.score_histogram(np.array([0.95] * 5), 0.8, bins=2, k=3)
    assert [b["count"] for b in empty_bin] == [0, 5]  # zero reveals no one: kept


def test_suppress_covers_exactly_one_to_k_minus_one():
    assert [quality.suppress(c, 5) for c in range(7)] == [0, None, None, None, None, 5, 6]
    with pytest.raises(ValueError):
        quality.score_histogram(np.array([0.9]), 0.8, k=0)
