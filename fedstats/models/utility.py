"""When a private result misleads: the checks behind :class:`~fedstats.PrivacyUtilityWarning`.

A private estimate is the true estimate plus privacy noise. Its reported
covariance is the sampling covariance ``V_s`` plus the covariance the noise
adds ``V_n``; the **noise share** of a coefficient is
``V_n[j, j] / (V_s[j, j] + V_n[j, j])``. Three things make a private result
misleading, and each raises the warning, sets a flag on the result and is
carried into its fit record and the compliance report:

* **noise dominates** a coefficient when its noise share exceeds
  :data:`NOISE_DOMINATES` (one half: the privacy noise's variance exceeds the
  sampling variance). Its interval is then mostly noise and its point
  estimate can be far from the non-private one; at twice the sampling
  variance the interval is already ``sqrt(3)`` times as wide.
* a **noisy count** is implausible: a site's released number of patients or
  events is at most 0, or its events reach its patients (noisy counts are
  clamped to ``0 <= events <= patients``). The counts reported, and a
  private Cox fit's starting baseline computed from them, are then unreliable.
* a survival fit's **safe horizon** discards more than
  :data:`DISCARDED_EVENTS` of the events (a fifth): the estimate then
  describes early follow-up only.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence

import numpy as np

from fedstats.errors import PrivacyUtilityWarning
from studyfiles.fit_records import NOISE_DOMINATES

__all__ = [
    "DISCARDED_EVENTS",
    "NOISE_DOMINATES",
    "count_warnings",
    "discarded_events_warning",
    "dominated_names",
    "noise_shares",
    "noise_warnings",
    "warn",
]

DISCARDED_EVENTS = 0.2
"""Share of events a survival fit may lose to safe horizons before it warns."""


def noise_shares(sampling: np.ndarray, noise: np.ndarray) -> np.ndarray:
    """``diag(V_n) / (diag(V_s) + diag(V_n))`` per coefficient (``nan`` where both are 0)."""
    v_s = np.clip(np.diag(np.asarray(sampling, dtype=np.float64)), 0.0, None)
    v_n = np.clip(np.diag(np.asarray(noise, dtype=np.float64)), 0.0, None)
    total = v_s + v_n
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(total > 0, v_n / total, np.nan)


def dominated_names(names: Sequence[object], shares: np.ndarray) -> list[str]:
    """``"name (share)"`` for each entry whose noise share exceeds :data:`NOISE_DOMINATES`."""
    return [
        f"{name} ({share:.0%})"
        for name, share in zip(names, shares, strict=True)
        if np.isfinite(share) and share > NOISE_DOMINATES
    ]


def noise_warnings(names: Sequence[str], shares: np.ndarray) -> list[str]:
    """One warning naming every coefficient whose noise share exceeds :data:`NOISE_DOMINATES`."""
    dominated = dominated_names(names, shares)
    if not dominated:
        return []
    return [
        "privacy noise dominates the variance of "
        + ", ".join(dominated)
        + f" (noise share above {NOISE_DOMINATES:.0%}): these estimates can be far from the "
        "non-private ones; read their intervals, not their point estimates, or spend more "
        "budget"
    ]


def count_warnings(
    n_obs: Mapping[str, float],
    n_events: Mapping[str, float] | None = None,
    *,
    used_for: str | None = None,
) -> list[str]:
    """Warnings for noisy counts that cannot be true, naming each site: patients or events
    at most 0, or events as many as the patients (noisy counts are clamped to
    ``0 <= events <= patients``, so a count at either end was pushed there by noise).
    Counts print rounded to whole patients; ``used_for`` names what the fit computed from
    them (e.g. a Cox fit's starting baseline), said in the warning."""
    problems = []
    for site, n in n_obs.items():
        events = None if n_events is None else n_events.get(site)
        if n <= 0:
            problems.append(f"{site}: {n:.0f} patients")
        elif events is not None and events <= 0:
            problems.append(f"{site}: {events:.0f} events")
        elif events is not None and events >= n:
            problems.append(f"{site}: {events:.0f} events among {n:.0f} patients")
    if not problems:
        return []
    return [
        "noisy counts outside plausible bounds ("
        + "; ".join(problems)
        + "): the noise swamps these sites' counts, so the patients and events reported for "
        "them are unreliable" + (f", and so is {used_for}, computed from them" if used_for else "")
    ]


def discarded_events_warning(used: float, total: float) -> list[str]:
    """A warning when the events a survival fit used are fewer than ``(1 - DISCARDED_EVENTS)``
    of the events the sites hold."""
    if total <= 0 or used >= (1 - DISCARDED_EVENTS) * total:
        return []
    return [
        f"the fit used {used:,.0f} of {total:,.0f} events ({used / total:.0%}): follow-up was "
        "censored at each site's safe horizon (fewer than k patients behind a later sum), so "
        "the estimate describes early follow-up only; use a coarser grid or stratify by site"
    ]


def warn(messages: Sequence[str], stacklevel: int = 3) -> None:
    """Raise :class:`~fedstats.PrivacyUtilityWarning` once per message."""
    for message in messages:
        warnings.warn(message, PrivacyUtilityWarning, stacklevel=stacklevel)
