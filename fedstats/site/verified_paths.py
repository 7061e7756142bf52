"""A site's half of the path rules: answer an exact fit only at points it re-derived itself.

The rule of each task (:data:`PATH_RULES`, from :mod:`fedstats.contract.paths`)
says where its fit starts and how it steps. Before any row is read, a request
of such a task carries its ``path`` (the fit's sites, the round, the previous
point and every site's signed reply there); the site checks each signature
with the key its roster pins for that site, sums the replies and re-derives
the point with the contract's own step, and refuses (rule ``path``) a point
further than :data:`~fedstats.contract.paths.TOLERANCE` standard errors from
it. Its own reply is then signed over the point (:func:`signature`), so the
next round can be checked by every site in turn.

Switched on per site (``Silo(verified_paths=True)``, which needs the pinned
roster and signing key of :class:`~fedstats.secagg.roster.RosterPin`); a site with a
pinned key that does not verify still signs its replies, so a fit can cross sites of
both kinds (each verifying site checks its own signature at the previous point). Not
yet covered: requests inside secure aggregation (their replies are masked,
so no site can re-derive the step from them), private requests (their noise
is charged, and their points need no derivation), and tasks without a rule.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from fedstats.contract.paths import (
    MAX_ROUND,
    PATH_KEY,
    TOLERANCE,
    NewtonPath,
    design_digest,
    deviation,
    statement,
)
from fedstats.errors import DisclosureError
from fedstats.site.task import SiteContext

PATH_RULES: dict[str, NewtonPath] = {"logistic.summaries": NewtonPath()}
"""The tasks answered only on a verified path, and each one's rule."""

MAX_SIGNATURE_CHARS = 200
"""Longest hex signature accepted (Ed25519: 128; DER ECDSA P-256: at most 144)."""


@dataclass(frozen=True)
class PathPoint:
    """A verified point: what the site's signature over its reply there covers."""

    task: str
    design: str
    sites: tuple[str, ...]
    round: int
    beta: np.ndarray


def verified_point(
    ctx: SiteContext, task: str, args: dict[str, Any], *, secure: bool
) -> PathPoint | None:
    """The request's point once verified (``None`` when no path rule applies to it).

    Raises :class:`~fedstats.errors.DisclosureError` (rule ``path``) for a request without a
    well-formed path, a relayed reply that is missing, unsigned or signed by another key, or
    a point the relayed replies do not lead to. Reads no row.
    """
    rule = PATH_RULES.get(task)
    pin = ctx.secure_aggregation
    if rule is None or pin is None or args.get("dp") is not None or secure:
        return None
    path = args.get(PATH_KEY)
    if not ctx.verified_paths:
        return _unverified(ctx, task, args, path)
    if not isinstance(path, dict):
        raise _refused(ctx, task, "an exact request of this fit must carry its path")
    beta = args.get("beta")
    if not (isinstance(beta, np.ndarray) and beta.ndim == 1 and beta.dtype.kind == "f"):
        raise _refused(ctx, task, "the path's point must be an array of coefficients")
    sites = _sites(ctx, task, path.get("sites"), pin)
    round_ = path.get("round")
    if type(round_) is not int or not 1 <= round_ <= MAX_ROUND:
        raise _refused(ctx, task, f"the path's round must be an integer from 1 to {MAX_ROUND}")
    design = design_digest(args.get("design"))
    point = PathPoint(task, design, sites, round_, beta)
    if round_ == 1:
        if set(path) != {"sites", "round"} or not np.array_equal(beta, rule.start(len(beta))):
            raise _refused(ctx, task, "round 1 of the path starts at the rule's start point")
        return point
    if set(path) != {"sites", "round", "previous", "replies"}:
        raise _refused(ctx, task, "a later round carries the previous point and its replies")
    previous = path["previous"]
    if not (isinstance(previous, np.ndarray) and previous.shape == beta.shape):
        raise _refused(ctx, task, "the previous point must have the point's shape")
    replies = _signed_replies(ctx, task, path["replies"], point, previous, pin)
    if not all(_sums_fit(rule, reply, len(beta)) for reply in replies.values()):
        raise _refused(ctx, task, "a relayed reply does not hold this fit's sums")
    derived = rule.next_point(np.asarray(previous, dtype=np.float64), replies)
    if derived is None:
        raise _refused(ctx, task, "the path ends at the previous point (singular information)")
    target, information = derived
    if not deviation(beta, target, information) <= TOLERANCE:
        raise _refused(
            ctx,
            task,
            f"the coefficients are not the next point of the path (more than {TOLERANCE:g} "
            "standard errors from the step the relayed replies give)",
        )
    return point


