"""Site tasks of federated deep models: ``deep.train`` (one round) and ``deep.evaluate``.

``deep.train`` builds the named architecture (:mod:`fedstats.deep.models`),
loads the request's weights, trains locally (:mod:`fedstats.deep.local_training`)
and replies the flat update ``y_K - x`` — its size is the parameter count,
never the number of patients. With a ``dp`` block the request also carries
``dp_sgd`` (sampling rate, noise multiplier, clipping norm, steps); the task
declares the DP-SGD event through ``Task.private_training``, the silo
charges it to the site's ledger before training, and the reply carries only
the noisy update (and SCAFFOLD's control update, computed from it), not the
training loss. Under secure aggregation the request's ``scale`` gives each
site the weight it multiplies its update by, so the masked sum is already
the weighted combination. With ``quantize_bits`` ``b`` the site sends its
update stochastically rounded to ``b`` bits per entry (unbiased;
:mod:`fedstats.models.quantize`) as ``update_packed`` (``ceil(d b / 8)`` bytes of
bit-packed codes) and ``update_scale`` instead of the float32 ``update``.

``deep.evaluate`` scores the site's rows with given weights and replies sums
and counts the coordinator combines over sites (:mod:`fedstats.deep.evaluation`).
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from sklearn.metrics import roc_auc_score

from fedstats.contract.design import DesignSpec
from fedstats.contract.dp_request import DpRequest
from fedstats.cox_math import concordance_counts
from fedstats.deep.dp_sgd import DpSgdPlan
from fedstats.deep.local_training import ALGORITHMS, LocalPlan, train_locally
from fedstats.deep.losses import BINARY, SURVIVAL
from fedstats.deep.models import build_model, count_parameters
from fedstats.deep.site_data import checked_spec, input_columns, site_tensors
from fedstats.deep.weights import checked_arrays, load_arrays
from fedstats.errors import MalformedRequestError, ModelSpecError
from fedstats.models.quantize import quantize
from fedstats.schema import Array, Number
from fedstats.site.handlers.survival import deferred_points
from fedstats.site.patient_clipping import refuse_several_rows
from fedstats.site.task import SiteContext, Task, TaskReply

TRAIN_TASK = "deep.train"
EVALUATE_TASK = "deep.evaluate"
DP_GROUP = "dp_sgd"
"""The name of DP-SGD's noise multiplier in a request's ``dp`` block."""
SCAFFOLD_CACHE = "deep.scaffold"
LOGIT_EDGES = np.linspace(-8.0, 8.0, 1601)
"""Bins of the predicted logits in an evaluation reply (values beyond are put in the end bins)."""
MAX_STEPS = 100_000
STEP_UNITS = 400_000
"""The least work one local step counts for: a step's fixed overhead (a forward, backward
and optimiser call, 2 to 3 ms on a busy two-core server) is the work of a 400,000-unit
step, so the default ``max_work`` allows at most 500 steps of the smallest network."""


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


# ------------------------------------------------------------------ training


@dataclass(frozen=True)
class TrainRequest:
    model: ModelRequest
    local: LocalPlan
    analysis: str
    seed: int | None
    private: DpSgdPlan | None
    control: np.ndarray | None
    scale: dict[str, float] | None
    control_scale: float | None
    quantize_bits: int | None


def train_request(args: dict[str, Any]) -> TrainRequest:
    """Every argument of ``deep.train``, checked (before anything is charged or read)."""
    model = model_request(args)
    algorithm, lr, batch_size = args.get("algorithm"), args.get("lr"), args.get("batch_size")
    steps, epochs, mu = args.get("local_steps"), args.get("local_epochs"), args.get("mu", 0.0)
    if algorithm not in ALGORITHMS:
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
        isinstance(scale, dict) and all(_number(v) for v in scale.values())
    ):
        raise MalformedRequestError(site=None, task=None, reason="'scale' maps sites to numbers")
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


PER_ROW_CLIPPING = (
    "DP-SGD clips and samples each row's gradient (Opacus' per-sample clipping), which bounds "
    "one row's influence, not that of a patient's rows together"
)
"""Why private training is refused on a frame with several rows per patient."""


def validate_train(ctx: SiteContext, args: dict[str, Any]) -> None:
    """Build the site's design for a training request (data checks and cell rules), nothing else;
    a private request on a frame with several rows per patient is refused first."""
    if args.get("dp") is not None:
        refuse_several_rows(ctx, TRAIN_TASK, PER_ROW_CLIPPING)
    site_tensors(ctx, args)


def train_cost(ctx: SiteContext, args: dict[str, Any]) -> float:
    """Examples seen times the network's parameters: local steps (epochs count passes over
    the site's rows) x rows per step x parameters, the parameters counted from the
    hyperparameters (:func:`~fedstats.deep.models.count_parameters`).

    A step's forward and backward pass costs about six floating-point operations per
    parameter and example, and per-example gradients (DP-SGD) hold one gradient per
    example, so time and memory grow with the product. A private step's Poisson batch is
    bounded by the site's rows."""
    request = train_request(args)
    n = len(ctx.frame)
    per_step = n if request.private is not None else min(request.local.batch_size, n)
    step = max(max(per_step, 1) * request.model.n_params, STEP_UNITS)
    return float(request.local.steps_for(n)) * step


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
        schema.update({"train_loss": Number(), "steps": Number()})
    else:
        schema["dp_steps"] = Number()
    return schema


