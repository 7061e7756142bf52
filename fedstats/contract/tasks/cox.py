"""The wire of the Cox tasks: stratified summaries, grid sums, concordance and robust variance."""

from __future__ import annotations

from typing import Any

from fedstats.contract.design import DesignSpec, counting_outcome
from fedstats.contract.task_spec import TaskSpec
from fedstats.contract.tasks.design import spec_from_args
from fedstats.contract.tasks.survival import checked_grid
from fedstats.cox_math import TIES, grid_sums_schema
from fedstats.errors import MalformedRequestError
from fedstats.schema import Array, Number


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


GRID_TASK = "cox.grid_summaries"


def grid_summaries_schema(args: dict[str, Any]) -> dict:
    spec = spec_from_args(args)
    if spec.outcome_kind != "survival" or spec.strata:
        raise MalformedRequestError(
            site=None,
            task=None,
            reason="the pooled-baseline Cox model takes a survival design without strata",
        )
    if args.get("dp") is not None:
        raise MalformedRequestError(
            site=None, task=None, reason="differentially private Cox fits are not offered yet"
        )
    grid = checked_grid(args)
    p, K = spec.n_params, len(grid)
    return {
        **grid_sums_schema(K, p),
        "d_weighted": Array((K,)),
        "truncated": Number(),
    }


CONCORDANCE_TASK = "cox.concordance"


def concordance_schema(args: dict[str, Any]) -> dict:
    spec = spec_from_args(args)
    if spec.outcome_kind != "survival":
        raise MalformedRequestError(site=None, task=None, reason="the design is not a survival one")
    _one_row_per_patient(spec, "Harrell's C compares patients' follow-up times")
    return {"concordant": Number(), "tied": Number(), "comparable": Number()}


ROBUST_TASK = "cox.robust"


def robust_schema(args: dict[str, Any]) -> dict:
    spec = spec_from_args(args)
    if spec.outcome_kind != "survival":
        raise MalformedRequestError(site=None, task=None, reason="the design is not a survival one")
    _one_row_per_patient(spec, "the score residuals are summed per row")
    cluster = args.get("cluster")
    if cluster is not None and not (isinstance(cluster, str) and cluster):
        raise MalformedRequestError(
            site=None, task=None, reason="'cluster' names a column or is null"
        )
    return {"meat": Array((spec.n_params, spec.n_params))}


def _one_row_per_patient(spec: DesignSpec, why: str) -> None:
    """Refuse a ``Surv(start, stop, event)`` design, or frequency weights, in a task that reads
    one row as one patient."""
    if spec.weights is not None:
        raise MalformedRequestError(
            site=None,
            task=None,
            reason=f"this task reads one row as one patient ({why}): it takes no frequency weights",
        )
    if counting_outcome(spec.outcome) is not None:
        raise MalformedRequestError(
            site=None,
            task=None,
            reason=(
                f"this task reads one row as one patient ({why}), so it is not offered for "
                f"{spec.outcome}, whose patients may have several rows"
            ),
        )


TASK = "cox.summaries"
SUMMARIES = TaskSpec(
    name=TASK,
    schema=summaries_schema,
    description="Cox log partial likelihood, score and information of the site's strata",
)
GRID_SUMMARIES = TaskSpec(
    name=GRID_TASK,
    schema=grid_summaries_schema,
    description="Cox risk-set and tied-event sums on a time grid (k-protected)",
)
CONCORDANCE = TaskSpec(
    name=CONCORDANCE_TASK,
    schema=concordance_schema,
    description="Harrell's C pair counts among the site's patients at given coefficients",
)
ROBUST = TaskSpec(
    name=ROBUST_TASK,
    schema=robust_schema,
    description="Cox score residuals' cross-products summed over the site's clusters",
)
