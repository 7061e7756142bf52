"""The wire of ``logistic.summaries``: score, information and log-likelihood at coefficients."""

from __future__ import annotations

from typing import Any

import numpy as np

from fedstats.contract.task_spec import TaskSpec
from fedstats.contract.tasks.design import checked_beta, spec_from_args
from fedstats.errors import MalformedRequestError
from fedstats.schema import Array, Number

MAX_PRIVATE_LOGIT = 700.0
"""Largest ``B ||beta||`` a clipped (private) request may ask for: every ``|x'beta|`` is then
below it, so every patient's term is finite whatever the rows (``exp(700)`` is finite)."""


def summaries_schema(args: dict[str, Any]) -> dict:
    p = spec_from_args(args).n_params
    if args.get("dp") is not None or "clip" in args:  # from the request, before any charge
        row_norm, _ = clip_from_args(args, p)
        check_linear_predictor_bound(row_norm, checked_beta(None, args, p), MAX_PRIVATE_LOGIT)
    if args.get("dp") is not None:
        if gradient_only(args):
            return {"gradient": Array((p,))}
        return {"gradient": Array((p,)), "hessian": Array((p, p))}
    return {
        "gradient": Array((p,)),
        "hessian": Array((p, p)),
        "loglik": Number(),
        "all_extreme": Number(),
        "any_extreme": Number(),
    }


def gradient_only(args: dict[str, Any]) -> bool:
    """A private request may ask for the score alone (``"release": "gradient"``)."""
    release = args.get("release", "both")
    if release not in ("both", "gradient"):
        raise MalformedRequestError(
            site=None, task=None, reason="'release' must be 'both' or 'gradient'"
        )
    return release == "gradient"


def clip_from_args(args: dict[str, Any], p: int) -> tuple[float, np.ndarray]:
    """The row-norm bound and per-column ``(centre, half-width)`` scaling of a private request."""
    clip = args.get("clip")
    if not isinstance(clip, dict) or set(clip) != {"row_norm", "scaling"}:
        raise MalformedRequestError(
            site=None, task=None, reason="a private request needs 'clip' with row_norm and scaling"
        )
    row_norm = clip["row_norm"]
    scaling = clip["scaling"]
    if not (
        isinstance(row_norm, int | float)
        and not isinstance(row_norm, bool)
        and np.isfinite(row_norm)
        and row_norm > 0
    ):
        raise MalformedRequestError(site=None, task=None, reason="row_norm must be positive")
    if not (
        isinstance(scaling, np.ndarray)
        and scaling.shape == (p, 2)
        and np.isfinite(scaling).all()
        and (scaling[:, 1] > 0).all()
    ):
        raise MalformedRequestError(
            site=None,
            task=None,
            reason=f"scaling must be a {p} x 2 array of (centre, positive half-width)",
        )
    return float(row_norm), scaling.astype(np.float64)


def check_linear_predictor_bound(row_norm: float, beta: np.ndarray, bound: float) -> None:
    """Refuse, from the request alone, coefficients at which a clipped row's ``x'beta`` could
    exceed ``bound``: with ``||x|| <= B``, ``|x'beta| <= B ||beta||`` (Cauchy-Schwarz), so a
    private reply is finite for every row and never fails on one patient's values."""
    reach = row_norm * float(np.linalg.norm(beta))
    if not reach <= bound:
        raise MalformedRequestError(
            site=None,
            task=None,
            reason=f"row_norm x ||beta|| is {reach:.3g}, beyond the {bound:g} a clipped request "
            "may ask for",
        )


TASK = "logistic.summaries"
SUMMARIES = TaskSpec(
    name=TASK,
    schema=summaries_schema,
    description="logistic score, information and log-likelihood at given coefficients",
    private=True,
)
