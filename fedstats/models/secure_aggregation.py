"""Secure aggregation, the coordinator's side: learn the sum of the sites' replies, nothing else.

:class:`SecureAggregation` runs one session of the semi-honest protocol of
Bonawitz et al. ("Practical secure aggregation for privacy-preserving
machine learning", CCS 2017) over the federation's ordinary messages; the
site side, and the threat model, are in :mod:`fedstats.site.secure_aggregation`.
Four requests per sum:

1. ``secagg.advertise`` — every site's fresh public keys, signed with its
   long-term key (``U1``: the sites that answered);
2. ``secagg.share`` — the signed keys of ``U1``, which each site checks
   against the roster it pinned (:mod:`fedstats.secagg.roster`); each site's Shamir shares of its
   mask seed and masking key, sealed for their receivers (``U2``);
3. the task itself, carrying every sealed share — each site's reply
   masked in ``Z_(2^64)`` (``U3``: the survivors);
4. ``secagg.unmask`` — the survivors and the dropped; each survivor's shares
   of the survivors' seeds and of the dropped sites' keys.

From any ``t`` shares the coordinator rebuilds each survivor's seed and
each dropped site's masking key, removes every mask and decodes the sum of
the survivors' replies. A site that fails at any step is a dropout; with
fewer than ``t`` sites left the session aborts
(:class:`~fedstats.errors.SecureAggregationAborted`, naming each site and
its reason) and nothing is unmasked.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from fedstats.contract import secure_aggregation as wire
from fedstats.contract.dp_request import DP_REPLY_FIELDS
from fedstats.contract.path_rules import PATH_RULES
from fedstats.errors import (
    FedstatsError,
    InvalidReplyError,
    SecureAggregationAborted,
    StudyConfigurationError,
)
from fedstats.secagg import crypto, ring, shamir

if TYPE_CHECKING:  # the coordinator passes its federation; this module needs no import of it
    from fedstats.models.federation import Federation


@dataclass(frozen=True)
class SecureAggregation:
    """Options of secure aggregation for a fit.

    Parameters
    ----------
    threshold:
        ``t``: the fewest sites whose replies may be unmasked together; at
        least a majority of the sites. Default: every site, which under
        differential privacy puts exactly the central noise level in the sum
        (each site adds ``1/sqrt(t)`` of it); each dropout tolerated costs a
        factor ``n/t`` in noise variance when nobody drops.
    fraction_bits:
        Fixed-point precision ``f``: replies are rounded to multiples of
        ``2^-f`` and each must stay below ``2^(63-f) / (2n)`` in magnitude.
    """

    threshold: int | None = None
    fraction_bits: int = ring.DEFAULT_FRACTION_BITS

    def __post_init__(self) -> None:
        ring.check_fraction_bits(self.fraction_bits)

    def threshold_for(self, parties: int) -> int:
        t = parties if self.threshold is None else self.threshold
        wire.check_threshold(t, parties)
        return t

    def to_record(self, parties: int) -> dict[str, Any]:
        return {
            "protocol": "Bonawitz et al. 2017 (semi-honest), X25519 + AES-GCM + Shamir",
            "threshold": self.threshold_for(parties),
            "sites": parties,
            "fraction_bits": self.fraction_bits,
        }


@dataclass(frozen=True)
class SecureSum:
    """What the coordinator learns from one session."""

    total: dict[str, Any]
    survivors: tuple[str, ...]
    dropped: dict[str, str] = field(default_factory=dict)  # site -> why
    public: dict[str, dict[str, Any]] = field(default_factory=dict)  # clear fields per site
    threshold: int = 0


def secure_sum(
    federation: Federation,
    task: str,
    args: Mapping[str, Any],
    *,
    analysis: str,
    options: SecureAggregation,
) -> SecureSum:
    """The sum over sites of ``task``'s reply to ``args``, by one secure-aggregation session.

    On a verified path (:mod:`fedstats.site.verified_paths`) the masked replies are signed
    beside a commitment to each site's self-mask seed; they stay in
    :attr:`~fedstats.models.federation.Federation.signed_replies`, and the seeds rebuilt here in
    :attr:`~fedstats.models.federation.Federation.mask_seeds`, for the next round to relay
    (:class:`fedstats.models.path_relay.PathRelay`). An exact training round that does not
    weigh each update by its own site's rows (``scale`` other than
    :data:`fedstats.contract.paths.SELF_WEIGHTED`, or a robust rule) is refused before anything
    is sent when a site verifies paths: no site could re-derive it from the sum."""
    rule = PATH_RULES.get(task)
    verifying = sorted(federation.path_sites or ())
    if rule is not None and not rule.sums_replies(args) and args.get("dp") is None and verifying:
        raise StudyConfigurationError(
            f"sites {verifying} verify paths: an exact {task} round cannot be re-derived from "
            "the sum of masked replies (its step weighs each site's reply by weights the "
            "coordinator chose), so it is not asked inside secure aggregation; train every "
            "site with FedAvg's mean, in the clear, or privately with secure aggregation"
        )
    sites = list(federation.sites)
    threshold = options.threshold_for(len(sites))
    session = secrets.token_hex(16)
    dropped: dict[str, str] = {}

    def keep(replies: dict, failures: dict[str, FedstatsError], step: str) -> list[str]:
        dropped.update({s: f"{step}: {e}" for s, e in failures.items()})
        alive = [s for s in sites if s in replies]
        if len(alive) < threshold:
            raise SecureAggregationAborted(
                f"secure aggregation of {task!r} aborted at {step}: {len(alive)} of "
                f"{len(sites)} sites left, fewer than the threshold {threshold}; nothing was "
                "unmasked. Dropped: " + "; ".join(f"{s} ({why})" for s, why in dropped.items())
            )
        return alive

    advertised, failures = federation.gather(
        wire.ADVERTISE_TASK,
        {
            "session": session,
            "sites": sites,
            "threshold": threshold,
            "fraction_bits": options.fraction_bits,
        },
        analysis=analysis,
    )
    u1 = keep(advertised, failures, "key advertisement")
    keys = {
        s: [advertised[s][k] for k in ("encryption_key", "masking_key", "signature")] for s in u1
    }
    shared, failures = federation.gather(
        wire.SHARE_TASK, {"session": session, "public_keys": keys}, analysis=analysis, sites=u1
    )
    for s, reply in list(shared.items()):
        if len(reply["sealed"]) != len(u1):
            failures[s] = InvalidReplyError(f"site {s!r} sealed {len(reply['sealed'])} shares")
            del shared[s]
    u2 = keep(shared, failures, "key sharing")
    block = {"session": session, "sealed": {s: shared[s]["sealed"] for s in u2}}
    masked, failures = federation.gather(
        task, {**args, "secagg": block}, analysis=analysis, sites=u2
    )
    u3 = keep(masked, failures, "masked replies")
    signed = dict(federation.signed_replies)  # the masked replies' signatures, for the relay
    gone = [s for s in u2 if s not in u3]
    revealed, failures = federation.gather(
        wire.UNMASK_TASK,
        {"session": session, "survivors": u3, "dropped": gone},
        analysis=analysis,
        sites=u3,
    )
    u4 = keep(revealed, failures, "unmasking")

    points = {s: sites.index(s) + 1 for s in sites}
    seeds = {
        survivor: _rebuild(
            {points[h]: revealed[h]["seed_shares"][i] for h in u4}, threshold, survivor, "seed"
        )
        for i, survivor in enumerate(u3)
    }
    total = wire.unmasked_total({s: masked[s][wire.MASKED_FIELD] for s in u3}, seeds)
    length = len(total)
    for j, lost in enumerate(gone):
        raw = _rebuild(
            {points[h]: revealed[h]["key_shares"][j] for h in u4}, threshold, lost, "masking key"
        )
        key = crypto.private_from_bytes(raw)
        for survivor in u3:
            seed = crypto.agreed_key(key, keys[survivor][1], session, "mask")
            pair = crypto.mask(seed, length)
            # the survivor added +pair when it comes first in the session order, else -pair
            total = total - pair if points[survivor] < points[lost] else total + pair
    task_def = federation.registry.get(task)
    plain = task_def.schema(dict(args))
    values = ring.decode(total, options.fraction_bits)
    public = {s: {k: v for k, v in masked[s].items() if k in DP_REPLY_FIELDS} for s in u3}
    federation.signed_replies = signed
    federation.mask_seeds = {s: seed.hex() for s, seed in seeds.items()} if signed else {}
    return SecureSum(
        total=wire.unflatten(values, plain),
        survivors=tuple(u3),
        dropped=dropped,
        public=public,
        threshold=threshold,
    )


def summed_replies(
    federation: Federation,
    task: str,
    args: Mapping[str, Any],
    *,
    analysis: str,
    secure: SecureAggregation | None,
) -> dict[str, Any]:
    """Every field of the sites' replies to ``task``, summed over all sites.

    In the clear (each reply seen, then added) or, with ``secure``, by one
    secure-aggregation session in which the coordinator sees only the sum.
    For exact fits, whose answer must equal the pooled analysis: a site that
    drops out aborts the round (a sum over fewer sites would silently fit
    other data).
    """
    if secure is None:
        replies = federation.request(task, args, analysis=analysis)
        first = next(iter(replies.values()))
        return {
            name: sum(np.asarray(r[name], dtype=np.float64) for r in replies.values())
            if isinstance(first[name], np.ndarray)
            else float(sum(r[name] for r in replies.values()))
            for name in first
        }
    total = secure_sum(federation, task, args, analysis=analysis, options=secure)
    if total.dropped:
        raise SecureAggregationAborted(
            f"{sorted(total.dropped)} dropped out of a round of {task!r}; an exact fit needs "
            "every site's sums every round: "
            + "; ".join(f"{s} ({why})" for s, why in total.dropped.items())
        )
    return total.total


def secure_note(options: SecureAggregation, parties: int) -> str:
    """The line an exact fit's notes carry when its sums were securely aggregated."""
    return (
        f"secure aggregation: the coordinator saw only the sums over the {parties} sites of "
        f"every round (threshold {options.threshold_for(parties)}, fixed point "
        f"2^-{options.fraction_bits})"
    )


def secure_record(
    options: SecureAggregation, parties: int, sessions: list[SecureSum]
) -> dict[str, Any]:
    """What a fit records of its secure aggregation: the options and every dropout."""
    return {
        **options.to_record(parties),
        "sessions": len(sessions),
        "dropouts": [
            {"session": i + 1, "site": site, "reason": why}
            for i, summed in enumerate(sessions)
            for site, why in summed.dropped.items()
        ],
    }


def _rebuild(shares_hex: dict[int, str], threshold: int, site: str, what: str) -> bytes:
    try:
        return shamir.combine({x: bytes.fromhex(h) for x, h in shares_hex.items()}, threshold)
    except ValueError as error:
        raise SecureAggregationAborted(
            f"the shares of {site!r}'s {what} do not rebuild it ({error}); nothing was unmasked"
        ) from None
