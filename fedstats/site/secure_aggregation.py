"""A site's side of secure aggregation: keys, shares and the masked reply.

One aggregation is one *session*, used once (its plan:
:class:`~fedstats.contract.secagg_session.SessionPlan`). A site ``u`` among the session's
sites (ordered; ``u`` is Shamir point ``index(u) + 1``):

1. ``secagg.advertise``: makes two X25519 key pairs, ``c`` (to seal shares) and ``s`` (to
   agree masks), and replies their public halves, signed with its pinned key;
2. ``secagg.share``: given the first site's signed advertisement (which seeds the graph) and
   its neighbours', computes the session's graph itself
   (:meth:`~fedstats.contract.secagg_session.SessionPlan.graph`: SecAgg+, Bell et al., CCS
   2020, or the complete graph of Bonawitz et al., CCS 2017) and refuses neighbours other
   than the graph's (:class:`~fedstats.errors.DisclosureError`, rule ``secagg-graph``) and
   advertisements its pinned roster does not vouch for (rule ``roster``); then draws a
   self-mask seed ``b_u`` and Shamir-shares ``b_u`` and its secret key ``s_u`` among its
   holders (itself and its ``k`` neighbours) with threshold ``t_k``, each share pair sealed
   (AES-GCM, the session, sender and receiver bound) for its neighbour;
3. the task itself, with a ``secagg`` block carrying the share pairs sealed for this site
   by every neighbour — all of them, each opening under the session, the sender and this
   site as receiver, or the request is refused (rule ``secagg-shares``: a share replayed
   from another session, addressed to another site, altered, or missing). The site
   computes its reply ``x_u`` and replies only
   ``y_u = x_u + PRG(b_u) + sum_{v in N(u), u < v} PRG(s_uv) - sum_{v in N(u), v < u} PRG(s_uv)``
   in the ring ``Z_(2^64)`` (fixed point, :mod:`fedstats.secagg.ring`), ``s_uv`` the
   X25519 agreement of ``s_u`` and ``s_v``; every site masks against all its neighbours,
   so the pairwise masks cancel in the sum over the session;
4. and 5. the consistency check and the unmasking (:mod:`fedstats.site.secure_unmasking`).

Threat model: the coordinator may look at everything it relays; sites do not collude
with it. A site with a pinned roster (:mod:`fedstats.secagg.roster`) refuses a session
naming a site outside the roster or relaying a key pair not signed by the key it pinned for
that site, so the coordinator can neither invent sites nor substitute keys; without a
pinned roster it must be trusted to relay honestly, and the site charges for its own share
of the noise only. ``t`` must be a majority of the session's sites.

With differential privacy, the noise is distributed: each site adds
``1/sqrt(t)`` of the noise standard deviation a central release would need,
so any ``t`` or more masked replies together carry at least the full noise
(Kairouz, Liu & Steinke, "The distributed discrete Gaussian mechanism for
federated learning with secure aggregation", ICML 2021). Fixed-point
encoding rounds each reply to a grid of step ``2^-f``; the data are rounded
before the (separately rounded) noise is added, which moves the L2
sensitivity by at most ``sqrt(d) 2^(-f-1)``, and the site adds noise for that
inflated sensitivity.
"""

from __future__ import annotations

import math
import secrets
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from fedstats.contract.dp_request import NoisyGroup
from fedstats.contract.secagg_session import (
    SEALED_BYTES,
    SIGNATURE_BYTES,
    Adverts,
    SessionPlan,
    rows,
    signature_row,
)
from fedstats.contract.secure_aggregation import (
    ADVERTISE_TASK,
    MASKED_FIELD,
    SHARE_TASK,
    MaskBlock,
    flatten,
    seed_commitment,
)
from fedstats.errors import DisclosureError, MalformedRequestError
from fedstats.schema import ReplySchema
from fedstats.secagg import crypto, ring, shamir
from fedstats.site.task import SiteContext, TaskReply

MAX_OPEN_SESSIONS = 64
"""A site keeps the keys of at most this many unfinished sessions; older ones are forgotten
(an aborted session's keys do not stay in memory)."""
_CACHE_KEY = "secagg sessions"