def _unverified(ctx: SiteContext, task: str, args: dict[str, Any], path: Any) -> PathPoint | None:
    """A site that does not verify paths still signs its replies to a request that carries a
    well-formed one: the signature vouches for the reply, not the point (a verifying site
    vouches for the point by its own signature, which every round must relay)."""
    if not isinstance(path, dict):
        return None
    sites, round_, beta = path.get("sites"), path.get("round"), args.get("beta")
    if not (
        isinstance(sites, list)
        and all(isinstance(s, str) for s in sites)
        and type(round_) is int
        and isinstance(beta, np.ndarray)
    ):
        return None
    return PathPoint(task, design_digest(args.get("design")), tuple(sites), round_, beta)


def signature(ctx: SiteContext, point: PathPoint, payload: dict[str, Any]) -> str:
    """This site's signature over its reply at a verified point."""
    return ctx.secure_aggregation.sign_advert(
        statement(
            task=point.task,
            design=point.design,
            sites=point.sites,
            round=point.round,
            beta=point.beta,
            reply=payload,
            verified=ctx.verified_paths,
        )
    )


def _sites(ctx: SiteContext, task: str, sites: Any, pin: Any) -> tuple[str, ...]:
    if not (
        isinstance(sites, list)
        and sites
        and all(isinstance(s, str) for s in sites)
        and sites == sorted(set(sites))
    ):
        raise _refused(ctx, task, "the path's sites must be a sorted list of distinct names")
    if ctx.name not in sites or any(s not in pin.sites for s in sites):
        raise _refused(ctx, task, "the path's sites must include this site and be on its roster")
    return tuple(sites)


def _signed_replies(
    ctx: SiteContext, task: str, replies: Any, point: PathPoint, previous: np.ndarray, pin: Any
) -> dict[str, dict[str, Any]]:
    """The previous round's replies, each checked against its site's pinned key."""
    if not isinstance(replies, dict) or sorted(replies) != list(point.sites):
        raise _refused(ctx, task, "the path needs the previous reply of every one of its sites")
    out = {}
    for site in point.sites:
        signed = replies[site]
        if not (
            isinstance(signed, dict)
            and set(signed) == {"reply", "signature", "verified"}
            and isinstance(signed["reply"], dict)
            and isinstance(signed["signature"], str)
            and len(signed["signature"]) <= MAX_SIGNATURE_CHARS
            and isinstance(signed["verified"], bool)
        ):
            raise _refused(ctx, task, f"the relayed reply of {site!r} is malformed")
        if site == ctx.name and not signed["verified"]:
            raise _refused(ctx, task, "this site did not verify the previous point")
        message = statement(
            task=point.task,
            design=point.design,
            sites=point.sites,
            round=point.round - 1,
            beta=previous,
            reply=signed["reply"],
            verified=signed["verified"],
        )
        if not pin.verify_advert(site, message, signed["signature"]):
            raise _refused(
                ctx,
                task,
                f"the relayed reply of {site!r} is not signed by the key this site's roster "
                "pins for it at the previous point",
            )
        out[site] = signed["reply"]
    return out


def _sums_fit(rule: NewtonPath, reply: dict[str, Any], p: int) -> bool:
    score, information = reply.get(rule.score), reply.get(rule.information)
    return (
        isinstance(score, np.ndarray)
        and score.shape == (p,)
        and isinstance(information, np.ndarray)
        and information.shape == (p, p)
    )


def _refused(ctx: SiteContext, task: str, reason: str) -> DisclosureError:
    return DisclosureError(site=ctx.name, task=task, reason=reason, rule="path")
