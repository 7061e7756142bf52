"""Site side of a generalised linear model: score, information and fit sums of one family.

For a family with its canonical link (binomial–logit, Poisson–log,
Gaussian–identity), design ``X``, outcome ``y``, frequency weights ``w``
(1 without weights), offset ``o`` and coefficients ``beta``, with
``eta = X beta + o`` and ``mu = g^{-1}(eta)``, a site returns

* the score ``X^T W (y - mu)``, ``W = diag(w)``,
* the (unit-scale) information ``X^T diag(w V(mu)) X``, ``V`` the family's
  variance function (for a canonical link observed and expected information
  agree, so Newton's method is IRLS; McCullagh & Nelder, *Generalized Linear
  Models*, 2nd ed., 1989, §2.5),
* ``loglik``: ``sum w l(y; mu)`` at unit scale (statsmodels' ``loglike_obs``;
  for the Gaussian family the coordinator profiles the scale out instead),
* ``deviance`` ``sum w d(y; mu)``, Pearson's ``sum w (y - mu)^2 / V(mu)`` and
  the weight total ``sum w`` (the dispersion ``phi`` of a Gaussian or
  quasi-Poisson fit is Pearson's statistic over ``sum w - p``),
* for the binomial family, two separation flags (every / any fitted
  probability within ``1e-10`` of 0 or 1).

All are sums over rows, so the coordinator's totals are the pooled
quantities and the fit equals pooled IRLS (DataSHIELD ``ds.glm``, Gaye et al.,
Int J Epidemiol 2014). The family's link, variance and log-likelihood are
statsmodels' (:mod:`statsmodels.genmod.families`).

What a coordinator could ask beyond the model: the outcome kind fixes what
the site accepts (0/1 for binomial, a count ``>= 0`` for Poisson, a finite
measurement for Gaussian), checked by the site when it builds the design; a
count or measurement outcome is held to the mode and dominance rules of a
design column; the weights to :mod:`fedstats.site.weights`; the family must
match the design's outcome kind; and no private release exists for an
unbounded outcome (refused in :func:`~fedstats.site.handlers.design.site_design`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from fedstats.contract.tasks.design import checked_beta, spec_from_args
from fedstats.contract.tasks.glm import TASK, checked_family
from fedstats.errors import DisclosureError
from fedstats.site.handlers.design import site_design
from fedstats.site.row_blocks import Information, column_blocks
from fedstats.site.task import SiteContext, TaskReply

if TYPE_CHECKING:
    from statsmodels.genmod import families

EXTREME_PROBABILITY = 1e-10


def family_named(name: str) -> families.Family:
    """statsmodels' family of that name, with its canonical link (statsmodels is imported on
    a site's first GLM round, not when the site starts)."""
    from statsmodels.genmod import families

    return {
        "binomial": families.Binomial,
        "poisson": families.Poisson,
        "gaussian": families.Gaussian,
    }[name]()


def summaries(ctx: SiteContext, args: dict[str, Any]) -> TaskReply:
    spec = spec_from_args(args)
    name = checked_family(args, spec)
    family = family_named(name)
    beta = checked_beta(ctx.name, args, spec.n_params)
    design = site_design(ctx, spec)
    y, n, p = design.y, design.n_obs, spec.n_params
    sums = np.zeros(4)  # loglik, deviance, Pearson's statistic, the weight total
    gradient = np.zeros(p)
    information = Information(p)
    binomial, poisson = name == "binomial", name == "poisson"
    fitted = np.empty(n if poisson else 0)  # a Poisson fit's w mu, per row
    all_extreme, any_extreme = True, False
    for rows, block in column_blocks(design.columns, n):
        y_block = y[rows]
        w = np.ones(len(y_block)) if design.weights is None else design.weights[rows]
        eta = np.dot(block, beta)
        if design.offset is not None:
            eta += design.offset[rows]
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            mu = family.link.inverse(eta)
            variance = family.variance(mu)
            residual = y_block - mu
            gradient += np.dot(w * residual, block)
            information.add(block, w * variance)
            sums += (
                float(np.sum(w * family.loglike_obs(y_block, mu, scale=1.0))),
                float(family.deviance(y_block, mu, freq_weights=w)),
                float(np.sum(w * residual**2 / variance)),
                float(w.sum()),
            )
            if poisson:
                np.multiply(w, mu, out=fitted[rows])
        if binomial:
            extreme = np.minimum(mu, 1.0 - mu) < EXTREME_PROBABILITY
            all_extreme &= bool(extreme.all())
            any_extreme |= bool(extreme.any())
    if poisson:
        check_fitted_dominance(ctx, fitted)
    loglik, deviance, pearson, weight_total = (float(v) for v in sums)
    return TaskReply(
        {
            "gradient": gradient,
            "hessian": information.total(),
            "loglik": loglik,
            "deviance": deviance,
            "pearson": pearson,
            "weight_total": weight_total,
            "all_extreme": binomial and all_extreme,
            "any_extreme": binomial and any_extreme,
        },
        contributors=design.n_obs,
    )


def check_fitted_dominance(ctx: SiteContext, fitted: np.ndarray) -> None:
    """Refuse a Poisson reply in which one row carries more than ``1/k`` of the fitted count.

    The attack: the coordinator picks the coefficients. With ``beta`` large on
    one covariate, ``mu_i = exp(x_i' beta)`` of the row with the largest value
    dwarfs all others, and the score ``sum x_i (y_i - mu_i)`` is that row's
    covariate vector times ``-mu_i`` up to a small remainder (its ratios to
    the intercept's entry are the row's values). Every row's share of the
    weights ``w_i mu_i`` of the score and information is therefore held to
    the dominance rule of :mod:`fedstats.site.weights` (rule ``dominance``); a
    fit's own Newton steps meet it except where a step overshoots, and the
    coordinator then halves the step (:class:`fedstats.GLM`).
    """
    total = float(fitted.sum())
    k = ctx.policy.k_cell
    if not np.isfinite(total) or (fitted.size and float(fitted.max()) * k > total * (1 + 1e-12)):
        raise DisclosureError(
            site=ctx.name,
            task=TASK,
            reason=(
                f"at these coefficients one row would carry more than 1/{k} of the fitted count, "
                "so the reply would describe that row"
            ),
            rule="dominance",
        )
