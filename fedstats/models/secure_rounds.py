"""The coordinator's rounds of one secure-aggregation session, each site asked only its part.

:func:`fedstats.models.secure_aggregation.secure_sum` runs them in order:

1. :func:`open_session` — ``secagg.advertise`` to the session's sites (the plan every site
   signs), then ``secagg.share`` to each site with the first site's signed keys (the graph's
   seed) and its own neighbours' signed keys. A site that fails before the masked round
   leaves the session: a fresh session starts over the others (new keys, so a new graph),
   as long as ``t`` remain, so that every site of the masked round masks against all its
   neighbours;
2. :func:`mask_blocks` — each site's ``secagg`` block for the task: the share pairs its
   neighbours sealed for it, one row each, and nothing else;
3. :func:`survivor_block` — ``secagg.confirm`` and ``secagg.unmask`` name the survivors as
   bits over the session's order, the unmasking with ``t`` survivors' signatures over them;
4. :func:`unmasked` — from the revealed shares (``t_k`` of each site's holders) the
   coordinator rebuilds each survivor's self-mask seed and each dropped site's masking key,
   removes every mask and decodes the survivors' sum.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from fedstats.contract import secure_aggregation as wire
from fedstats.contract.secagg_session import (
    KEYS_BYTES,
    SEALED_BYTES,
    SIGNATURE_BYTES,
    Adverts,
    SessionPlan,
    row_bytes,
    rows,
    signature_hex,
)
from fedstats.errors import FedstatsError, InvalidReplyError, SecureAggregationAborted
from fedstats.secagg import crypto, graph, shamir

if TYPE_CHECKING:  # the coordinator passes its federation; this module needs no import of it
    from fedstats.models.federation import Federation

Keep = Callable[[list[str], dict, dict[str, FedstatsError], str], list[str]]
"""Records the failed sites of a step and returns the sites left (raises below ``t``)."""


@dataclass(frozen=True)
class OpenSession:
    """A session whose every site holds its neighbours' shares: ready for the masked round."""

    plan: SessionPlan
    graph: graph.Graph
    keys: dict[str, bytes]  # site -> encryption key | masking key
    sealed: dict[str, list[bytes]]  # sender -> its share pairs, one per neighbour in order


def open_session(
    federation: Federation,
    sites: list[str],
    *,
    construction: str,
    threshold: int,
    fraction_bits: int,
    analysis: str,
    keep: Keep,
) -> OpenSession:
    """Advertise and share keys, starting over without any site that fails before masking."""
    alive = list(sites)
    while True:
        plan = SessionPlan(
            secrets.token_hex(16), tuple(alive), construction, threshold, fraction_bits
        )
        advertised, failures = federation.gather(
            wire.ADVERTISE_TASK, plan.to_args(), analysis=analysis, sites=alive
        )
        adverts = _adverts(advertised, failures)
        left = keep(alive, adverts.keys, failures, "key advertisement")
        if left != alive:
            alive = left
            continue
        seeded = plan.graph(adverts.keys[plan.contributor])
        contributor = _only(adverts, [plan.contributor]).to_wire()
        asked = {
            u: {
                "contributor": contributor,
                "neighbours": _only(adverts, seeded.neighbours(u)).to_wire(),
            }
            for u in alive
        }
        shared, failures = federation.gather(
            wire.SHARE_TASK,
            {"session": plan.session},
            analysis=analysis,
            sites=alive,
            site_args=asked,
        )
        widths = {u: (len(seeded.neighbours(u)), SEALED_BYTES) for u in alive}
        sealed = raw_replies(shared, failures, "sealed", widths.__getitem__)
        left = keep(alive, sealed, failures, "key sharing")
        if left == alive:
            return OpenSession(plan, seeded, dict(adverts.keys), sealed)
        alive = left


def _adverts(advertised: dict, failures: dict[str, FedstatsError]) -> Adverts:
    keys = raw_replies(advertised, failures, "keys", lambda site: (1, KEYS_BYTES))
    signed = raw_replies(advertised, failures, "signature", lambda site: (1, SIGNATURE_BYTES))
    signatures = {}
    for site in list(keys):
        try:
            signatures[site] = signature_hex(signed[site][0])
        except (KeyError, ValueError):
            failures[site] = InvalidReplyError(f"site {site!r} sent a malformed advertisement")
    return Adverts({s: keys[s][0] for s in signatures}, signatures)


