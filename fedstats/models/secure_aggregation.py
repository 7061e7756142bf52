"""Secure aggregation, the coordinator's side: learn the sum of the sites' replies, nothing else.

:class:`SecureAggregation` runs one session per sum over the federation's ordinary
messages, each site sent only what is addressed to it (:mod:`fedstats.models.secure_rounds`).
Two constructions:

* ``"secagg+"`` (the default): SecAgg+ of Bell, Bonawitz, Gascón, Lepoint & Raykova
  ("Secure single-server aggregation with (poly)logarithmic overhead", CCS 2020). Each site
  shares its secrets with, and masks against, only its ``k = O(log n)`` neighbours on a
  ring graph whose order no party chooses; the coordinator needs ``t_k`` of a site's
  ``k + 1`` holders' shares. ``k`` and ``t_k`` follow from ``n`` and ``t``
  (:func:`fedstats.secagg.graph.neighbourhood`): with few sites, or many dropouts
  tolerated, the graph is complete and this is the classic construction;
* ``"secagg"``: the complete graph of Bonawitz et al. ("Practical secure aggregation for
  privacy-preserving machine learning", CCS 2017) whatever ``n``.

Five requests per sum, the site side and the threat model in
:mod:`fedstats.site.secure_aggregation` and :mod:`fedstats.site.secure_unmasking`:

1. ``secagg.advertise`` — every site's fresh public keys, signed with its long-term key;
2. ``secagg.share`` — each site gets the first site's signed keys (which seed the graph) and
   its neighbours', checks both against the roster it pinned and its neighbours against the
   graph, and seals Shamir shares of its mask seed and masking key for each neighbour (a
   site failing before the masked round leaves; a fresh session starts over the others);
3. the task itself, each site sent the shares sealed for it — its reply masked in
   ``Z_(2^64)`` (the survivors ``U3``);
4. ``secagg.confirm`` — every survivor signs the survivor set (the consistency check of
   Bonawitz et al.'s actively secure protocol);
5. ``secagg.unmask`` — the survivors with ``t`` of their signatures; each unmasking site
   reveals, for itself and its neighbours, its share of the seed of a survivor or of the
   masking key of a dropped site.

From ``t_k`` shares the coordinator rebuilds each survivor's seed and each dropped site's
masking key, removes every mask and decodes the sum of the survivors' replies. With fewer
than ``t`` sites left at any step the session aborts
(:class:`~fedstats.errors.SecureAggregationAborted`, naming each site and its reason) and
nothing is unmasked.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from fedstats.contract import secure_aggregation as wire
from fedstats.contract.dp_request import DP_REPLY_FIELDS
from fedstats.contract.path_rules import PATH_RULES
from fedstats.contract.secagg_session import SIGNATURE_BYTES, check_construction
from fedstats.errors import FedstatsError, SecureAggregationAborted, StudyConfigurationError
from fedstats.models import secure_rounds
from fedstats.secagg import graph, ring
from fedstats.secagg.shamir import SHARE_BYTES

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
    construction:
        ``"secagg+"`` (default): SecAgg+ on a graph of logarithmic degree, complete for
        few sites or when many dropouts are tolerated; ``"secagg"``: always the complete
        graph (every site shares with and masks against every other).
    """

    threshold: int | None = None
    fraction_bits: int = ring.DEFAULT_FRACTION_BITS
    construction: str = "secagg+"

    def __post_init__(self) -> None:
        ring.check_fraction_bits(self.fraction_bits)
        check_construction(self.construction)

    def threshold_for(self, parties: int) -> int:
        t = parties if self.threshold is None else self.threshold
        wire.check_threshold(t, parties)
        return t

    def neighbourhood_for(self, parties: int) -> graph.Neighbourhood:
        """The graph's degree ``k`` and per-neighbourhood threshold ``t_k`` for ``parties``."""
        t = self.threshold_for(parties)
        if self.construction == "secagg":
            return graph.complete(parties, t)
        return graph.neighbourhood(parties, t)

    def to_record(self, parties: int) -> dict[str, Any]:
        """What a fit records of these options (the report's fields: protocol, threshold,
        sites, fraction bits); the protocol names the construction and its graph."""
        return {
            "protocol": protocol_name(self.neighbourhood_for(parties)),
            "threshold": self.threshold_for(parties),
            "sites": parties,
            "fraction_bits": self.fraction_bits,
        }