def train(ctx: SiteContext, args: dict[str, Any]) -> TaskReply:
    """One round of local training from the request's weights; the flat update."""
    request = train_request(args)
    if request.private is not None:
        refuse_several_rows(ctx, TRAIN_TASK, PER_ROW_CLIPPING)
    model = request.model.build(args["weights"], ctx.name)
    data = site_tensors(ctx, args)
    kind = request.model.spec.outcome_kind
    cache = ctx.cache.setdefault(SCAFFOLD_CACHE, {})
    local_control = None
    if request.local.algorithm == "scaffold":
        local_control = cache.get(request.analysis)
        if local_control is None or local_control.shape != (request.model.n_params,):
            local_control = np.zeros(request.model.n_params, dtype=np.float32)
    seed = args.get("noise_seed") if request.private is not None else request.seed
    if request.private is not None and seed is not None and type(seed) is not int:
        seed = None
    if seed is not None:
        torch.manual_seed(seed)  # dropout masks, for a reproducible run
    outcome = train_locally(
        model,
        data,
        kind,
        request.local,
        seed=seed,
        private=request.private,
        global_control=request.control,
        local_control=local_control,
        deadline=ctx.deadline,
    )
    if request.private is not None and outcome.steps_accounted != request.private.steps:
        raise MalformedRequestError(
            site=ctx.name,
            task=TRAIN_TASK,
            reason=f"Opacus counted {outcome.steps_accounted} DP-SGD steps, not the "
            f"{request.private.steps} charged; nothing is released",
        )
    if outcome.new_control is not None:
        cache[request.analysis] = outcome.new_control
    weight = 1.0 if request.scale is None else float(request.scale.get(ctx.name, 0.0))
    update = (outcome.update * weight).astype(np.float32)
    payload: dict[str, Any]
    if request.quantize_bits is None:
        payload = {"update": update}
    else:
        coded = quantize(update, request.quantize_bits, _rounding_rng(seed, ctx.name))
        payload = {"update_packed": coded.packed, "update_scale": coded.scale}
    if outcome.control_update is not None:
        factor = 1.0 if request.control_scale is None else float(request.control_scale)
        payload["control_update"] = (outcome.control_update * factor).astype(np.float32)
    if request.private is None:
        payload["train_loss"] = outcome.mean_loss * weight
        payload["steps"] = outcome.steps
    else:
        payload["dp_steps"] = outcome.steps_accounted
    return TaskReply(payload, contributors=data.n)


# ---------------------------------------------------------------- evaluation


def evaluate_schema(args: dict[str, Any]) -> dict:
    request = model_request(args)
    if request.spec.outcome_kind == SURVIVAL:
        return {k: Number() for k in ("n", "n_events", "concordant", "tied", "comparable")}
    bins = len(LOGIT_EDGES) - 1
    return {
        **{k: Number() for k in ("n", "n_events", "correct", "brier_sum", "log_loss_sum", "auc")},
        "logits_events": Array((bins,)),
        "logits_non_events": Array((bins,)),
    }


