"""The wire of ``glm.summaries``: a GLM family's score, information and fit sums."""

from __future__ import annotations

from typing import Any

from fedstats.contract.design import DesignSpec
from fedstats.contract.task_spec import TaskSpec
from fedstats.contract.tasks.design import spec_from_args
from fedstats.errors import MalformedRequestError
from fedstats.schema import Array, Number

TASK = "glm.summaries"


FAMILY_OUTCOMES = {"binomial": "binary", "poisson": "count", "gaussian": "continuous"}
"""Each family and the outcome kind its design must have."""


def summaries_schema(args: dict[str, Any]) -> dict:
    spec = spec_from_args(args)
    checked_family(args, spec)
    p = spec.n_params
    return {
        "gradient": Array((p,)),
        "hessian": Array((p, p)),
        "loglik": Number(),
        "deviance": Number(),
        "pearson": Number(),
        "weight_total": Number(),
        "all_extreme": Number(),
        "any_extreme": Number(),
    }


def checked_family(args: dict[str, Any], spec: DesignSpec) -> str:
    """The request's family, which must be one offered and match the design's outcome kind."""
    family = args.get("family")
    if not isinstance(family, str) or family not in FAMILY_OUTCOMES:
        raise MalformedRequestError(
            site=None, task=TASK, reason=f"'family' must be one of {sorted(FAMILY_OUTCOMES)}"
        )
    if FAMILY_OUTCOMES[family] != spec.outcome_kind:
        raise MalformedRequestError(
            site=None,
            task=TASK,
            reason=f"a {family} model needs a {FAMILY_OUTCOMES[family]} outcome design",
        )
    return family


SUMMARIES = TaskSpec(
    name=TASK,
    schema=summaries_schema,
    description="GLM score, information, log-likelihood and fit sums of one family",
)