@dataclass
class SiteSession:
    """What a site keeps between the rounds of one session (never sent as such)."""

    plan: SessionPlan
    me: str
    encryption_key: X25519PrivateKey
    masking_key: X25519PrivateKey
    pinned: bool
    """Whether the site's pinned roster vouched for every key of the session; unpinned, the
    site charges its ledger for the noise it adds itself (``sigma / sqrt(t)``)."""
    neighbours: tuple[str, ...] = ()
    public_keys: dict[str, bytes] = field(default_factory=dict)  # neighbour -> c_v | s_v
    pair_seeds: dict[str, bytes] = field(default_factory=dict)  # neighbour -> s_uv
    self_seed: bytes = b""
    shares: dict[str, tuple[bytes, bytes]] = field(default_factory=dict)  # v: (s_v, b_v) shares
    masked: bool = False
    confirmed: tuple[str, ...] | None = None
    """The survivor set this site signed in the consistency round (once per session)."""
    unmasked: bool = False

    @property
    def session(self) -> str:
        return self.plan.session

    @property
    def sites(self) -> tuple[str, ...]:
        return self.plan.sites

    @property
    def threshold(self) -> int:
        return self.plan.threshold

    @property
    def fraction_bits(self) -> int:
        return self.plan.fraction_bits

    @property
    def own_keys(self) -> bytes:
        return crypto.public_bytes(self.encryption_key) + crypto.public_bytes(self.masking_key)

    def holders(self) -> tuple[str, ...]:
        """This site and its neighbours, in the session's order: whose shares it holds."""
        mine = set(self.neighbours) | {self.me}
        return tuple(s for s in self.sites if s in mine)


def sessions(context: SiteContext) -> dict[str, SiteSession]:
    return context.cache.setdefault(_CACHE_KEY, {})


def open_session(context: SiteContext, args: dict[str, Any], task: str) -> SiteSession:
    session = args.get("session")
    found = sessions(context).get(session) if isinstance(session, str) else None
    if found is None:
        raise refuse(context, task, f"no open secure-aggregation session {session!r}")
    return found


def refuse(context: SiteContext, task: str, reason: str) -> MalformedRequestError:
    return MalformedRequestError(site=context.name, task=task, reason=reason)


def refuse_rule(context: SiteContext, task: str, reason: str, rule: str) -> DisclosureError:
    """A refusal of the protocol's rules: ``roster`` (keys or sites the pinned roster does not
    vouch for), ``secagg-graph`` (neighbours other than the session's graph gives),
    ``secagg-shares`` (shares missing, misaddressed, replayed or altered), ``secagg-survivors``
    (a survivor set not agreed by the session's threshold)."""
    return DisclosureError(site=context.name, task=task, reason=reason, rule=rule)


def signed(context: SiteContext, message: bytes) -> np.ndarray:
    """This site's signature of ``message`` as a wire row (empty when not pinned)."""
    pin = context.secure_aggregation
    row = signature_row("" if pin is None else pin.sign_advert(message))
    return rows([row], SIGNATURE_BYTES)[0]


# --- round 1: advertise keys -------------------------------------------------------------


def advertise(context: SiteContext, args: dict[str, Any]) -> TaskReply:
    try:
        plan = SessionPlan.from_args(args)
    except ValueError as error:
        raise refuse(context, ADVERTISE_TASK, str(error)) from None
    if context.name not in plan.sites:
        raise refuse(context, ADVERTISE_TASK, "the session's sites must include this site")
    if plan.session in sessions(context):
        raise refuse(context, ADVERTISE_TASK, f"session {plan.session!r} was already used")
    pin = context.secure_aggregation
    if pin is not None and pin.unknown_sites(plan.sites):
        raise refuse_rule(
            context,
            ADVERTISE_TASK,
            f"the session names sites outside this site's pinned roster: "
            f"{pin.unknown_sites(plan.sites)[:5]}",
            "roster",
        )
    state = SiteSession(
        plan=plan,
        me=context.name,
        encryption_key=crypto.new_private_key(),
        masking_key=crypto.new_private_key(),
        pinned=pin is not None,
    )
    open_sessions = sessions(context)
    while len(open_sessions) >= MAX_OPEN_SESSIONS:
        del open_sessions[next(iter(open_sessions))]
    open_sessions[plan.session] = state
    keys = state.own_keys
    return TaskReply(
        {
            "keys": np.frombuffer(keys, dtype=np.uint8).copy(),
            "signature": signed(context, plan.advert(context.name, keys)),
        },
        contributors=None,
    )


