"""A site's side of secure aggregation's last two rounds: agree on the survivors, then unmask.

After the masked round (:mod:`fedstats.site.secure_aggregation`) the coordinator holds the
masked replies of the *survivors* ``U3``. Before any share leaves, the sites agree on ``U3``
— the consistency check of Bonawitz et al.'s actively secure protocol (CCS 2017, §4):

4. ``secagg.confirm``: a site that masked in the session, is named among the survivors, and
   sees at least ``t`` of them, signs ``(session, U3)`` with its pinned key — once: asked to
   sign another set, it refuses (:class:`~fedstats.errors.DisclosureError`, rule
   ``secagg-survivors``);
5. ``secagg.unmask``: the coordinator relays ``U3`` with the signatures of at least ``t``
   survivors; the site checks that ``U3`` is the set it signed and that ``t`` distinct
   survivors signed that same set with the keys it pinned (rule ``secagg-survivors``
   otherwise). Then, once, for each of its holders ``v`` (itself and its graph neighbours)
   it reveals its share of ``v``'s self-mask seed ``b_v`` if ``v`` survived and of ``v``'s
   masking key ``s_v`` if not.

What this gives, with no site colluding with the coordinator: two different survivor sets
signed by ``t > n/2`` sites each would need a site that signed twice, so every unmasking
site reveals for the same ``U3``. No site's ``b_v`` and ``s_v`` are then both revealed,
no mask between two survivors can be removed (neither key is revealed), and the sum the
coordinator unmasks covers the ``|U3| >= t`` survivors. Nor can it unmask part of them: in
SecAgg+'s ring graph the survivors fall apart only across ``k/2`` consecutive
non-survivors, and a survivor next to such a run keeps at most ``k/2 + 1`` holders among the
survivors, fewer than ``t_k >= k/2 + 2`` (:mod:`fedstats.secagg.graph`), so its self-mask
stays. A coordinator that claims a site's neighbours dropped (to collect their masking keys)
and then asks for that site's seed gets neither without a second survivor set, which no
threshold of sites signs.
"""

from __future__ import annotations

from typing import Any

from fedstats.contract.secagg_session import SIGNATURE_BYTES, row_bytes, rows, signature_hex
from fedstats.contract.secure_aggregation import CONFIRM_TASK, UNMASK_TASK
from fedstats.secagg import shamir
from fedstats.site.secure_aggregation import (
    SiteSession,
    open_session,
    refuse,
    refuse_rule,
    sessions,
    signed,
)
from fedstats.site.task import SiteContext, TaskReply


def _survivors(context: SiteContext, state: SiteSession, bits: Any, task: str) -> tuple[str, ...]:
    try:
        survivors = state.plan.members(bits)
    except ValueError as error:
        raise refuse(context, task, f"survivors: {error}") from None
    if state.me not in survivors:
        raise refuse(context, task, "the survivors must include this site")
    if len(survivors) < state.threshold:
        raise refuse(
            context,
            task,
            f"only {len(survivors)} sites survived, fewer than the threshold {state.threshold}",
        )
    return survivors


def confirm(context: SiteContext, args: dict[str, Any]) -> TaskReply:
    state = open_session(context, args, CONFIRM_TASK)
    if not state.masked or state.unmasked:
        raise refuse(context, CONFIRM_TASK, "this session is not at its consistency round")
    survivors = _survivors(context, state, args.get("survivors"), CONFIRM_TASK)
    if state.confirmed is not None and state.confirmed != survivors:
        raise refuse_rule(
            context,
            CONFIRM_TASK,
            "this site already signed another survivor set for this session; a site signs one",
            "secagg-survivors",
        )
    state.confirmed = survivors
    message = state.plan.survivors_message(survivors)
    return TaskReply({"signature": signed(context, message)}, contributors=None)


def unmask(context: SiteContext, args: dict[str, Any]) -> TaskReply:
    state = open_session(context, args, UNMASK_TASK)
    if not state.masked or state.unmasked:
        raise refuse(context, UNMASK_TASK, "this session is not at its unmasking round")
    survivors = _survivors(context, state, args.get("survivors"), UNMASK_TASK)
    if state.confirmed != survivors:
        raise refuse_rule(
            context,
            UNMASK_TASK,
            "the survivors are not the set this site signed in the consistency round",
            "secagg-survivors",
        )
    holders, asked = state.holders(), args.get("holders")
    if type(asked) is not int or asked != len(holders):
        raise refuse(context, UNMASK_TASK, f"this site holds shares of {len(holders)} sites")
    _check_agreed(context, state, survivors, args)
    state.unmasked = True
    alive = set(survivors)
    revealed = [state.shares[v][1] if v in alive else state.shares[v][0] for v in holders]
    del sessions(context)[state.session]  # keys and shares are forgotten
    return TaskReply({"shares": rows(revealed, shamir.SHARE_BYTES)}, contributors=None)


def _check_agreed(
    context: SiteContext, state: SiteSession, survivors: tuple[str, ...], args: dict[str, Any]
) -> None:
    """At least ``t`` distinct survivors signed this survivor set (pinned sites check every
    signature against the keys they pinned)."""
    try:
        signers = state.plan.members(args.get("signers"))
        signature_rows = row_bytes(
            args.get("signatures"), len(signers), SIGNATURE_BYTES, "signatures"
        )
        signatures = [signature_hex(row) for row in signature_rows]
    except ValueError as error:
        raise refuse(context, UNMASK_TASK, f"survivors' signatures: {error}") from None
    outside = [s for s in signers if s not in survivors]
    if outside or len(signers) < state.threshold:
        raise refuse_rule(
            context,
            UNMASK_TASK,
            f"{len(signers)} signatures from survivors came (signers outside the survivors: "
            f"{outside[:5]}); the unmasking needs {state.threshold}",
            "secagg-survivors",
        )
    if not state.pinned:
        return
    pin = context.secure_aggregation
    message = state.plan.survivors_message(survivors)
    forged = [
        s
        for s, signature in zip(signers, signatures, strict=True)
        if not pin.verify_advert(s, message, signature)
    ]
    if forged:
        raise refuse_rule(
            context,
            UNMASK_TASK,
            f"the survivor set is not signed by {forged[:5]} with the keys this site pinned",
            "secagg-survivors",
        )