def _only(adverts: Adverts, sites: Any) -> Adverts:
    return Adverts({s: adverts.keys[s] for s in sites}, {s: adverts.signatures[s] for s in sites})


def raw_replies(
    replies: Mapping[str, dict],
    failures: dict[str, FedstatsError],
    field: str,
    shape: Callable[[str], tuple[int, int]],
) -> dict[str, list[bytes]]:
    """Each reply's ``field`` as rows of bytes; a reply whose field is not a ``uint8`` array
    of ``shape(site)`` joins ``failures`` (the site then counts as dropped at that step)."""
    out = {}
    for site, reply in replies.items():
        value = reply[field]
        value = value[None, :] if isinstance(value, np.ndarray) and value.ndim == 1 else value
        try:
            out[site] = row_bytes(value, *shape(site), field)
        except ValueError:
            failures[site] = InvalidReplyError(f"site {site!r} sent a malformed {field!r}")
    return out


def mask_blocks(opened: OpenSession) -> dict[str, dict[str, Any]]:
    """Each site's ``secagg`` block: the share pairs its neighbours sealed for it."""
    where = {v: {u: i for i, u in enumerate(opened.graph.neighbours(v))} for v in opened.plan.sites}
    return {
        u: {
            "secagg": wire.MaskBlock(
                opened.plan.session,
                [opened.sealed[v][where[v][u]] for v in opened.graph.neighbours(u)],
            ).to_wire()
        }
        for u in opened.plan.sites
    }


def survivor_block(plan: SessionPlan, survivors: list[str]) -> dict[str, Any]:
    return {"session": plan.session, "survivors": plan.bitmap(survivors)}


def unmask_block(opened: OpenSession, survivors: list[str], signed: Mapping[str, list[bytes]]):
    """The unmasking request: the survivors, the signatures of those that signed them (one
    row each, from :func:`raw_replies`), and how many holders each site has."""
    plan = opened.plan
    signers = [s for s in plan.sites if s in signed]
    return {
        **survivor_block(plan, survivors),
        "signers": plan.bitmap(signers),
        "signatures": rows([signed[s][0] for s in signers], SIGNATURE_BYTES),
        "holders": plan.shape.degree + 1,
    }


def unmasked(
    opened: OpenSession,
    masked: Mapping[str, np.ndarray],
    revealed: Mapping[str, dict],
) -> tuple[np.ndarray, dict[str, bytes]]:
    """The survivors' total with every mask removed, and each survivor's self-mask seed.

    ``masked``: the survivors' masked vectors; ``revealed``: each unmasking site's shares
    (from :func:`raw_replies`), one per site it holds shares of: a survivor's seed share, a
    dropped site's key share."""
    plan, seeded = opened.plan, opened.graph
    threshold = plan.shape.share_threshold
    shares: dict[str, dict[int, bytes]] = {s: {} for s in plan.sites}
    for holder, raw in revealed.items():
        for site, share in zip(seeded.holders(holder), raw, strict=True):
            shares[site][plan.point(holder)] = share
    seeds = {u: _rebuild(shares[u], threshold, u, "self-mask seed") for u in masked}
    total = wire.unmasked_total(masked, seeds)
    length = len(total)
    for lost in (s for s in plan.sites if s not in masked):
        key = crypto.private_from_bytes(_rebuild(shares[lost], threshold, lost, "masking key"))
        for survivor in (u for u in seeded.neighbours(lost) if u in masked):
            peer = opened.keys[survivor][crypto.KEY_BYTES :]
            pair = crypto.mask(crypto.agreed_key(key, peer, plan.session, "mask"), length)
            # the survivor added +pair when it comes first in the session order, else -pair
            total = total - pair if plan.point(survivor) < plan.point(lost) else total + pair
    return total, seeds


def _rebuild(shares: dict[int, bytes], threshold: int, site: str, what: str) -> bytes:
    try:
        return shamir.combine(shares, threshold)
    except ValueError as error:
        raise SecureAggregationAborted(
            f"the shares of {site!r}'s {what} do not rebuild it ({error}: {len(shares)} of its "
            f"holders unmasked, {threshold} needed); nothing was unmasked"
        ) from None
