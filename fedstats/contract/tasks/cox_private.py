"""The wire of ``cox.piecewise_summaries``: the private Cox model's clipped sums."""

from __future__ import annotations

from typing import Any

import numpy as np

from fedstats.contract.design import counting_outcome
from fedstats.contract.task_spec import TaskSpec
from fedstats.contract.tasks.design import checked_beta, spec_from_args
from fedstats.contract.tasks.logistic import (
    check_linear_predictor_bound,
    clip_from_args,
    gradient_only,
)
from fedstats.contract.tasks.survival import checked_grid
from fedstats.errors import MalformedRequestError
from fedstats.schema import Array

TASK = "cox.piecewise_summaries"


MAX_LOG_HAZARD = 50.0
"""Largest ``|alpha_k|`` and ``B ||beta||`` a request may ask for: every ``mu_ik`` is then below
``exp(100)`` and every term of the score and information finite, whatever the rows."""


def summaries_schema(args: dict[str, Any]) -> dict:
    spec = spec_from_args(args)
    if spec.outcome_kind != "survival" or spec.strata:
        raise MalformedRequestError(
            site=None, task=None, reason="the private Cox model takes a survival design without "
            "strata columns",
        )  # fmt: skip
    if counting_outcome(spec.outcome) is not None:
        raise MalformedRequestError(
            site=None, task=None, reason="the private Cox model clips one row as one patient, so "
            f"it is not offered for {spec.outcome}, whose patients may have several rows",
        )  # fmt: skip
    if args.get("dp") is None:
        raise MalformedRequestError(
            site=None, task=None, reason=f"{TASK} is a differentially private release: "
            "the request needs a 'dp' block",
        )  # fmt: skip
    grid = checked_grid(args)
    dim = len(grid) + spec.n_params
    row_norm = _bounds(args, spec.n_params)[0]  # every argument, before any charge
    check_linear_predictor_bound(row_norm, checked_beta(None, args, spec.n_params), MAX_LOG_HAZARD)
    _alpha(args, len(grid))
    if gradient_only(args):
        return {"gradient": Array((dim,))}
    return {"gradient": Array((dim,)), "hessian": Array((dim, dim))}


def _alpha(args: dict[str, Any], intervals: int) -> np.ndarray:
    alpha = args.get("alpha")
    if not (
        isinstance(alpha, np.ndarray) and alpha.shape == (intervals,) and np.isfinite(alpha).all()
    ):
        raise MalformedRequestError(
            site=None, task=TASK, reason=f"'alpha' must be {intervals} finite log hazards"
        )
    if np.abs(alpha).max(initial=0.0) > MAX_LOG_HAZARD:
        raise MalformedRequestError(site=None, task=TASK, reason="'alpha' beyond +-50")
    return alpha.astype(np.float64)


def _bounds(args: dict[str, Any], p: int) -> tuple[float, np.ndarray, float, float]:
    """Row norm ``B``, scaling, and the per-patient score and information bounds."""
    row_norm, scaling = clip_from_args(args, p)
    bounds = args.get("patient_bounds")
    if not (
        isinstance(bounds, dict)
        and set(bounds) == {"score", "information"}
        and all(
            isinstance(v, int | float) and not isinstance(v, bool) and np.isfinite(v) and v > 0
            for v in bounds.values()
        )
    ):
        raise MalformedRequestError(
            site=None, task=TASK, reason="'patient_bounds' needs positive 'score' and 'information'"
        )
    return row_norm, scaling, float(bounds["score"]), float(bounds["information"])


SUMMARIES = TaskSpec(
    name=TASK,
    schema=summaries_schema,
    description="private Cox: clipped per-patient score and information on a time grid",
    private=True,
)
