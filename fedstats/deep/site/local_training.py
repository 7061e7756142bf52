"""A site's local training in one round: FedAvg, FedProx or SCAFFOLD steps from the global model.

Starting from the global weights ``x``, the site takes ``K`` steps of SGD
with learning rate ``eta`` on its own rows and returns ``y_K - x``:

* FedAvg (McMahan et al., AISTATS 2017): ``y <- y - eta g(y)``;
* FedProx (Li et al., MLSys 2020): ``y <- y - eta (g(y) + mu (y - x))``, the
  gradient of the local loss plus ``mu/2 |y - x|^2``;
* SCAFFOLD (Karimireddy et al., ICML 2020): ``y <- y - eta (g(y) - c_i + c)``
  with the server's control variate ``c`` and the site's own ``c_i``; after
  the round ``c_i+ = c_i - c + (x - y_K) / (K eta)`` (their option II) and
  the site returns ``c_i+ - c_i`` beside its update, keeping ``c_i+``.

``g`` is the mean gradient of a mini-batch: shuffled batches of fixed size
without privacy; with record-level privacy, DP-SGD's noisy gradient of a
Poisson-sampled batch (:mod:`fedstats.deep.site.dp_sgd`). The FedProx and
SCAFFOLD corrections read no data, so adding them after the noise is
post-processing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from fedstats.deep.shared.dp_sgd_plan import DpSgdPlan
from fedstats.deep.shared.losses import BINARY, binary_loss, cox_loss
from fedstats.deep.shared.weights import flatten, parameter_arrays
from fedstats.deep.shared.wire import LocalPlan
from fedstats.deep.site.data import SiteTensors
from fedstats.deep.site.dp_sgd import PrivateGradient, generators, poisson_batches
from fedstats.site.resource_limits import check_deadline


@dataclass(frozen=True)
class LocalOutcome:
    """A site's round: its update, SCAFFOLD control update, steps and mean batch loss."""

    update: np.ndarray
    control_update: np.ndarray | None
    new_control: np.ndarray | None
    steps: int
    mean_loss: float
    steps_accounted: int | None = None


def train_locally(
    model: nn.Module,
    data: SiteTensors,
    kind: str,
    plan: LocalPlan,
    *,
    seed: int | None,
    private: DpSgdPlan | None = None,
    global_control: np.ndarray | None = None,
    local_control: np.ndarray | None = None,
    deadline: float | None = None,
) -> LocalOutcome:
    """Run one round of local training from the model's current weights (see module doc).

    ``deadline`` (a ``time.monotonic()`` value) stops the round with a
    :class:`~fedstats.errors.ResourceLimitError` once passed; nothing is released.
    """
    params = list(model.parameters())
    start = [p.detach().clone() for p in params]
    optimizer = torch.optim.SGD(params, lr=plan.lr)
    sampling, noise = generators(seed)
    scaffold = plan.algorithm == "scaffold"
    correction = None
    if scaffold:
        c = _split(global_control, params)
        ci = _split(local_control, params)
        correction = [a - b for a, b in zip(c, ci, strict=True)]  # + c - c_i
    model.train()
    losses: list[float] = []
    private_gradient = None
    if private is not None:
        private_gradient = PrivateGradient(model, optimizer, private, data.n, noise)
        batches = poisson_batches(data.n, private, sampling)
    else:
        batches = _shuffled_batches(data.n, plan.batch_size, plan.steps_for(data.n), sampling)
    steps = 0
    try:
        for index in batches:
            check_deadline(deadline, task="deep.train")
            index = torch.as_tensor(np.asarray(index), dtype=torch.long)
            if private_gradient is not None:
                losses.append(private_gradient.noisy_gradient(data.X[index], data.y[index]))
            else:
                optimizer.zero_grad()
                loss = _loss(model, data, index, kind)
                loss.backward()
                losses.append(float(loss.detach()))
            with torch.no_grad():
                for j, p in enumerate(params):
                    if p.grad is None:
                        p.grad = torch.zeros_like(p)
                    if plan.algorithm == "fedprox" and plan.mu > 0:
                        p.grad.add_(p.detach() - start[j], alpha=plan.mu)
                    if correction is not None:
                        p.grad.add_(correction[j])
            if private_gradient is not None:
                private_gradient.apply()
            else:
                optimizer.step()
            steps += 1
    finally:
        if private_gradient is not None:
            private_gradient.close()
    x0 = flatten([t.numpy() for t in start])
    y = flatten(parameter_arrays(model))
    update = y - x0
    control_update = new_control = None
    if scaffold:
        c_i = np.asarray(local_control, dtype=np.float32)
        new_control = (c_i - global_control + (x0 - y) / (max(steps, 1) * plan.lr)).astype(
            np.float32
        )
        control_update = new_control - c_i
    return LocalOutcome(
        update=update.astype(np.float32),
        control_update=control_update,
        new_control=new_control,
        steps=steps,
        mean_loss=float(np.mean(losses)) if losses else math.nan,
        steps_accounted=None if private_gradient is None else private_gradient.steps_taken,
    )


def _loss(model: nn.Module, data: SiteTensors, index: torch.Tensor, kind: str) -> torch.Tensor:
    scores = model(data.X[index]).reshape(-1)
    if kind == BINARY:
        return binary_loss(scores, data.y[index])
    return cox_loss(scores, data.time[index], data.event[index])


def _shuffled_batches(n: int, batch_size: int, steps: int, generator: torch.Generator):
    """``steps`` batches of ``batch_size`` rows from successive random permutations."""
    done = 0
    while done < steps:
        order = torch.randperm(n, generator=generator)
        for start in range(0, n, batch_size):
            if done == steps:
                return
            yield order[start : start + batch_size]
            done += 1


def _split(vector: np.ndarray | None, params: list[torch.Tensor]) -> list[torch.Tensor]:
    out, at = [], 0
    for p in params:
        size = p.numel()
        chunk = np.zeros(size, np.float32) if vector is None else vector[at : at + size]
        out.append(torch.from_numpy(np.ascontiguousarray(chunk, dtype=np.float32)).view_as(p))
        at += size
    return out
