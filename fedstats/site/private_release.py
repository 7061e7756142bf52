"""The one place where a site turns a task's reply into a differentially private release.

Order of operations at the silo, for a request carrying a ``dp`` block:

1. from the request alone, the task declares the noisy groups it releases
   (:class:`~fedstats.site.task.NoisyGroup`) and their L2 sensitivities;
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
from dataclasses import dataclass
from typing import Any

import dp_accounting
import numpy as np

from fedstats.errors import DisclosureError, MalformedRequestError
from fedstats.schema import Number, ReplySchema, Text
from fedstats.secagg.site import masked_schema
from fedstats.site.task import NoisyGroup, Task

DP_REPLY_FIELDS: dict[str, Number | Text] = {
    "dp_epsilon_spent": Number(),
    "dp_budget_epsilon": Number(),
    "dp_fixed_seed": Number(),
    "dp_ledger_entries": Number(),
    "dp_ledger_head": Text(max_chars=64),
}
"""Public facts a site adds to every private reply: its cumulative RDP epsilon for
the study after this charge, its budget, whether its noise used a fixed seed, and
the study scope's ledger chain head after this charge (entry count and sha256 hash,
:class:`accounting.ChainHead`). The coordinator records the heads in its study
record, so a ledger rewritten later no longer extends what the site released under
(the compliance report compares them). The head is a hash of the ledger's entries
(mechanisms, notes, times), which hold no patient data; the count is the number of
private releases this site made for the study."""


MIN_NOISE_MULTIPLIER = 1e-6
"""The least noise multiplier a request may ask for. One Gaussian release at 0.01 already
costs epsilon above 5,000 (RDP, delta = 1e-5), so only a test budget pays for less: the
project checks that its noisy Newton path reproduces the exact fit at 1e-5. Far below
(about 1e-160) ``sigma**2`` underflows to 0 in the accountant's ``alpha / (2 sigma^2)``."""

MAX_NOISE_MULTIPLIER = 1e6
"""The largest: at 1e6 a release costs epsilon 0 to the accountant's precision, and past
about 1e154 ``sigma**2`` overflows (``OverflowError`` in the RDP accountant)."""


def noise_multiplier_in_range(value: object) -> bool:
    """Whether ``value`` is a real number in ``[MIN_NOISE_MULTIPLIER, MAX_NOISE_MULTIPLIER]``
    (not a bool, not NaN or infinite); every noise multiplier a request carries is checked so."""
    return (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and MIN_NOISE_MULTIPLIER <= value <= MAX_NOISE_MULTIPLIER
    )


@dataclass(frozen=True)
class DpRequest:
    """The ``dp`` block of a request: a noise multiplier per noisy group, and what it pays for.

    Groups are named by their first field (e.g. ``"gradient"``, ``"hessian"``).
    """

    noise_multipliers: dict[str, float]
    study: str
    analysis: str
    note: str

    def to_args(self) -> dict[str, Any]:
        return {
            "noise_multipliers": dict(self.noise_multipliers),
            "study": self.study,
            "analysis": self.analysis,
            "note": self.note,
        }

    @classmethod
    def from_args(cls, args: dict[str, Any]) -> DpRequest | None:
        block = args.get("dp")
        if block is None:
            return None
        keys = {"noise_multipliers", "study", "analysis", "note"}
        if not isinstance(block, dict) or set(block) != keys:
            raise MalformedRequestError(
                site=None, task=None, reason=f"'dp' must hold exactly {sorted(keys)}"
            )
        sigmas = block["noise_multipliers"]
        if (
            not isinstance(sigmas, dict)
            or not sigmas
            or not all(noise_multiplier_in_range(v) for v in sigmas.values())
        ):
            raise MalformedRequestError(
                site=None,
                task=None,
                reason="'dp.noise_multipliers' must map each noisy group to a number in "
                f"[{MIN_NOISE_MULTIPLIER:g}, {MAX_NOISE_MULTIPLIER:g}]",
            )
        if not all(isinstance(block[k], str) and block[k] for k in ("study", "analysis")) or (
            not isinstance(block["note"], str)
        ):
            raise MalformedRequestError(
                site=None,
                task=None,
                reason="'dp.study' and 'dp.analysis' must be non-empty strings, 'dp.note' a string",
            )
        return cls(
            {k: float(v) for k, v in sigmas.items()},
            block["study"],
            block["analysis"],
            block["note"][:200],
        )

    def sigmas_for(self, groups: list[NoisyGroup], site: str, task: str) -> list[float]:
        """The multiplier of each group, in order; the request must name exactly these groups."""
        names = [g.fields[0] for g in groups]
        if sorted(names) != sorted(self.noise_multipliers):
            raise MalformedRequestError(
                site=site,
                task=task,
                reason=f"noise_multipliers must name the groups {names}, "
                f"got {sorted(self.noise_multipliers)}",
            )
        return [self.noise_multipliers[n] for n in names]


def reply_schema(task: Task, args: dict[str, Any], plain: ReplySchema | None = None) -> ReplySchema:
    """The task's declared reply, plus the public privacy facts when the request is private.

    Under secure aggregation (a ``secagg`` block) the numeric fields travel as
    one masked ring vector (:func:`fedstats.secagg.site.masked_schema`).
    ``plain`` is ``task.schema(args)`` when the caller has it already.
    """
    schema = dict(task.schema(args) if plain is None else plain)
    if args.get("secagg") is not None:
        schema = dict(masked_schema(schema, task=task.name))
    if args.get("dp") is not None:
        schema.update(DP_REPLY_FIELDS)
    return schema


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


def symmetric_gaussian(
    rng: np.random.Generator, scale: float | np.ndarray, size: int, draws: int | None = None
) -> np.ndarray:
    """A symmetric ``size x size`` matrix of ``N(0, scale^2)`` entries: the upper triangle
    (diagonal included) drawn, then mirrored, so each distinct entry has standard deviation
    ``scale`` (the Gaussian mechanism on the upper triangle; Dwork & Roth 2014, App. A).
    ``scale`` may be a symmetric matrix of per-entry scales; ``draws`` stacks that many
    independent matrices (``draws x size x size``)."""
    shape = (size, size) if draws is None else (draws, size, size)
    upper = np.triu(rng.normal(0.0, 1.0, shape) * scale)
    return upper + np.swapaxes(np.triu(upper, 1), -1, -2)


def add_noise(payload: dict[str, Any], noise: dict[str, Any]) -> dict[str, Any]:
    """``payload + noise`` field by field (scalars stay scalars)."""
    noisy: dict[str, Any] = {}
    for name, value in payload.items():
        released = np.asarray(value, dtype=np.float64) + noise[name]
        noisy[name] = float(released) if released.ndim == 0 else released
    return noisy