def protocol_name(shape: graph.Neighbourhood) -> str:
    """The construction in words: its graph, and what unmasks a site's secrets."""
    if shape.complete:
        graph_words = (
            "Bonawitz et al. 2017, complete graph (each site shares with and masks against "
            "every other)"
        )
    else:
        graph_words = (
            f"SecAgg+ (Bell et al. 2020), Harary graph of degree {shape.degree} (each site "
            f"shares with and masks against {shape.degree} neighbours; {shape.share_threshold} "
            f"of its {shape.degree + 1} holders' shares unmask it)"
        )
    return f"{graph_words}, survivors agreed by signature; X25519 + AES-GCM + Shamir"


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
    dropped: dict[str, str] = {}

    def keep(
        asked: list[str], replies: Mapping, failures: Mapping[str, FedstatsError], step: str
    ) -> list[str]:
        dropped.update({s: f"{step}: {e}" for s, e in failures.items()})
        alive = [s for s in asked if s in replies and s not in failures]
        if len(alive) < threshold:
            raise SecureAggregationAborted(
                f"secure aggregation of {task!r} aborted at {step}: {len(alive)} of "
                f"{len(sites)} sites left, fewer than the threshold {threshold}; nothing was "
                "unmasked. Dropped: " + "; ".join(f"{s} ({why})" for s, why in dropped.items())
            )
        return alive

    opened = secure_rounds.open_session(
        federation,
        sites,
        construction=options.construction,
        threshold=threshold,
        fraction_bits=options.fraction_bits,
        analysis=analysis,
        keep=keep,
    )
    plan = opened.plan
    masked, failures = federation.gather(
        task,
        args,
        analysis=analysis,
        sites=list(plan.sites),
        site_args=secure_rounds.mask_blocks(opened),
    )
    survivors = keep(list(plan.sites), masked, failures, "masked replies")
    relayed = dict(federation.signed_replies)  # the masked replies' signatures, for the relay
    confirmed, failures = federation.gather(
        wire.CONFIRM_TASK,
        secure_rounds.survivor_block(plan, survivors),
        analysis=analysis,
        sites=survivors,
    )
    signed = secure_rounds.raw_replies(
        confirmed, failures, "signature", lambda site: (1, SIGNATURE_BYTES)
    )
    signers = keep(survivors, signed, failures, "consistency check")
    revealed, failures = federation.gather(
        wire.UNMASK_TASK,
        secure_rounds.unmask_block(opened, survivors, signed),
        analysis=analysis,
        sites=signers,
    )
    holders = plan.shape.degree + 1
    shares = secure_rounds.raw_replies(
        revealed, failures, "shares", lambda site: (holders, SHARE_BYTES)
    )
    keep(signers, shares, failures, "unmasking")
    total, seeds = secure_rounds.unmasked(
        opened, {s: masked[s][wire.MASKED_FIELD] for s in survivors}, shares
    )
    task_def = federation.registry.get(task)
    plain = task_def.schema(dict(args))
    values = ring.decode(total, options.fraction_bits)
    public = {s: {k: v for k, v in masked[s].items() if k in DP_REPLY_FIELDS} for s in survivors}
    federation.signed_replies = relayed
    federation.mask_seeds = {s: seed.hex() for s, seed in seeds.items()} if relayed else {}
    return SecureSum(
        total=wire.unflatten(values, plain),
        survivors=tuple(survivors),
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
    shape = options.neighbourhood_for(parties)
    graph_note = (
        "complete graph"
        if shape.complete
        else f"SecAgg+, {shape.degree} neighbours per site, {shape.share_threshold} of their "
        "shares to unmask"
    )
    return (
        f"secure aggregation: the coordinator saw only the sums over the {parties} sites of "
        f"every round (threshold {options.threshold_for(parties)}, {graph_note}, fixed point "
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
