"""One training round's pieces at the coordinator: the state carried between rounds,
what a round brings back, and how the sites' updates are received.

A round ends with :meth:`TrainingState.advance`: the server step
``x <- step(x, Delta)`` (:mod:`fedstats.deep.training.server_optimizers`), SCAFFOLD's
server control variate ``c <- c + sum_{k in S} Delta c_k / N_sites``
(Karimireddy et al., ICML 2020, Alg. 1), the sites' participation and DP-SGD
step counts (for the per-site privacy account) and one row of history.
Under secure aggregation (:func:`secure_round`) each site scales its own
update by its FedAvg weight ``n_k / (N p)`` and the coordinator learns only
the sum.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fedstats.contract.paths import SELF_WEIGHTED
from fedstats.contract.quantize import Quantized, dequantize
from fedstats.deep.shared.wire import TRAIN_TASK
from fedstats.deep.training.privacy_plan import DpSgdSchedule
from fedstats.deep.training.server_optimizers import ServerOptimizer
from fedstats.deep.training.training_options import LocalWork
from fedstats.errors import InvalidReplyError
from fedstats.models.federation import Federation
from fedstats.models.secure_aggregation import SecureAggregation, SecureSum, secure_sum

FLOAT32_BYTES = 4
"""Bytes of one entry of an unquantised update (float32 on the wire)."""


@dataclass(frozen=True)
class RoundOutcome:
    """What one round brought back: the sites that contributed, the combined update
    ``Delta``, SCAFFOLD's combined control step (or ``None``), the weighted training
    loss (``nan`` when it is not released), each site's public reply fields and
    DP-SGD steps."""

    contributed: tuple[str, ...]
    aggregate: np.ndarray
    control_step: np.ndarray | None
    loss: float
    public: Mapping[str, Mapping[str, Any]]
    dp_steps: Mapping[str, int] = field(default_factory=dict)


@dataclass
class TrainingState:
    """The global model and everything the coordinator carries from round to round."""

    weights: np.ndarray
    """The flat float32 global weights."""
    shapes: list[np.ndarray]
    """The parameter arrays in ``state_dict`` order (their shapes unflatten ``weights``)."""
    control: np.ndarray | None
    server: ServerOptimizer
    clip: float
    """DP-FedAvg's current clipping norm (``nan`` without client-level DP)."""
    noise_rng: np.random.Generator | None
    """DP-FedAvg's noise generator, drawn from over all rounds (``None`` without it)."""
    participation: dict[str, int]
    dp_steps: dict[str, int]
    history: list[dict[str, Any]] = field(default_factory=list)
    last_public: dict[str, Mapping[str, Any]] = field(default_factory=dict)
    sessions: list[SecureSum] = field(default_factory=list)
    init_seed: int | None = None
    """The seed the initial network was drawn from (``None`` for given initial weights)."""
    last_args: dict[str, Any] = field(default_factory=dict)
    """The last round's ``deep.train`` arguments (an evaluation relays them with its path)."""

    def point(self) -> np.ndarray:
        """The round's point on an exact training path: the flat weights, SCAFFOLD's control
        variate appended (:class:`fedstats.contract.paths.FedAvgPath`)."""
        parts = [self.weights] if self.control is None else [self.weights, self.control]
        return np.concatenate(parts).astype(np.float64)

    def skip(self, round_no: int) -> None:
        """A round in which no site was sampled (and no client-level noise is due)."""
        self.history.append({"round": round_no, "sites": 0, "train_loss": math.nan,
                             "update_norm": 0.0, "seconds": 0.0})  # fmt: skip

    def advance(self, row: dict[str, Any], outcome: RoundOutcome, seconds: float) -> None:
        """Apply a round: server step, control variate, counts and one history row."""
        for site in outcome.contributed:
            self.participation[site] += 1
        for site, steps in outcome.dp_steps.items():
            self.dp_steps[site] += steps
        self.last_public.update(outcome.public)
        self.weights = self.server.step(self.weights, outcome.aggregate)
        if self.control is not None and outcome.control_step is not None:
            step = np.asarray(outcome.control_step, dtype=np.float64)
            self.control = (self.control + step).astype(np.float32)
        self.history.append(
            {
                **row,
                "sites": len(outcome.contributed),
                "train_loss": float(outcome.loss),
                "update_norm": float(np.linalg.norm(outcome.aggregate)),
                "seconds": seconds,
            }
        )


