"""Site side of the TPR-parity penalty: per-group soft true-positive sums and their gradients.

For the agreed binary design, coefficients ``beta`` (``eta = x' beta``), a
temperature ``T`` and groups (levels of a column, or the sites themselves),
a site returns for every group ``g``, over its patients with ``y = 1``:

* ``positives_g``: their number;
* ``soft_g = sum sigmoid(eta_i / T)``: the smooth count of true positives
  (Bechavod & Ligett, 2017; Zafar et al., AISTATS 2017, use such smooth
  surrogates of rates);
* ``gradient_g = sum sigmoid(eta_i / T) (1 - sigmoid(eta_i / T)) x_i / T``;

with ``"likelihood": true`` (every round of a fit: one request per point, the
point a path rule re-derives, :mod:`fedstats.contract.fairness`) the logistic
likelihood's sums too: ``loglik``, ``score = X'(y - mu)`` and ``information =
X' diag(mu (1 - mu)) X``, as ``logistic.summaries`` returns them; and, when
asked (``"auc": true``, once per fit rather than every round: it costs a
sort), the pair counts of its within-site AUC (positive-negative
pairs ordered by ``eta``; ties count 1/2). A group holding between 1 and ``k - 1``
positives at the site is refused: its rate would describe fewer than ``k``
patients. Counts of true positives at a threshold are not released: they
could be small cells within a group.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from scipy.special import expit

from fedstats.contract.tasks.design import checked_beta, spec_from_args
from fedstats.contract.tasks.fairness import SITE_GROUPS, TASK, _arguments, _flag, _wants_auc
from fedstats.cox_math import concordance_counts
from fedstats.errors import DisclosureError, MalformedRequestError, MissingColumnError
from fedstats.site.handlers.design import as_agreed_categorical, site_design
from fedstats.site.handlers.logistic import log_likelihood, score_and_information
from fedstats.site.task import SiteContext, TaskReply


def summaries(ctx: SiteContext, args: dict[str, Any]) -> TaskReply:
    spec = spec_from_args(args)
    levels, group, temperature = _arguments(args)
    beta = checked_beta(ctx.name, args, spec.n_params)
    design = site_design(ctx, spec)
    eta = design.X @ beta
    if design.offset is not None:
        eta = eta + design.offset
    codes = _group_codes(ctx, design, group, levels)
    positive = design.y == 1
    k = ctx.policy.min_count
    G, p = len(levels), spec.n_params
    counts = np.bincount(codes[positive], minlength=G).astype(np.float64)
    small = (counts > 0) & (counts < k)
    if small.any():
        names = [str(levels[g]) for g in np.flatnonzero(small)]
        raise DisclosureError(
            site=ctx.name,
            task=TASK,
            reason=f"group(s) {names} hold fewer than {k} patients with the outcome here",
        )
    soft_each = expit(eta / temperature)
    soft = np.bincount(codes[positive], weights=soft_each[positive], minlength=G)
    slope = soft_each * (1.0 - soft_each) / temperature
    gradient = np.zeros((G, p))
    np.add.at(gradient, codes[positive], slope[positive, None] * design.X[positive])
    payload: dict[str, Any] = {"positives": counts, "soft": soft, "gradient": gradient}
    if _flag(args, "likelihood"):
        score, information = score_and_information(design.X, design.y, expit(eta))
        payload |= {
            "loglik": log_likelihood(design.y, eta),
            "score": score,
            "information": information,
        }
    if _wants_auc(args):
        # AUC as Harrell's C of "time" 1 - y: a positive "fails" before every negative.
        concordant, tied, pairs = concordance_counts(1.0 - design.y, design.y, eta)
        payload |= {"auc_concordant": concordant, "auc_tied": tied, "auc_pairs": pairs}
    return TaskReply(payload, contributors=design.n_obs)


def _group_codes(ctx: SiteContext, design: Any, group: str, levels: list) -> np.ndarray:
    if group == SITE_GROUPS:
        if ctx.name not in levels:
            raise MalformedRequestError(
                site=ctx.name, task=None, reason="this site is not among the groups"
            )
        return np.full(design.n_obs, levels.index(ctx.name), dtype=np.int64)
    if group not in ctx.frame.columns:
        raise MissingColumnError(site=ctx.name, column=group)
    values = ctx.frame[group].iloc[design.rows]
    agreed = as_agreed_categorical(ctx.name, group, values, tuple(levels))
    return np.asarray(agreed.codes, dtype=np.int64)
