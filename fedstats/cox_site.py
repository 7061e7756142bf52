"""Site side of the Cox model: the partial likelihood of this site's strata.

For the agreed survival design and coefficients ``beta``, a site returns its
log partial likelihood, score and information (:mod:`fedstats.cox_math`),
summed over its own strata. With the site as a stratum (or strata within
sites) the federation's partial likelihood is the sum over sites, so the
coordinator's Newton iterates are those of the pooled stratified fit. The
reply is ``p + p^2 + 1`` numbers whatever the number of patients: no event
time, risk set or individual value leaves the site.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import numpy as np

from fedstats.cox_math import TIES, SortedSurvival, partial_likelihood, sort_survival
from fedstats.errors import MalformedRequestError
from fedstats.schema import Array, Number
from fedstats.site_design import site_design, spec_from_args
from fedstats.task import SiteContext, TaskReply

_CACHE_SIZE = 4


def summaries_schema(args: dict[str, Any]) -> dict:
    spec = spec_from_args(args)
    if spec.outcome_kind != "survival":
        raise MalformedRequestError(site=None, task=None, reason="the design is not a survival one")
    if args.get("ties") not in TIES:
        raise MalformedRequestError(site=None, task=None, reason=f"'ties' must be one of {TIES}")
    if args.get("dp") is not None:
        raise MalformedRequestError(
            site=None, task=None, reason="differentially private Cox fits are not offered yet"
        )
    p = spec.n_params
    return {"gradient": Array((p,)), "hessian": Array((p, p)), "loglik": Number()}


def summaries(ctx: SiteContext, args: dict[str, Any]) -> TaskReply:
    """Log partial likelihood, score (``gradient``) and information (``hessian``) at ``beta``."""
    spec = spec_from_args(args)
    beta = args.get("beta")
    if not (isinstance(beta, np.ndarray) and beta.shape == (spec.n_params,)):
        raise MalformedRequestError(
            site=ctx.name, task=None, reason=f"'beta' must be an array of {spec.n_params} numbers"
        )
    if not np.isfinite(beta).all():
        raise MalformedRequestError(site=ctx.name, task=None, reason="'beta' has non-finite values")
    data = _sorted(ctx, args)
    result = partial_likelihood(data, beta.astype(np.float64), args["ties"])
    return TaskReply(
        {"gradient": result.score, "hessian": result.information, "loglik": result.loglik},
        contributors=len(data.time),
    )


def _sorted(ctx: SiteContext, args: dict[str, Any]) -> SortedSurvival:
    """The site's survival design, sorted once per design and cached."""
    spec = spec_from_args(args)
    cache: OrderedDict = ctx.cache.setdefault("survival", OrderedDict())
    if spec.key in cache:
        cache.move_to_end(spec.key)
        return cache[spec.key]
    design = site_design(ctx, spec)
    if design.time is None or design.stratum is None:
        raise MalformedRequestError(site=ctx.name, task=None, reason="not a survival design")
    data = sort_survival(design.X, design.time, design.y, design.stratum)
    cache[spec.key] = data
    while len(cache) > _CACHE_SIZE:
        cache.popitem(last=False)
    return data