def train_arguments(
    *,
    design: dict,
    scaling: np.ndarray,
    model: str,
    hyper: Mapping[str, Any],
    local: LocalWork,
    quantize_bits: int | None,
    schedule: DpSgdSchedule | None,
    analysis: str,
) -> dict[str, Any]:
    """``deep.train``'s arguments that stay the same in every round of one fit: the
    agreed design and input scaling, the network, the local work (under DP-SGD, the
    schedule's steps and per-round plan) and the quantisation; ``analysis`` is
    ``study/analysis``, the label a site's DP-SGD charges are made under."""
    args: dict[str, Any] = {
        "design": design,
        "scaling": scaling,
        "model": model,
        "hyper": dict(hyper),
        "algorithm": local.algorithm,
        "lr": local.lr,
        "batch_size": local.batch_size,
        "mu": local.mu,
        "analysis": analysis,
    }
    if quantize_bits is not None:
        args["quantize_bits"] = quantize_bits
    if schedule is not None:
        args["local_steps"] = schedule.local_steps
        args["dp_sgd"] = schedule.round_plan().to_args()
    elif local.local_steps is not None:
        args["local_steps"] = local.local_steps
    else:
        args["local_epochs"] = local.local_epochs
    return args


def secure_train_args(
    args: Mapping[str, Any],
    weights: Mapping[str, float],
    *,
    n_sites: int,
    self_weighted: bool,
) -> dict[str, Any]:
    """A round's ``deep.train`` arguments inside secure aggregation: each site's weight
    ``w_k`` (or :data:`~fedstats.contract.paths.SELF_WEIGHTED`, each site its own rows) and
    SCAFFOLD's ``1 / N_sites``."""
    scale: Any = SELF_WEIGHTED if self_weighted else dict(weights)
    return {**args, "scale": scale, "control_scale": 1.0 / n_sites}


def secure_round(
    part: Federation,
    args: dict[str, Any],
    weights: Mapping[str, float],
    *,
    analysis: str,
    options: SecureAggregation,
    loss_released: bool,
) -> tuple[RoundOutcome, SecureSum]:
    """A round summed by secure aggregation (``args`` from :func:`secure_train_args`): each
    site sends ``w_k Delta_k`` (and ``Delta c_k / N_sites``) masked; the coordinator sees
    ``sum_k w_k Delta_k``. The weighted loss is divided by the survivors' total weight when
    it is released.

    Self-weighted (an exact round of every site under FedAvg's mean): each site weighs
    its update by its own rows ``n_k`` and sends ``n_k`` too
    (:data:`fedstats.contract.paths.SELF_WEIGHTED`); the update is
    ``sum_k n_k Delta_k / sum_k n_k``, so no weight the coordinator chose can single a site
    out of the sum, and sites that verify paths re-derive the step from the two sums."""
    self_weighted = args.get("scale") == SELF_WEIGHTED
    summed = secure_sum(part, TRAIN_TASK, args, analysis=analysis, options=options)
    contributed = tuple(summed.survivors)
    loss = summed.total.get("train_loss", math.nan)
    total_weight = (
        float(summed.total["n_obs"]) if self_weighted else sum(weights[s] for s in contributed)
    )
    if loss_released:
        loss = loss / total_weight
    update = np.asarray(summed.total["update"], dtype=np.float64)
    outcome = RoundOutcome(
        contributed=contributed,
        aggregate=update / total_weight if self_weighted else update,
        control_step=summed.total.get("control_update"),
        loss=loss,
        public=summed.public,
    )
    return outcome, summed


def received_updates(
    replies: Mapping[str, Mapping[str, Any]],
    n_params: int,
    quantize_bits: int | None,
    row: dict[str, Any],
) -> list[np.ndarray]:
    """The sites' flat updates (quantised ones decoded); records the bytes they took in
    ``row`` (``update_bytes``) beside the bytes of float32 updates
    (``update_bytes_unquantized``)."""
    updates, sent = [], 0
    for site, reply in replies.items():
        if quantize_bits is None:
            updates.append(np.asarray(reply["update"], dtype=np.float64))
            sent += int(reply["update"].nbytes)
        else:
            received = quantized_update(site, reply, quantize_bits, n_params)
            updates.append(dequantize(received))
            sent += received.nbytes
    row["update_bytes"] = sent
    row["update_bytes_unquantized"] = len(replies) * n_params * FLOAT32_BYTES
    return updates


def quantized_update(site: str, reply: Mapping[str, Any], bits: int, n_params: int) -> Quantized:
    """A site's quantised update as sent, checked (the reply schema fixed its shape)."""
    packed = reply["update_packed"]
    try:
        if packed.dtype != np.uint8:
            raise ValueError(f"codes of dtype {packed.dtype}, not uint8")
        return Quantized.from_wire(
            {"packed": packed, "scale": reply["update_scale"], "bits": bits, "length": n_params}
        )
    except ValueError as error:
        raise InvalidReplyError(f"site {site!r}, task {TRAIN_TASK!r}: {error}") from None


def round_seed(seed: int | None, round_no: int) -> int | None:
    """The sites' batch-order seed in round ``round_no`` (non-private training):
    ``SeedSequence([seed, round_no])``'s first word, or ``None`` (OS entropy) without a seed."""
    if seed is None:
        return None
    return int(np.random.SeedSequence([seed, round_no]).generate_state(1)[0])