# --- round 2: share keys with the graph's neighbours -------------------------------------


def share_aad(session: str, sender: str, receiver: str) -> str:
    return f"{session}|{sender}->{receiver}"


def share(context: SiteContext, args: dict[str, Any]) -> TaskReply:
    state = open_session(context, args, SHARE_TASK)
    if state.neighbours or state.masked:
        raise refuse(context, SHARE_TASK, "this session's keys were already shared")
    try:
        seeding, relayed = (
            Adverts.from_wire(args.get("contributor")),
            Adverts.from_wire(args.get("neighbours")),
        )
    except ValueError as error:
        raise refuse(context, SHARE_TASK, f"malformed advertisements: {error}") from None
    plan = state.plan
    if list(seeding.keys) != [plan.contributor]:
        raise refuse_rule(
            context,
            SHARE_TASK,
            f"the graph is seeded by the session's first site {plan.contributor!r}, not "
            f"{list(seeding.keys)[:3]}",
            "secagg-graph",
        )
    if plan.contributor == state.me and seeding.keys[state.me] != state.own_keys:
        raise refuse(context, SHARE_TASK, "the keys relayed for this site are not its own")
    _check_signed(context, state, seeding)
    mine = plan.graph(seeding.keys[plan.contributor]).neighbours(state.me)
    if list(relayed.keys) != list(mine):
        raise refuse_rule(
            context,
            SHARE_TASK,
            f"the sites relayed as this site's neighbours {sorted(relayed.keys)[:8]} are not "
            f"the ones the session's graph gives it {sorted(mine)[:8]} (in the session's "
            "order); the session is refused",
            "secagg-graph",
        )
    _check_signed(context, state, relayed)
    try:  # both agreements with every neighbour, before anything is drawn
        sealing = {v: _agreed(state, keys, "shares") for v, keys in relayed.keys.items()}
        pairs = {v: _agreed(state, keys, "mask") for v, keys in relayed.keys.items()}
    except ValueError as error:
        raise refuse(context, SHARE_TASK, f"a relayed public key is invalid ({error})") from None
    state.neighbours, state.public_keys, state.pair_seeds = tuple(mine), relayed.keys, pairs
    state.self_seed = secrets.token_bytes(shamir.SECRET_BYTES)
    points = [plan.point(s) for s in state.holders()]
    threshold = plan.shape.share_threshold
    key_shares = shamir.split_at(crypto.private_bytes(state.masking_key), threshold, points)
    seed_shares = shamir.split_at(state.self_seed, threshold, points)
    mine_at = plan.point(state.me)
    state.shares[state.me] = (key_shares[mine_at], seed_shares[mine_at])
    sealed = [
        crypto.seal(
            sealing[receiver],
            key_shares[plan.point(receiver)] + seed_shares[plan.point(receiver)],
            share_aad(plan.session, state.me, receiver),
        )
        for receiver in mine
    ]
    return TaskReply({"sealed": rows(sealed, SEALED_BYTES)}, contributors=None)


def _agreed(state: SiteSession, keys: bytes, purpose: str) -> bytes:
    """The key this site agrees with a neighbour of public ``keys``: to seal shares (its
    encryption key) or to mask (its masking key); ``ValueError`` for a key that is not one."""
    if purpose == "shares":
        own, peer = state.encryption_key, keys[: crypto.KEY_BYTES]
    else:
        own, peer = state.masking_key, keys[crypto.KEY_BYTES :]
    return crypto.agreed_key(own, peer, state.session, purpose)


def _check_signed(context: SiteContext, state: SiteSession, adverts: Adverts) -> None:
    if not state.pinned:
        return
    pin = context.secure_aggregation
    unsigned = [
        site
        for site, keys in adverts.keys.items()
        if not pin.verify_advert(site, state.plan.advert(site, keys), adverts.signatures[site])
    ]
    if unsigned:
        raise refuse_rule(
            context,
            SHARE_TASK,
            f"the keys relayed for {unsigned[:5]} are not signed by the keys this site "
            "pinned for them; the session is refused",
            "roster",
        )


