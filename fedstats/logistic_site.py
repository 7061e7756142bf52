"""Site side of logistic regression: the summed score, information and log-likelihood.

For the design ``X``, outcome ``y``, offset ``o`` and coefficients ``beta``
(with ``eta = X beta + o`` and ``mu = expit(eta)``), a site returns

* gradient ``X^T (y - mu)``,
* Hessian (Fisher information) ``X^T diag(mu (1 - mu)) X``,
* log-likelihood ``sum y eta - log(1 + exp(eta))``,

which are sums over patients, so the coordinator's totals equal the pooled
quantities exactly (the federated Newton method of DataSHIELD ``ds.glm``,
Gaye et al. 2014, and vantage6 ``v6-glm-py``, Cellamare et al. 2022). The
reply also carries two flags for separation diagnostics: whether every /
any patient's fitted probability lies within ``1e-10`` of 0 or 1.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from scipy.special import expit

from fedstats.errors import MalformedRequestError
from fedstats.schema import Array, Number
from fedstats.site_design import site_design, spec_from_args
from fedstats.task import SiteContext, TaskReply

EXTREME_PROBABILITY = 1e-10


def summaries_schema(args: dict[str, Any]) -> dict:
    p = spec_from_args(args).n_params
    return {
        "gradient": Array((p,)),
        "hessian": Array((p, p)),
        "loglik": Number(),
        "all_extreme": Number(),
        "any_extreme": Number(),
    }


def summaries(ctx: SiteContext, args: dict[str, Any]) -> TaskReply:
    spec = spec_from_args(args)
    beta = args.get("beta")
    if not (isinstance(beta, np.ndarray) and beta.shape == (spec.n_params,)):
        raise MalformedRequestError(
            site=ctx.name, task=None, reason=f"'beta' must be an array of {spec.n_params} numbers"
        )
    if not np.isfinite(beta).all():
        raise MalformedRequestError(site=ctx.name, task=None, reason="'beta' has non-finite values")
    design = site_design(ctx, spec)
    X, y = design.X, design.y
    eta = X @ beta.astype(np.float64)
    if design.offset is not None:
        eta = eta + design.offset
    mu = expit(eta)
    weights = mu * (1.0 - mu)
    gradient = X.T @ (y - mu)
    hessian = X.T @ (X * weights[:, None])
    loglik = float(np.sum(y * eta - np.logaddexp(0.0, eta)))
    extreme = np.minimum(mu, 1.0 - mu) < EXTREME_PROBABILITY
    return TaskReply(
        {
            "gradient": gradient,
            "hessian": hessian,
            "loglik": loglik,
            "all_extreme": bool(extreme.all()),
            "any_extreme": bool(extreme.any()),
        },
        contributors=design.n_obs,
    )
