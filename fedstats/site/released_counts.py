"""The patient counts a site released privately when it agreed a design, kept for its training.

Under record-level DP the design agreement's counts are one charged Gaussian
release (:func:`fedstats.site.handlers.design.prepare_private_release`), and
federated averaging weighs each site's DP-SGD update by its released count
``n_k`` (clamped at zero: :func:`fedstats.deep.training.aggregation.client_weights`).
A private training on a verified path (:mod:`fedstats.site.verified_paths`)
re-derives every round from the signed replies, so each reply must state the
weight it was averaged with: the site repeats the count it already released for
the same study and analysis, which costs no budget (post-processing of a
release) and tells no one anything new. The site never lets the coordinator
state its count for it.
"""

from __future__ import annotations

from typing import Any

from fedstats.contract.dp_request import DpRequest
from fedstats.site.task import SiteContext

CACHE_KEY = "released_counts"
COUNT_FIELD = "n_obs"


def remember(ctx: SiteContext, dp: DpRequest, payload: dict[str, Any]) -> None:
    """Keep the noisy ``n_obs`` of a private ``prepare`` reply as it left the site."""
    value = payload.get(COUNT_FIELD)
    if isinstance(value, int | float) and not isinstance(value, bool):
        ctx.cache.setdefault(CACHE_KEY, {})[(dp.study, dp.analysis)] = max(0.0, float(value))


def recalled(ctx: SiteContext, dp: DpRequest) -> float | None:
    """The count this site released for ``dp``'s study and analysis (``None``: none)."""
    return ctx.cache.get(CACHE_KEY, {}).get((dp.study, dp.analysis))
