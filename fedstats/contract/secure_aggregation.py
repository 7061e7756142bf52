"""The wire of secure aggregation: its task names, its masked vector and the signed facts.

The protocol (Bonawitz et al., CCS 2017; Bell et al., CCS 2020 for its sparse graph) runs
between the coordinator (:mod:`fedstats.models.secure_aggregation`) and each site
(:mod:`fedstats.site.secure_aggregation`, :mod:`fedstats.site.secure_unmasking`); both read
the messages with this module and :mod:`fedstats.contract.secagg_session` (a session's plan,
graph and compact fields): the five tasks' names, the ``secagg`` block a masked task request
carries (:class:`MaskBlock`), and the one ring vector that replaces a reply's numeric fields
(:func:`masked_schema`, :func:`flatten`, :func:`unflatten`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from fedstats.contract.secagg_session import (
    MAX_SITES,
    SEALED_BYTES,
    SessionPlan,
    check_threshold,
    majority,
    row_bytes,
    rows,
)
from fedstats.errors import MalformedRequestError
from fedstats.schema import Array, Number, ReplySchema
from fedstats.secagg import crypto

ADVERTISE_TASK = "secagg.advertise"
SHARE_TASK = "secagg.share"
CONFIRM_TASK = "secagg.confirm"
UNMASK_TASK = "secagg.unmask"

MASKED_FIELD = "masked"

__all__ = [
    "ADVERTISE_TASK",
    "CONFIRM_TASK",
    "MASKED_FIELD",
    "MAX_SITES",
    "SHARE_TASK",
    "UNMASK_TASK",
    "MaskBlock",
    "SessionPlan",
    "check_threshold",
    "majority",
]


@dataclass(frozen=True)
class MaskBlock:
    """The ``secagg`` block of a task request: the session, and the share pairs sealed for
    this site by each of its neighbours (one row each, in the session's order)."""

    session: str
    sealed: list[bytes]

    def to_wire(self) -> dict[str, Any]:
        return {"session": self.session, "sealed": rows(self.sealed, SEALED_BYTES)}

    @classmethod
    def from_args(cls, args: dict[str, Any]) -> MaskBlock | None:
        block = args.get("secagg")
        if block is None:
            return None
        problem = "'secagg' must hold 'session' and 'sealed' (a row of sealed shares each)"
        if not (
            isinstance(block, dict)
            and set(block) == {"session", "sealed"}
            and isinstance(block["session"], str)
            and isinstance(block["sealed"], np.ndarray)
            and block["sealed"].ndim == 2
        ):
            raise MalformedRequestError(site=None, task=None, reason=problem)
        try:
            sealed = row_bytes(block["sealed"], len(block["sealed"]), SEALED_BYTES, "sealed")
        except ValueError:
            raise MalformedRequestError(site=None, task=None, reason=problem) from None
        return cls(block["session"], sealed)


def masked_schema(
    plain: ReplySchema, site: str | None = None, task: str | None = None
) -> ReplySchema:
    """One ring vector replacing every numeric field of ``plain`` (in sorted field order)."""
    return {MASKED_FIELD: Array((masked_length(plain, site, task),))}


def masked_length(plain: ReplySchema, site: str | None = None, task: str | None = None) -> int:
    total = 0
    for name in sorted(plain):
        kind = plain[name]
        if not isinstance(kind, Number | Array):
            raise MalformedRequestError(
                site=site,
                task=task,
                reason=f"field {name!r} is not numeric and cannot be securely aggregated",
            )
        total += kind.size()
    return total


def flatten(payload: dict[str, Any], plain: ReplySchema) -> np.ndarray:
    """The payload's numeric fields, in sorted field order, as one vector."""
    return np.concatenate(
        [np.asarray(payload[name], dtype=np.float64).ravel() for name in sorted(plain)]
        or [np.zeros(0)]
    )


def unflatten(vector: np.ndarray, plain: ReplySchema) -> dict[str, Any]:
    """Inverse of :func:`flatten`: fields of the shapes ``plain`` declares."""
    out: dict[str, Any] = {}
    at = 0
    for name in sorted(plain):
        kind = plain[name]
        size = kind.size()
        chunk = vector[at : at + size]
        out[name] = float(chunk[0]) if isinstance(kind, Number) else chunk.reshape(kind.shape)
        at += size
    return out


MASK_FACTS = ("session", "fraction_bits", "seed_commitment")
"""What a site that verifies paths signs beside its masked reply on a path
(:mod:`fedstats.site.verified_paths`): the session, its fixed-point precision, and a commitment
to its self-mask seed ``b_u`` (:func:`seed_commitment`). The next round relays the signed
masked replies with the seeds the coordinator rebuilt, so every site recomputes the total
(:func:`unmasked_total`) and the step from it, and a seed that is not the committed one is
refused."""


def signed_payload(payload: Mapping[str, Any], facts: Any) -> dict[str, Any]:
    """What a reply on a verified path is signed over: its payload and, for a masked reply,
    the session's facts (:data:`MASK_FACTS`) sent beside it (``facts`` ``None`` otherwise)."""
    return {**payload, **facts} if isinstance(facts, dict) else dict(payload)


def seed_commitment(session: str, site: str, seed: bytes) -> str:
    """SHA-256 of a site's self-mask seed ``b_u``, bound to the session and the site: the seed
    is random (256 bits), so the commitment hides it until the unmasking reveals it, and no
    other seed has the same commitment."""
    h = hashlib.sha256(b"fedstats self-mask seed v1")
    for part in (session.encode(), site.encode(), seed):
        h.update(len(part).to_bytes(8, "little"))
        h.update(part)
    return h.hexdigest()


def unmasked_total(masked: Mapping[str, np.ndarray], seeds: Mapping[str, bytes]) -> np.ndarray:
    """``sum_u y_u - sum_u PRG(b_u)`` in ``Z_(2^64)``: the sum of the survivors' encoded
    replies once every survivor's self-mask is removed. The pairwise masks cancel in the sum
    when no site that shared keys dropped out (each pair's mask is added by one site and
    subtracted by the other; Bonawitz et al., CCS 2017, §4)."""
    sites = list(masked)
    total = np.asarray(masked[sites[0]], dtype=np.uint64).copy()
    for site in sites[1:]:
        total = total + np.asarray(masked[site], dtype=np.uint64)
    for site in sites:
        total = total - crypto.mask(seeds[site], len(total))
    return total
