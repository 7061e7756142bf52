"""Linkage quality: precision, recall and F1 against known truth; a score histogram otherwise.

With true matches T and linked pairs L (sets of position pairs):
precision = |L & T| / |L|, recall = |L & T| / |T|, F1 = 2 P R / (P + R)
(Christen 2012, "Data Matching", ch. 7). Without truth, the histogram of linked pairs'
Dice scores shows how close links are to the threshold. Anything meant for a report
suppresses counts from 1 to k - 1 (they are written as None).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Quality:
    """Precision, recall and F1 of a linkage, with the counts they come from."""

    true_positives: int
    linked: int
    true_matches: int

    @property
    def precision(self) -> float:
        """``|L & T| / |L|`` (nan when nothing is linked)."""
        return self.true_positives / self.linked if self.linked else float("nan")

    @property
    def recall(self) -> float:
        """``|L & T| / |T|`` (nan when there is no true match)."""
        return self.true_positives / self.true_matches if self.true_matches else float("nan")

    @property
    def f1(self) -> float:
        """``2 P R / (P + R)``: the harmonic mean of precision and recall."""
        p, r = self.precision, self.recall
        return 2 * p * r / (p + r) if p + r > 0 else float("nan")


def quality(linked: Iterable[tuple[int, int]], truth: Iterable[tuple[int, int]]) -> Quality:
    """Compare linked position pairs with the true matches.

    Parameters
    ----------
    linked
        The linkage's (first position, second position) pairs.
    truth
        The true matches, as the same kind of pairs.

    Returns
    -------
    Quality
    """
    linked_set = set(linked)
    truth_set = set(truth)
    return Quality(len(linked_set & truth_set), len(linked_set), len(truth_set))


def score_histogram(
    scores: np.ndarray, threshold: float, *, bins: int = 10, k: int
) -> list[dict[str, float | int | None]]:
    """Counts of linked pairs by Dice score, from the threshold to 1, for a report.

    Parameters
    ----------
    scores
        Linked pairs' Dice scores (:attr:`linkage.matching.PartyLinks.scores`).
    threshold
        The schema's threshold: the histogram's lower edge.
    bins
        Equal-width bins on ``[threshold, 1]``.
    k
        The disclosure threshold: a count from 1 to k - 1 is written as None.

    Returns
    -------
    list of dict
        ``{"low", "high", "count"}`` per bin, lowest first.
    """
    if k < 1:
        raise ValueError(f"k must be at least 1, got {k}")
    if bins < 1:
        raise ValueError(f"bins must be at least 1, got {bins}")
    edges = np.linspace(threshold, 1.0, bins + 1)
    counts, _ = np.histogram(np.asarray(scores, dtype=float), bins=edges)
    return [
        {"low": float(lo), "high": float(hi), "count": suppress(int(c), k)}
        for lo, hi, c in zip(edges[:-1], edges[1:], counts, strict=True)
    ]


def suppress(count: int, k: int) -> int | None:
    """A count for a report: None when it covers 1 to k - 1 records, else the count."""
    return None if 0 < count < k else count