def evaluate(ctx: SiteContext, args: dict[str, Any]) -> TaskReply:
    """Sums and counts of the model's performance on the site's rows.

    Binary: patients, events, correct classifications at probability 1/2,
    the Brier sum ``sum (p_i - y_i)^2``, the log-loss sum, the site's AUC
    (scikit-learn; NaN with one class) and histograms of the logits of
    events and non-events on a fixed grid, merged so that every released
    bin holds at least ``k`` patients (for the pooled AUC and the
    calibration fit). Survival: Harrell's C pair counts among the site's
    patients (:func:`fedstats.cox_math.concordance_counts`).
    """
    request = model_request(args)
    model = request.build(args["weights"], ctx.name)
    data = site_tensors(ctx, args, evaluation=True)
    model.eval()
    with torch.no_grad():
        scores = model(data.X).reshape(-1).double().numpy()
    if not np.isfinite(scores).all():
        raise MalformedRequestError(
            site=ctx.name, task=EVALUATE_TASK, reason="the model's outputs are not finite"
        )
    if request.spec.outcome_kind == SURVIVAL:
        time, event = data.time.double().numpy(), data.event.double().numpy()
        concordant, tied, comparable = concordance_counts(time, event, scores)
        payload = {
            "n": data.n,
            "n_events": int(event.sum()),
            "concordant": concordant,
            "tied": tied,
            "comparable": comparable,
        }
        return TaskReply(payload, contributors=data.n)
    y = data.y.double().numpy()
    p = 1.0 / (1.0 + np.exp(-scores))
    log_loss = np.logaddexp(0.0, scores) - y * scores
    both = 0 < y.sum() < len(y)
    clipped = np.clip(scores, LOGIT_EDGES[0], LOGIT_EDGES[-1])
    events, non_events = k_protected_histograms(
        np.histogram(clipped[y == 1], LOGIT_EDGES)[0].astype(np.float64),
        np.histogram(clipped[y == 0], LOGIT_EDGES)[0].astype(np.float64),
        ctx.policy.min_count,
    )
    payload = {
        "n": data.n,
        "n_events": int(y.sum()),
        "correct": int(((scores > 0) == (y == 1)).sum()),
        "brier_sum": float(np.sum((p - y) ** 2)),
        "log_loss_sum": float(np.sum(log_loss)),
        "auc": float(roc_auc_score(y, scores)) if both else math.nan,
        "logits_events": events,
        "logits_non_events": non_events,
    }
    return TaskReply(payload, contributors=data.n)


def k_protected_histograms(
    events: np.ndarray, non_events: np.ndarray, k: int
) -> tuple[np.ndarray, np.ndarray]:
    """The two logit histograms with every released bin holding at least ``k`` patients.

    Bins are merged from the left as in the survival curves' deferred
    events (:func:`fedstats.site.handlers.survival.deferred_points`): patients
    accumulate until at least ``k`` are pending, then all are released at
    the current bin; the last fewer than ``k`` join the last released bin.
    Events and non-events of one merged bin stay together, so the pooled AUC
    counts their pairs as ties, and no bin tells of fewer than ``k``
    patients' logits and outcomes.
    """
    release = deferred_points(events + non_events, k)
    released = release[release >= 0]
    release[release < 0] = released.max() if released.size else len(release) - 1
    return (
        np.bincount(release, weights=events, minlength=len(events)),
        np.bincount(release, weights=non_events, minlength=len(non_events)),
    )


def training_event(args: dict[str, Any]):
    """``Task.private_training`` of ``deep.train``: every argument checked, then the event."""
    request = train_request(args)
    if request.private is None:
        raise ValueError("a private round needs 'dp_sgd'")
    return request.private.event()


def _rounding_rng(seed: int | None, site: str) -> np.random.Generator:
    """The stochastic rounding's generator: from the round's seed and the site's name when the
    run is seeded (so sites round independently), from OS entropy otherwise."""
    if seed is None:
        return np.random.default_rng()
    return np.random.default_rng([seed, int.from_bytes(hashlib.sha256(site.encode()).digest()[:4])])


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


__all__ = [
    "BINARY",
    "EVALUATE_TASK",
    "TRAIN_TASK",
    "evaluate",
    "evaluate_schema",
    "train",
    "train_schema",
    "training_event",
]


SITE_TASKS = [
    Task(
        name=TRAIN_TASK,
        handler=train,
        schema=train_schema,
        description="one round of local training of a registered network; the flat update",
        private_training=training_event,
        cost=train_cost,
        validate=validate_train,
    ),
    Task(
        name=EVALUATE_TASK,
        handler=evaluate,
        schema=evaluate_schema,
        description="a network's performance on the site's rows as sums and counts",
    ),
]
"""The tasks :data:`fedstats.site.registry.DEEP_TASKS` names, loaded by the site on first use."""
