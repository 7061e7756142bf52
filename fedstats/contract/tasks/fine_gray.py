"""The wire of the Fine-Gray tasks: censoring-weighted grid sums and robust variance."""

from __future__ import annotations

from typing import Any

from fedstats.contract.fine_gray import COMPETING_FIELDS, convention_of
from fedstats.contract.task_spec import TaskSpec
from fedstats.contract.tasks.competing import checked_cause
from fedstats.contract.tasks.design import spec_from_args
from fedstats.contract.tasks.survival import checked_grid
from fedstats.cox_math import TIES, GridSums, grid_sums_schema
from fedstats.errors import MalformedRequestError
from fedstats.schema import Array, Number

TASK = "fine_gray.grid_summaries"


SUM_FIELDS = tuple(GridSums.__dataclass_fields__)


COUNT_FIELDS = ("at_risk", "competing", "censored")


def summaries_schema(args: dict[str, Any]) -> dict:
    spec = spec_from_args(args)
    if spec.outcome_kind != "survival" or spec.strata or spec.offset:
        raise MalformedRequestError(
            site=None,
            task=None,
            reason="the Fine-Gray model takes a Surv(time, status) design without strata",
        )
    if args.get("dp") is not None:
        raise MalformedRequestError(
            site=None, task=None, reason="differentially private Fine-Gray fits are not offered yet"
        )
    checked_cause(args)
    ties = args.get("ties", "efron")
    if not (isinstance(ties, str) and ties in TIES):
        raise MalformedRequestError(
            site=None, task=None, reason=f"'ties' must be one of {list(TIES)}"
        )
    try:
        convention = convention_of(args)
    except ValueError as error:
        raise MalformedRequestError(site=None, task=None, reason=str(error)) from None
    if convention == "crr" and ties != "breslow":
        raise MalformedRequestError(
            site=None, task=None, reason="the 'crr' convention has Breslow's ties only"
        )
    p, K = spec.n_params, len(checked_grid(args))
    competing = (
        {COMPETING_FIELDS[0]: Array((K,)), COMPETING_FIELDS[1]: Array((K, p))}
        if convention == "crr"
        else {}
    )
    return {
        **grid_sums_schema(K, p),
        **{name: Array((K,)) for name in COUNT_FIELDS},
        **competing,
        "truncated": Number(),
        "n_obs": Number(),
        "n_dropped": Number(),
    }


ROBUST_TASK = "fine_gray.robust"


def robust_schema(args: dict[str, Any]) -> dict:
    spec = spec_from_args(args)
    summaries_schema(args)
    return {"meat": Array((spec.n_params, spec.n_params))}


SUMMARIES = TaskSpec(
    name=TASK,
    schema=summaries_schema,
    description="Fine-Gray censoring-weighted risk-set sums and counts on a time grid "
    "(k-protected)",
)
ROBUST = TaskSpec(
    name=ROBUST_TASK,
    schema=robust_schema,
    description="Fine-Gray score residuals' cross-products summed over the site's patients",
)