# --- round 3: the masked reply -----------------------------------------------------------


def open_shares(context: SiteContext, block: MaskBlock, task: str) -> SiteSession:
    """Check the session is at its masked-reply round and open every neighbour's shares.

    Runs before anything is charged or computed: a request that fails here
    costs no privacy budget.
    """
    state = open_session(context, {"session": block.session}, task)
    if not state.neighbours or state.masked:
        raise refuse(context, task, "this session is not at its masked-reply round")
    if len(block.sealed) != len(state.neighbours):
        raise refuse_rule(
            context,
            task,
            f"{len(block.sealed)} sealed shares came for this site's {len(state.neighbours)} "
            "neighbours: every neighbour's shares are needed, so that every pairwise mask "
            "cancels and every mask can be removed",
            "secagg-shares",
        )
    opened_shares = {}
    for sender, sealed in zip(state.neighbours, block.sealed, strict=True):
        try:
            opened = crypto.open_sealed(
                _agreed(state, state.public_keys[sender], "shares"),
                sealed,
                share_aad(state.session, sender, state.me),
            )
        except ValueError:
            opened = b""
        if len(opened) != 2 * shamir.SHARE_BYTES:
            raise refuse_rule(
                context,
                task,
                f"the share sealed by {sender!r} does not open for this site in this session "
                "(replayed from another session, addressed to another site, or altered)",
                "secagg-shares",
            )
        opened_shares[sender] = (opened[: shamir.SHARE_BYTES], opened[shamir.SHARE_BYTES :])
    state.shares.update(opened_shares)
    return state


def noise_multipliers(
    state: SiteSession, groups: list[NoisyGroup], sigmas: list[float], plain: ReplySchema
) -> list[float]:
    """Each group's multiplier for this site's share of distributed noise.

    A group of ``d`` entries with sensitivity ``Delta`` gets standard
    deviation ``sigma (Delta + sqrt(d) 2^(-f-1)) / sqrt(t)``: ``t`` sites
    together reach ``sigma`` times the sensitivity of the rounded data.
    """
    step = ring.resolution(state.fraction_bits) / 2
    out = []
    for group, sigma in zip(groups, sigmas, strict=True):
        size = sum(plain[f].size() for f in group.fields)
        inflated = group.l2_sensitivity + math.sqrt(size) * step
        out.append(sigma * inflated / group.l2_sensitivity / math.sqrt(state.threshold))
    return out


def mask_reply(
    state: SiteSession,
    payload: dict[str, Any],
    noise: dict[str, Any] | None,
    plain: ReplySchema,
    task: str,
) -> dict[str, Any]:
    """``y_u``: the payload and its noise, each rounded to the grid, masked for the session.

    The session's masked round is then over: a second masked reply under the
    same masks would reveal the difference of two inputs.
    """
    parties = 2 * len(state.sites)  # data and noise are encoded apart; their sum stays in range
    state.masked = True
    try:
        total = ring.encode(flatten(payload, plain), state.fraction_bits, parties)
        if noise is not None:
            total = total + ring.encode(flatten(noise, plain), state.fraction_bits, parties)
    except ValueError as error:
        raise MalformedRequestError(site=state.me, task=task, reason=str(error)) from None
    length = len(total)
    total = total + crypto.mask(state.self_seed, length)
    me = state.plan.point(state.me)
    for other in state.neighbours:
        pair = crypto.mask(state.pair_seeds[other], length)
        total = total + pair if me < state.plan.point(other) else total - pair
    return {MASKED_FIELD: total}


def mask_facts(state: SiteSession) -> dict[str, Any]:
    """What a site signs beside its masked reply on a verified path
    (:data:`fedstats.contract.secure_aggregation.MASK_FACTS`): the session, its precision and
    the commitment to the self-mask seed the unmasking will reveal."""
    return {
        "session": state.session,
        "fraction_bits": state.fraction_bits,
        "seed_commitment": seed_commitment(state.session, state.me, state.self_seed),
    }
