"""A site's side of secure aggregation (Bonawitz et al., CCS 2017, semi-honest protocol).

One aggregation is one *session*, used once. A site ``u`` among the
session's sites ``U`` (ordered; ``u`` is Shamir point ``index(u) + 1``):

1. ``secagg.advertise``: makes two X25519 key pairs, ``c`` (to encrypt
   shares) and ``s`` (to agree masks), and replies their public halves;
2. ``secagg.share``: given the public keys of the sites that advertised
   (``U1``), draws a self-mask seed ``b_u`` and Shamir-shares ``b_u`` and its
   secret key ``s_u`` among ``U1`` with threshold ``t``; replies each share
   pair sealed (AES-GCM) for its receiver, so the relaying coordinator
   cannot read it;
3. the task itself, with a ``secagg`` block carrying every sealed share:
   the site keeps the shares addressed to it (from the senders ``U2``),
   computes its reply ``x_u`` and replies only
   ``y_u = x_u + PRG(b_u) + sum_{v in U2, u < v} PRG(s_uv) - sum_{v in U2, v < u} PRG(s_uv)``
   in the ring ``Z_(2^64)`` (fixed point, :mod:`fedstats.secagg.ring`),
   where ``s_uv`` is the X25519 agreement of ``s_u`` and ``s_v``;
4. ``secagg.unmask``: told which sites of ``U2`` sent masked replies
   (survivors) and which dropped, reveals its shares of ``b_v`` for every
   survivor and of ``s_v`` for every dropped site — never both for one
   site, only once per session, and only when at least ``t`` survived. The
   coordinator then removes every mask and learns the sum over survivors,
   nothing else.

Threat model: the coordinator may look at everything it relays; sites do
not collude with it. A site with a pinned roster (:mod:`fedstats.secagg.roster`)
refuses a session naming a site outside the roster or relaying a key pair not
signed by the key it pinned for that site, so the coordinator can neither
invent sites nor substitute keys; without a pinned roster it must be trusted
to relay honestly, and the site charges for its own share of the noise only.
``t`` must be a majority of the session's sites, so two disjoint groups of
survivors can never both be unmasked.

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

from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from fedstats.contract.dp_request import NoisyGroup
from fedstats.contract.secure_aggregation import (
    ADVERTISE_TASK,
    MASKED_FIELD,
    MAX_SITES,
    SHARE_TASK,
    UNMASK_TASK,
    MaskBlock,
    check_threshold,
    flatten,
    seed_commitment,
)
from fedstats.errors import DisclosureError, MalformedRequestError, StudyConfigurationError
from fedstats.schema import ReplySchema
from fedstats.secagg import crypto, ring, roster, shamir
from fedstats.site.task import SiteContext, TaskReply

MAX_OPEN_SESSIONS = 64
"""A site keeps the keys of at most this many unfinished sessions; older ones are forgotten
(an aborted session's keys do not stay in memory)."""
_CACHE_KEY = "secagg sessions"


@dataclass
class SiteSession:
    """What a site keeps between the rounds of one session (never sent as such)."""

    session: str
    sites: tuple[str, ...]
    me: str
    threshold: int
    fraction_bits: int
    encryption_key: X25519PrivateKey
    masking_key: X25519PrivateKey
    public_keys: dict[str, tuple[str, str]] = field(default_factory=dict)
    self_seed: bytes = b""
    shares: dict[str, tuple[bytes, bytes]] = field(default_factory=dict)  # from v: (s_v, b_v)
    senders: tuple[str, ...] = ()
    masked: bool = False
    unmasked: bool = False
    pinned: bool = False
    """Whether the site's pinned roster vouched for every key of the session; unpinned, the
    site charges its ledger for the noise it adds itself (``sigma / sqrt(t)``)."""

    def point(self, site: str) -> int:
        return self.sites.index(site) + 1


def _sessions(context: SiteContext) -> dict[str, SiteSession]:
    return context.cache.setdefault(_CACHE_KEY, {})


def _session(context: SiteContext, args: dict[str, Any], task: str) -> SiteSession:
    session = args.get("session")
    found = _sessions(context).get(session) if isinstance(session, str) else None
    if found is None:
        raise MalformedRequestError(
            site=context.name, task=task, reason=f"no open secure-aggregation session {session!r}"
        )
    return found


def _refuse(context: SiteContext, task: str, reason: str) -> MalformedRequestError:
    return MalformedRequestError(site=context.name, task=task, reason=reason)


# --- round 1: advertise keys -------------------------------------------------------------


def _refuse_roster(context: SiteContext, task: str, reason: str) -> DisclosureError:
    return DisclosureError(site=context.name, task=task, reason=reason, rule="roster")


def advertise(context: SiteContext, args: dict[str, Any]) -> TaskReply:
    session, sites = args.get("session"), args.get("sites")
    threshold, bits = args.get("threshold"), args.get("fraction_bits")
    if not (isinstance(session, str) and 16 <= len(session) <= 64):
        raise _refuse(context, ADVERTISE_TASK, "the session id must be 16 to 64 characters")
    if session in _sessions(context):
        raise _refuse(context, ADVERTISE_TASK, f"session {session!r} was already used")
    if (
        not isinstance(sites, list)
        or not all(isinstance(s, str) for s in sites)
        or len(set(sites)) != len(sites)
        or context.name not in sites
        or len(sites) > MAX_SITES
    ):
        raise _refuse(
            context, ADVERTISE_TASK, "sites must list distinct site names, this site among them"
        )
    try:
        check_threshold(threshold, len(sites))
        ring.check_fraction_bits(bits)
    except StudyConfigurationError as error:
        raise _refuse(context, ADVERTISE_TASK, str(error)) from None
    pin = context.secure_aggregation
    if pin is not None and pin.unknown_sites(sites):
        raise _refuse_roster(
            context,
            ADVERTISE_TASK,
            f"the session names sites outside this site's pinned roster: "
            f"{pin.unknown_sites(sites)[:5]}",
        )
    state = SiteSession(
        session=session,
        sites=tuple(sites),
        me=context.name,
        threshold=threshold,
        fraction_bits=bits,
        encryption_key=crypto.new_private_key(),
        masking_key=crypto.new_private_key(),
        pinned=pin is not None,
    )
    open_sessions = _sessions(context)
    while len(open_sessions) >= MAX_OPEN_SESSIONS:
        del open_sessions[next(iter(open_sessions))]
    open_sessions[session] = state
    encryption, masking = (
        crypto.public_hex(state.encryption_key),
        crypto.public_hex(state.masking_key),
    )
    signature = (
        "" if pin is None else pin.sign_advert(_advert(state, context.name, encryption, masking))
    )
    return TaskReply(
        {"encryption_key": encryption, "masking_key": masking, "signature": signature},
        contributors=None,
    )


def _advert(state: SiteSession, site: str, encryption: str, masking: str) -> bytes:
    return roster.advert_message(
        state.session, site, state.sites, state.threshold, state.fraction_bits, encryption, masking
    )


# --- round 2: share keys -----------------------------------------------------------------


def _share_aad(session: str, sender: str, receiver: str) -> str:
    return f"{session}|{sender}->{receiver}"


def share(context: SiteContext, args: dict[str, Any]) -> TaskReply:
    state = _session(context, args, SHARE_TASK)
    keys = args.get("public_keys")
    if state.public_keys or state.masked:
        raise _refuse(context, SHARE_TASK, "this session's keys were already shared")
    if not (
        isinstance(keys, dict)
        and set(keys) <= set(state.sites)
        and state.me in keys
        and all(
            isinstance(entry, list)
            and len(entry) in (2, 3)
            and all(isinstance(k, str) for k in entry)
            for entry in keys.values()
        )
    ):
        raise _refuse(
            context,
            SHARE_TASK,
            "public_keys must map session sites to [encryption, masking, signature] keys",
        )
    own = [crypto.public_hex(state.encryption_key), crypto.public_hex(state.masking_key)]
    if keys[state.me][:2] != own:
        raise _refuse(context, SHARE_TASK, "the keys relayed for this site are not its own")
    pin = context.secure_aggregation
    if state.pinned:
        unsigned = [
            site
            for site, entry in keys.items()
            if len(entry) != 3
            or not pin.verify_advert(site, _advert(state, site, entry[0], entry[1]), entry[2])
        ]
        if unsigned:
            raise _refuse_roster(
                context,
                SHARE_TASK,
                f"the keys relayed for {unsigned[:5]} are not signed by the keys this site "
                "pinned for them; the session is refused",
            )
    if len(keys) < state.threshold:
        raise _refuse(
            context,
            SHARE_TASK,
            f"only {len(keys)} sites advertised keys, fewer than the threshold {state.threshold}",
        )
    try:
        for pair in keys.values():
            crypto.public_from_hex(pair[0]), crypto.public_from_hex(pair[1])
    except ValueError as error:
        raise _refuse(context, SHARE_TASK, f"a relayed public key is invalid ({error})") from None
    receivers = [s for s in state.sites if s in keys]
    state.public_keys = {s: (keys[s][0], keys[s][1]) for s in receivers}  # signatures checked
    state.self_seed = secrets.token_bytes(shamir.SECRET_BYTES)
    n = len(state.sites)
    key_shares = shamir.split(crypto.private_bytes(state.masking_key), state.threshold, n)
    seed_shares = shamir.split(state.self_seed, state.threshold, n)
    sealed = []
    for receiver in receivers:
        x = state.point(receiver)
        if receiver == state.me:
            state.shares[state.me] = (key_shares[x], seed_shares[x])
            sealed.append("")
            continue
        key = crypto.agreed_key(
            state.encryption_key, state.public_keys[receiver][0], state.session, "shares"
        )
        sealed.append(
            crypto.seal(
                key,
                key_shares[x] + seed_shares[x],
                _share_aad(state.session, state.me, receiver),
            )
        )
    return TaskReply({"sealed": sealed}, contributors=None)


# --- round 3: the masked reply -----------------------------------------------------------


def open_shares(context: SiteContext, block: MaskBlock, task: str) -> SiteSession:
    """Check the session is at its masked-reply round and keep the shares sealed for this site.

    Runs before anything is charged or computed: a request that fails here
    costs no privacy budget.
    """
    state = _session(context, {"session": block.session}, task)
    if not state.public_keys or state.masked:
        raise _refuse(context, task, "this session is not at its masked-reply round")
    senders = [s for s in state.sites if s in block.sealed]
    if not set(block.sealed) <= set(state.public_keys) or state.me not in senders:
        raise _refuse(context, task, "the sealed shares name sites outside the session")
    if len(senders) < state.threshold:
        raise _refuse(
            context, task, f"only {len(senders)} sites shared keys, fewer than {state.threshold}"
        )
    receivers = list(state.public_keys)
    mine = receivers.index(state.me)
    opened_shares = {}
    for sender in senders:
        if sender == state.me:
            continue
        sealed = block.sealed[sender]
        if len(sealed) != len(receivers):
            raise _refuse(context, task, f"the shares of {sender!r} do not cover the session")
        key = crypto.agreed_key(
            state.encryption_key, state.public_keys[sender][0], state.session, "shares"
        )
        try:
            opened = crypto.open_sealed(
                key, sealed[mine], _share_aad(state.session, sender, state.me)
            )
        except ValueError:
            raise _refuse(
                context, task, f"the share sealed by {sender!r} failed authentication"
            ) from None
        if len(opened) != 2 * shamir.SHARE_BYTES:
            raise _refuse(context, task, f"the share sealed by {sender!r} has the wrong size")
        opened_shares[sender] = (opened[: shamir.SHARE_BYTES], opened[shamir.SHARE_BYTES :])
    state.shares.update(opened_shares)
    state.senders = tuple(senders)
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
    me = state.point(state.me)
    for other in state.senders:
        if other == state.me:
            continue
        seed = crypto.agreed_key(
            state.masking_key, state.public_keys[other][1], state.session, "mask"
        )
        pair = crypto.mask(seed, length)
        total = total + pair if me < state.point(other) else total - pair
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


# --- round 4: unmask ---------------------------------------------------------------------


def unmask(context: SiteContext, args: dict[str, Any]) -> TaskReply:
    state = _session(context, args, UNMASK_TASK)
    survivors, dropped = args.get("survivors"), args.get("dropped")
    if not state.masked or state.unmasked:
        raise _refuse(context, UNMASK_TASK, "this session is not at its unmasking round")
    if not (
        isinstance(survivors, list)
        and isinstance(dropped, list)
        and all(isinstance(s, str) for s in survivors + dropped)
        and len(set(survivors + dropped)) == len(survivors) + len(dropped)
        and set(survivors) | set(dropped) == set(state.senders)
        and state.me in survivors
    ):
        raise _refuse(
            context,
            UNMASK_TASK,
            "survivors and dropped must split the sites that shared keys, this site a survivor",
        )
    if len(survivors) < state.threshold:
        raise _refuse(
            context,
            UNMASK_TASK,
            f"only {len(survivors)} sites survived, fewer than the threshold {state.threshold}",
        )
    state.unmasked = True
    reply = {
        "seed_shares": [state.shares[s][1].hex() for s in survivors],
        "key_shares": [state.shares[s][0].hex() for s in dropped],
    }
    del _sessions(context)[state.session]  # keys and shares are forgotten
    return TaskReply(reply, contributors=None)
