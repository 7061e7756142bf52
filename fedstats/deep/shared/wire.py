"""The deep-model tasks' wire: their names, the requests' checked arguments, the replies' schemas.

Both halves read a ``deep.train`` or ``deep.evaluate`` request with this module:
the coordinator (:mod:`fedstats.deep.training`) to write it and check the replies
(:data:`TASK_SPECS`, the specs :data:`fedstats.contract.tasks.DEEP_SPECS` names), the
site (:mod:`fedstats.deep.site.tasks`) to refuse a malformed one before it trains.
The schemas count a network's parameters from its hyperparameters with torch, so
this module belongs to the ``deep`` extra.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from fedstats.contract.design import DesignSpec
from fedstats.contract.dp_request import DpRequest
from fedstats.contract.paths import PATH_KEY, SELF_WEIGHTED
from fedstats.contract.task_spec import TaskSpec
from fedstats.contract.tasks.classifier_scores import binary_scores_schema
from fedstats.contract.tasks.design import spec_from_args
from fedstats.deep.shared.dp_sgd_plan import DpSgdPlan
from fedstats.deep.shared.losses import SURVIVAL
from fedstats.deep.shared.models import build_model, count_parameters
from fedstats.deep.shared.weights import checked_arrays, load_arrays
from fedstats.errors import MalformedRequestError, ModelSpecError
from fedstats.schema import Array, Number

TRAIN_TASK = "deep.train"


EVALUATE_TASK = "deep.evaluate"


DP_GROUP = "dp_sgd"
"""The name of DP-SGD's noise multiplier in a request's ``dp`` block."""


MAX_STEPS = 100_000


@dataclass(frozen=True)
class ModelRequest:
    """The architecture and weights a request names (checked against the registry)."""

    spec: DesignSpec
    name: str
    hyper: dict[str, Any]
    n_params: int

    def build(self, weights: Any, site: str) -> torch.nn.Module:
        try:
            model = build_model(self.name, len(input_columns(self.spec)), self.hyper)
            load_arrays(model, checked_arrays(weights, model, f"site {site!r}"))
        except ModelSpecError as error:
            raise MalformedRequestError(site=site, task=None, reason=str(error)) from None
        return model


def model_request(args: dict[str, Any]) -> ModelRequest:
    """The request's design, model name, hyperparameters and parameter count."""
    spec = checked_spec(args)
    name, hyper, weights = args.get("model"), args.get("hyper"), args.get("weights")
    if not (isinstance(name, str) and name and len(name) <= 100):
        raise MalformedRequestError(site=None, task=None, reason="'model' must name a model")
    if not (isinstance(hyper, dict) and len(hyper) <= 50):
        raise MalformedRequestError(
            site=None, task=None, reason="'hyper' must be a mapping of hyperparameters"
        )
    if not (
        isinstance(weights, list)
        and weights
        and all(isinstance(w, np.ndarray) and w.dtype.kind == "f" for w in weights)
    ):
        raise MalformedRequestError(
            site=None, task=None, reason="'weights' must be a list of float arrays"
        )
    try:  # counted from the hyperparameters on the meta device, before anything is built
        n_params = count_parameters(name, len(input_columns(spec)), hyper)
    except ModelSpecError as error:
        raise MalformedRequestError(site=None, task=None, reason=f"'hyper': {error}") from None
    sent = int(sum(w.size for w in weights))
    if sent != n_params:
        raise MalformedRequestError(
            site=None,
            task=None,
            reason=f"'weights' hold {sent} values; model {name!r} with these hyperparameters "
            f"has {n_params} parameters",
        )
    return ModelRequest(spec, name, hyper, n_params)


@dataclass(frozen=True)
class TrainRequest:
    model: ModelRequest
    local: LocalPlan
    analysis: str
    seed: int | None
    private: DpSgdPlan | None
    control: np.ndarray | None
    scale: dict[str, float] | str | None
    """Each site's weight ``w_k`` (the update sent is ``w_k Delta_k``), or
    :data:`fedstats.contract.paths.SELF_WEIGHTED`: each site its own rows ``n_k``."""
    control_scale: float | None
    quantize_bits: int | None


