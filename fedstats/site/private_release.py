"""The one place where a site turns a task's reply into a differentially private release.

Order of operations at the silo, for a request carrying a ``dp`` block:

1. from the request alone, the task declares the noisy groups it releases
   (:class:`~fedstats.contract.dp_request.NoisyGroup`) and their L2 sensitivities;
2. the release is described as a ``dp_accounting`` event — one
   ``GaussianDpEvent(noise_multiplier)`` per group, composed — and charged
   to the site's own ledger (scope: unit ``patient``, owner the site, the
   request's study) *before any row is read*; over budget means a typed
   refusal and nothing recorded;
3. the handler computes its statistics with the sensitivities enforced
   (clipping);
4. Gaussian noise ``N(0, (sigma * Delta_2)^2)`` is added to every entry of
   every group (for a symmetric matrix, to the upper triangle, then
   mirrored) — the Gaussian mechanism (Dwork & Roth 2014, Thm A.1; RDP of
   Mironov 2017, Prop. 7) — from a generator seeded by OS entropy unless the
   silo was given a fixed seed, which the reply then declares;
5. a reply field outside the declared groups is refused: nothing leaves
   un-noised.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from fedstats.contract.dp_request import NoisyGroup
from fedstats.errors import DisclosureError, MalformedRequestError
from fedstats.noise import symmetric_gaussian
from fedstats.site.task import Task

if TYPE_CHECKING:
    import dp_accounting


def noisy_groups(task: Task, args: dict[str, Any], site: str) -> list[NoisyGroup]:
    """The groups a private request releases; refuses tasks with no private form."""
    if task.private_release is None:
        raise DisclosureError(
            site=site, task=task.name, reason="this task has no differentially private form"
        )
    groups = task.private_release(args)
    for group in groups:
        if not (math.isfinite(group.l2_sensitivity) and group.l2_sensitivity > 0):
            raise MalformedRequestError(
                site=site,
                task=task.name,
                reason="a noisy group needs a positive finite sensitivity",
            )
    return groups


def training_event(task: Task, args: dict[str, Any], site: str) -> dp_accounting.DpEvent:
    """The event a training task declares for ``args`` (checked to be a ``DpEvent``)."""
    import dp_accounting  # a site that releases nothing private never loads the accountant

    try:
        event = task.private_training(args)
    except (TypeError, ValueError, KeyError) as error:
        raise MalformedRequestError(
            site=site, task=task.name, reason=f"invalid private-training arguments ({error})"
        ) from None
    if not isinstance(event, dp_accounting.DpEvent):
        raise MalformedRequestError(
            site=site, task=task.name, reason="a private-training task must declare a DpEvent"
        )
    return event


def release_event(sigmas: list[float]) -> dp_accounting.DpEvent:
    """One Gaussian mechanism per group, composed (a single group is its own event)."""
    import dp_accounting  # with its PLD accountant and SciPy's signal module: loaded on use

    events = [dp_accounting.GaussianDpEvent(sigma) for sigma in sigmas]
    return events[0] if len(events) == 1 else dp_accounting.ComposedDpEvent(events)


def draw_noise(
    payload: dict[str, Any],
    groups: list[NoisyGroup],
    sigmas: list[float],
    rng: np.random.Generator,
    *,
    site: str,
    task: str,
) -> dict[str, Any]:
    """The Gaussian noise of every field of every group; refuse a payload with un-noised fields.

    A field of a ``symmetric`` group gets a symmetric noise matrix (its upper
    triangle drawn, then mirrored).
    """
    covered = {f for group in groups for f in group.fields}
    extra = sorted(set(payload) - covered)
    if extra:
        raise DisclosureError(
            site=site, task=task, reason=f"fields {extra} would be released without noise"
        )
    noise: dict[str, Any] = {}
    for group, sigma in zip(groups, sigmas, strict=True):
        scale = sigma * group.l2_sensitivity
        for name in group.fields:
            value = np.asarray(payload[name], dtype=np.float64)
            if group.symmetric:
                if value.ndim != 2 or value.shape[0] != value.shape[1]:
                    raise DisclosureError(
                        site=site, task=task, reason=f"field {name!r} is not a square matrix"
                    )
                noise[name] = symmetric_gaussian(rng, scale, value.shape[0])
            else:
                noise[name] = rng.normal(0.0, scale, value.shape)
    return noise


def add_noise(payload: dict[str, Any], noise: dict[str, Any]) -> dict[str, Any]:
    """``payload + noise`` field by field (scalars stay scalars)."""
    noisy: dict[str, Any] = {}
    for name, value in payload.items():
        released = np.asarray(value, dtype=np.float64) + noise[name]
        noisy[name] = float(released) if released.ndim == 0 else released
    return noisy
