"""Site tasks of federated deep models: ``deep.train`` (one round) and ``deep.evaluate``.

``deep.train`` builds the named architecture (:mod:`fedstats.deep.shared.models`),
loads the request's weights, trains locally (:mod:`fedstats.deep.site.local_training`)
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
:mod:`fedstats.contract.quantize`) as ``update_packed`` (``ceil(d b / 8)`` bytes of
bit-packed codes) and ``update_scale`` instead of the float32 ``update``.

``deep.evaluate`` scores the site's rows with given weights and replies sums
and counts the coordinator combines over sites (:mod:`fedstats.models.classifier_scores`).
"""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np
import torch

from fedstats.contract.dp_request import DpRequest
from fedstats.contract.paths import PATH_KEY, SELF_WEIGHTED
from fedstats.contract.quantize import quantize
from fedstats.cox_math import concordance_counts
from fedstats.deep.shared.losses import BINARY, SURVIVAL
from fedstats.deep.shared.models import build_model
from fedstats.deep.shared.weights import flatten, parameter_arrays
from fedstats.deep.shared.wire import (
    EVALUATE,
    EVALUATE_TASK,
    TRAIN,
    TRAIN_TASK,
    input_columns,
    model_request,
    train_request,
)
from fedstats.deep.site.data import site_tensors
from fedstats.deep.site.local_training import train_locally
from fedstats.errors import DisclosureError, MalformedRequestError
from fedstats.site import released_counts
from fedstats.site.handlers.classifier_scores import binary_scores
from fedstats.site.patient_clipping import refuse_several_rows
from fedstats.site.task import SiteContext, Task, TaskReply

SCAFFOLD_CACHE = "deep.scaffold"
STEP_UNITS = 400_000
"""The least work one local step counts for: a step's fixed overhead (a forward, backward
and optimiser call, 2 to 3 ms on a busy two-core server) is the work of a 400,000-unit
step, so the default ``max_work`` allows at most 500 steps of the smallest network."""


# ------------------------------------------------------------------ training


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
        if PATH_KEY in args:
            released_weight(ctx, args)  # before the charge: refused, nothing spent
    site_tensors(ctx, args)


def released_weight(ctx: SiteContext, args: dict[str, Any]) -> float:
    """A private round on a verified path states the weight FedAvg gives this site's update:
    the patient count it released (noised, charged) when the design was agreed
    (:mod:`fedstats.site.released_counts`), never a count the coordinator names. Refused,
    rule ``path``, when this site released none for the study and analysis."""
    dp = DpRequest.from_args(args)
    weight = None if dp is None else released_counts.recalled(ctx, dp)
    if weight is None:
        raise DisclosureError(
            site=ctx.name,
            task=TRAIN_TASK,
            reason="a private training on a verified path weighs this site's update by the "
            "patient count it released when the design was agreed, and it released none for "
            "this study and analysis (since it last started): agree the design again",
            rule="path",
        )
    return weight


def train_cost(ctx: SiteContext, args: dict[str, Any]) -> float:
    """Examples seen times the network's parameters: local steps (epochs count passes over
    the site's rows) x rows per step x parameters, the parameters counted from the
    hyperparameters (:func:`~fedstats.deep.shared.models.count_parameters`).

    A step's forward and backward pass costs about six floating-point operations per
    parameter and example, and per-example gradients (DP-SGD) hold one gradient per
    example, so time and memory grow with the product. A private step's Poisson batch is
    bounded by the site's rows."""
    request = train_request(args)
    n = len(ctx.frame)
    per_step = n if request.private is not None else min(request.local.batch_size, n)
    step = max(max(per_step, 1) * request.model.n_params, STEP_UNITS)
    return float(request.local.steps_for(n)) * step


def train(ctx: SiteContext, args: dict[str, Any]) -> TaskReply:
    """One round of local training from the request's weights; the flat update."""
    request = train_request(args)
    if request.private is not None:
        refuse_several_rows(ctx, TRAIN_TASK, PER_ROW_CLIPPING)
    if ctx.path_round == 1:
        check_seeded_start(ctx, request, args)
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
    if request.scale == SELF_WEIGHTED:  # its own rows: no weight of the coordinator's
        weight = float(data.n)
    else:
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
        payload["n_obs"] = data.n  # FedAvg's weight n_k, which the next round re-derives
    else:
        payload["dp_steps"] = outcome.steps_accounted
        if PATH_KEY in args:  # the weight the next round re-derives with, released before
            payload["n_obs"] = released_weight(ctx, args)
    return TaskReply(payload, contributors=data.n)


def check_seeded_start(ctx: SiteContext, request: Any, args: dict[str, Any]) -> None:
    """Round 1 of an exact FedAvg path: the weights must be the network the request's
    ``init_seed`` draws (``torch.manual_seed(init_seed)``, then the named network built as
    the coordinator builds it), else refused (rule ``path``) before any row is read."""
    seed = args.get("init_seed")
    if type(seed) is not int or not 0 <= seed < 2**63:
        raise DisclosureError(
            site=ctx.name,
            task=TRAIN_TASK,
            reason="round 1 of a training path names the seed of its initial network",
            rule="path",
        )
    state = torch.random.get_rng_state()
    try:
        torch.manual_seed(seed)
        network = build_model(request.model.name, len(input_columns(request.model.spec)),
                              request.model.hyper)  # fmt: skip
    finally:
        torch.random.set_rng_state(state)
    seeded = flatten(parameter_arrays(network))
    sent = flatten([np.asarray(w, dtype=np.float32) for w in args["weights"]])
    if seeded.shape != sent.shape or not np.array_equal(seeded, sent):
        raise DisclosureError(
            site=ctx.name,
            task=TRAIN_TASK,
            reason="round 1's weights are not the network its init_seed draws",
            rule="path",
        )


# ---------------------------------------------------------------- evaluation


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
    return TaskReply(binary_scores(scores, y, ctx.policy.min_count), contributors=data.n)


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


__all__ = [
    "BINARY",
    "evaluate",
    "train",
    "training_event",
]


SITE_TASKS = [
    Task.serving(
        TRAIN,
        train,
        private_training=training_event,
        cost=train_cost,
        validate=validate_train,
    ),
    Task.serving(EVALUATE, evaluate),
]
"""The tasks :data:`fedstats.site.registry.DEEP_TASKS` names, loaded by the site on first use."""