def train_request(args: dict[str, Any]) -> TrainRequest:
    """Every argument of ``deep.train``, checked (before anything is charged or read)."""
    model = model_request(args)
    algorithm, lr, batch_size = args.get("algorithm"), args.get("lr"), args.get("batch_size")
    steps, epochs, mu = args.get("local_steps"), args.get("local_epochs"), args.get("mu", 0.0)
    if not (isinstance(algorithm, str) and algorithm in ALGORITHMS):
        raise MalformedRequestError(
            site=None, task=None, reason=f"'algorithm' must be one of {ALGORITHMS}"
        )
    if not (_number(lr) and lr > 0 and _number(mu) and mu >= 0):
        raise MalformedRequestError(site=None, task=None, reason="'lr' > 0 and 'mu' >= 0 needed")
    if not (type(batch_size) is int and batch_size >= 1):
        raise MalformedRequestError(site=None, task=None, reason="'batch_size' must be >= 1")
    if not ((steps is None) != (epochs is None)) or not all(
        v is None or (type(v) is int and 1 <= v <= MAX_STEPS) for v in (steps, epochs)
    ):
        raise MalformedRequestError(
            site=None,
            task=None,
            reason=f"give one of 'local_steps' and 'local_epochs', an integer in 1..{MAX_STEPS}",
        )
    analysis, seed = args.get("analysis"), args.get("seed")
    if not (isinstance(analysis, str) and 0 < len(analysis) <= 200):
        raise MalformedRequestError(site=None, task=None, reason="'analysis' must be a label")
    if seed is not None and type(seed) is not int:
        raise MalformedRequestError(site=None, task=None, reason="'seed' must be an integer")
    private = None
    if args.get("dp") is not None:
        if steps is None:
            raise MalformedRequestError(
                site=None, task=None, reason="a private round declares 'local_steps'"
            )
        if model.spec.outcome_kind == SURVIVAL:
            raise MalformedRequestError(
                site=None,
                task=None,
                reason="the Cox partial likelihood couples patients through risk sets, so "
                "per-patient clipping does not bound one patient's influence: survival "
                "networks train without record-level DP",
            )
        private = DpSgdPlan.from_args(args)
        dp = DpRequest.from_args(args)
        if private.steps != steps or dp.noise_multipliers != {DP_GROUP: private.noise_multiplier}:
            raise MalformedRequestError(
                site=None,
                task=None,
                reason="the dp block and dp_sgd must declare the same noise multiplier and steps",
            )
    elif args.get("dp_sgd") is not None:
        raise MalformedRequestError(
            site=None, task=None, reason="'dp_sgd' needs a 'dp' block (the site charges it)"
        )
    control = args.get("control")
    if algorithm == "scaffold":
        if not (isinstance(control, np.ndarray) and control.shape == (model.n_params,)):
            raise MalformedRequestError(
                site=None, task=None, reason=f"SCAFFOLD needs 'control' of {model.n_params} values"
            )
        if not np.isfinite(control).all():
            raise MalformedRequestError(site=None, task=None, reason="'control' is not finite")
        control = control.astype(np.float32)
    scale, control_scale = args.get("scale"), args.get("control_scale")
    if scale is not None and not (
        (isinstance(scale, str) and scale == SELF_WEIGHTED)
        or (isinstance(scale, dict) and all(_number(v) for v in scale.values()))
    ):
        raise MalformedRequestError(
            site=None, task=None, reason=f"'scale' maps sites to numbers or is {SELF_WEIGHTED!r}"
        )
    if control_scale is not None and not _number(control_scale):
        raise MalformedRequestError(site=None, task=None, reason="'control_scale' is a number")
    bits = args.get("quantize_bits")
    if bits is not None and not (type(bits) is int and 1 <= bits <= 16):
        raise MalformedRequestError(
            site=None, task=None, reason="'quantize_bits' must be an integer in 1..16"
        )
    if bits is not None and scale is not None:
        raise MalformedRequestError(
            site=None, task=None, reason="a securely summed update cannot be quantised"
        )
    local = LocalPlan(algorithm, float(lr), batch_size, steps, epochs, float(mu))
    return TrainRequest(model, local, analysis, seed, private, control, scale, control_scale, bits)


def train_schema(args: dict[str, Any]) -> dict:
    request = train_request(args)
    p = request.model.n_params
    bits = request.quantize_bits
    schema: dict = (
        {"update": Array((p,))}
        if bits is None
        else {"update_packed": Array((math.ceil(p * bits / 8),)), "update_scale": Number()}
    )
    if request.local.algorithm == "scaffold":
        schema["control_update"] = Array((p,))
    if request.private is None:
        schema.update({"train_loss": Number(), "steps": Number(), "n_obs": Number()})
    else:
        schema["dp_steps"] = Number()
        if PATH_KEY in args:  # on a verified path: the count released at the agreement
            schema["n_obs"] = Number()
    return schema


def evaluate_schema(args: dict[str, Any]) -> dict:
    request = model_request(args)
    if request.spec.outcome_kind == SURVIVAL:
        return {k: Number() for k in ("n", "n_events", "concordant", "tied", "comparable")}
    return binary_scores_schema()


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


INTERCEPT = "Intercept"


def input_columns(spec: DesignSpec) -> list[str]:
    """The design columns a network reads: all but the intercept."""
    return [c for c in spec.columns if c != INTERCEPT]


def checked_spec(args: dict[str, Any]) -> DesignSpec:
    """The request's design; refuses designs a network cannot use."""
    spec = spec_from_args(args)
    if spec.site_intercepts or spec.offset is not None or spec.strata:
        raise MalformedRequestError(
            site=None,
            task=None,
            reason="a deep model takes no site intercepts, offset or strata",
        )
    if not input_columns(spec):
        raise MalformedRequestError(site=None, task=None, reason="the design has no covariates")
    return spec


ALGORITHMS = ("fedavg", "fedprox", "scaffold")


@dataclass(frozen=True)
class LocalPlan:
    """What one round asks of a site (the same at every site)."""

    algorithm: str
    lr: float
    batch_size: int
    local_steps: int | None = None
    local_epochs: int | None = None
    mu: float = 0.0

    def steps_for(self, n: int) -> int:
        """``local_steps``, or ``local_epochs`` passes over ``n`` rows in batches."""
        if self.local_steps is not None:
            return self.local_steps
        return int(self.local_epochs) * max(1, math.ceil(n / self.batch_size))


TRAIN = TaskSpec(
    name=TRAIN_TASK,
    schema=train_schema,
    description="one round of local training of a registered network; the flat update",
    private=True,
)
EVALUATE = TaskSpec(
    name=EVALUATE_TASK,
    schema=evaluate_schema,
    description="a network's performance on the site's rows as sums and counts",
)
TASK_SPECS = [TRAIN, EVALUATE]
"""The deep-model tasks' specs, in the order the site registers them."""
