"""Site side of a record linkage (:mod:`fedstats.contract.tasks.record_linkage`).

* ``linkage.advertise``: for (linkage id, the two sites, the fingerprint of the site's own
  ``[linkage]`` schema) a fresh X25519 key pair; the reply is the public key and the number
  of records, signed with the site's pinned roster key. Refused: a site without
  identifiers or pinned roster, a request naming another fingerprint, another site
  outside the roster, a linkage id already used for another linkage, fewer records than
  the site's threshold ``min_count``.
* ``linkage.encode``: the other site's advert, relayed, is checked against the key this
  site pinned for it (never a key the coordinator relays unsigned or signs itself); the
  secret is ``agreed_key(own, other's public key, session, "linkage")``
  (:func:`fedstats.secagg.crypto.agreed_key`), derived at the two sites only; the
  identifier table is encoded (:func:`linkage.encode`) in a random order the site draws
  from OS entropy and keeps (position -> patient), and the private key is dropped. Once
  per linkage id: a repeat would hand out the same patients' encodings again, in another
  order or (were the key kept) under another secret, and is refused.
* ``linkage.accept``: the linkage unit's positions (in the order the site sent) and pair
  ids; positions in range and each once, pair ids each once, then
  :meth:`fedstats.site.linked_rows.LinkageStore.accept` (fewer than ``min_count`` pairs,
  differencing against accepted linkages, a reused id).

A site that requires differential privacy for everything answers none of them (rule
``privacy-required``, as every task about patients that has no private form): the
encodings are per-patient releases with no noise, from which the linkage unit learns which
records link and the frequency patterns of Bloom filters (Christen et al. 2017, 2018); and
they would serve only exact vertical fits, which such a site refuses anyway.

What the linkage unit can still do, and no site check stops: choose, among the records it
matched, which positions it maps (at least ``min_count`` of them), e.g. the records whose
encodings it guessed; a vertical fit over them is then a fit over at least ``min_count``
patients of its choosing, as it is in any cohort the coordinator defines.
"""

from __future__ import annotations

from typing import Any

import numpy as np

import linkage
from fedstats.contract.tasks import record_linkage as wire
from fedstats.errors import DisclosureError, MalformedRequestError, SiteError
from fedstats.secagg import crypto
from fedstats.site.identifiers import MAX_LINKAGES, LinkageSession, SiteIdentifiers
from fedstats.site.linked_rows import LinkedRows
from fedstats.site.task import SiteContext, TaskReply


def advertise(ctx: SiteContext, args: dict[str, Any]) -> TaskReply:
    """A fresh public key for one linkage, and the records the site will encode, signed."""
    inputs, pin = _inputs(ctx, wire.ADVERTISE)
    study, linkage_id = wire.study_of(args), wire.linkage_of(args)
    sites, fingerprint = wire.sites_of(args), wire.fingerprint_of(args)
    _other_site(ctx, sites, pin, wire.ADVERTISE)
    _own_schema(ctx, inputs, fingerprint, wire.ADVERTISE)
    if inputs.records < ctx.policy.min_count:
        raise DisclosureError(
            site=ctx.name,
            task=wire.ADVERTISE,
            reason=f"an identifier table of fewer patients than the disclosure threshold of "
            f"{ctx.policy.min_count}",
            rule="threshold",
        )
    with inputs.lock:
        held = inputs.sessions.get(linkage_id)
        if held is not None:
            if (held.study, held.sites, held.fingerprint) != (study, sites, fingerprint):
                raise _refused(
                    ctx,
                    wire.ADVERTISE,
                    f"linkage id {linkage_id!r} is taken by another linkage; a new linkage "
                    "takes a new id",
                )
            state = held  # the same advert again: nothing new leaves
        else:
            if ctx.linkages is not None and linkage_id in ctx.linkages:  # kept from any run
                raise _refused(
                    ctx,
                    wire.ADVERTISE,
                    f"this site already accepted linkage {linkage_id!r}; it encodes a linkage "
                    "id once, and a new linkage takes a new id",
                )
            if len(inputs.sessions) >= MAX_LINKAGES:
                raise _refused(
                    ctx, wire.ADVERTISE, f"this site takes part in at most {MAX_LINKAGES} linkages"
                )
            key = crypto.new_private_key()
            public = crypto.public_bytes(key)
            statement = wire.advert_statement(
                study, linkage_id, sites, fingerprint, ctx.name, public
            )
            state = LinkageSession(
                study=study,
                sites=sites,
                fingerprint=fingerprint,
                private_key=key,
                public_key=public,
                signature=pin.sign_advert(statement),
            )
            inputs.sessions[linkage_id] = state
    return TaskReply(
        {
            "public_key": np.frombuffer(state.public_key, dtype=np.uint8).copy(),
            "records": inputs.records,
            "signature": state.signature,
        },
        contributors=inputs.records,
    )


def encode(ctx: SiteContext, args: dict[str, Any]) -> TaskReply:
    """The identifier table's encodings under the secret agreed with the other site, once."""
    inputs, pin = _inputs(ctx, wire.ENCODE)
    study, linkage_id = wire.study_of(args), wire.linkage_of(args)
    sites, fingerprint = wire.sites_of(args), wire.fingerprint_of(args)
    other = _other_site(ctx, sites, pin, wire.ENCODE)
    _own_schema(ctx, inputs, fingerprint, wire.ENCODE)
    declared = (wire.records_of(args), wire.clk_bytes_of(args), wire.token_keys_of(args))
    own = (inputs.records, inputs.schema.length_bytes, inputs.token_keys)
    if declared != own:
        raise MalformedRequestError(
            site=ctx.name,
            task=wire.ENCODE,
            reason=f"the request declares {declared[0]} records of {declared[1]} bytes and "
            f"{declared[2]} blocking tokens; this site encodes its {own[0]} records advertised "
            f"as {own[1]} bytes and {own[2]} tokens each under its own schema",
        )
    peer_key, peer_signature = wire.peer_of(args)
    with inputs.lock:
        state = inputs.sessions.get(linkage_id)
        if state is None or (state.study, state.sites, state.fingerprint) != (
            study,
            sites,
            fingerprint,
        ):
            raise _refused(
                ctx,
                wire.ENCODE,
                f"this site advertised no key for linkage {linkage_id!r} between these sites "
                "under this schema: linkage.advertise comes first",
            )
        if state.encoded:
            raise _refused(
                ctx,
                wire.ENCODE,
                f"this site encoded its identifiers for linkage {linkage_id!r} once; a linkage "
                "id is encoded once (a new linkage takes a new id and new keys)",
            )
        signed = wire.advert_statement(study, linkage_id, sites, fingerprint, other, peer_key)
        if not pin.verify_advert(other, signed, peer_signature):
            raise DisclosureError(
                site=ctx.name,
                task=wire.ENCODE,
                reason=f"the key relayed for {other!r} is not signed by the key this site "
                f"pinned for {other!r} for this study, linkage, sites and schema",
                rule="roster",
            )
        private_key, state.private_key, state.encoded = state.private_key, None, True
    try:
        secret = crypto.agreed_key(
            private_key, peer_key, wire.session(study, linkage_id, sites, fingerprint), wire.PURPOSE
        )
    except ValueError:
        raise _refused(ctx, wire.ENCODE, f"the key relayed for {other!r} is not one") from None
    order = np.random.default_rng().permutation(inputs.records)  # OS entropy
    encodings = linkage.encode(inputs.table.iloc[order], inputs.schema, secret)
    state.patients = inputs.table.index.to_numpy()[order]
    tokens = encodings.blocking_tokens
    if tokens is None:
        tokens = np.zeros((inputs.records, 0), dtype=np.uint64)
    return TaskReply(
        {"clks": np.ascontiguousarray(encodings.clks), "tokens": np.ascontiguousarray(tokens)},
        contributors=inputs.records,
    )


def accept(ctx: SiteContext, args: dict[str, Any]) -> TaskReply:
    """The linkage unit's mapping for this site, accepted as its linked rows."""
    inputs, _ = _inputs(ctx, wire.ACCEPT)
    linkage_id = wire.linkage_of(args)
    positions, pair_ids = wire.mapping_of(args)
    state = inputs.sessions.get(linkage_id)
    if state is None or state.patients is None:
        raise _refused(
            ctx,
            wire.ACCEPT,
            f"this site sent no encodings for linkage {linkage_id!r}: the mapping has no order "
            "to be read in",
        )
    if positions.size and (positions.min() < 0 or positions.max() >= len(state.patients)):
        raise MalformedRequestError(
            site=ctx.name,
            task=wire.ACCEPT,
            reason=f"a position is outside the {len(state.patients)} records this site sent",
        )
    if np.unique(positions).size != positions.size:
        raise MalformedRequestError(
            site=ctx.name, task=wire.ACCEPT, reason="a record position is mapped twice"
        )
    if np.unique(pair_ids).size != pair_ids.size:
        raise MalformedRequestError(
            site=ctx.name, task=wire.ACCEPT, reason="a pair id is given to two records"
        )
    order = np.argsort(pair_ids, kind="stable")
    rows = LinkedRows(linkage_id, pair_ids[order], state.patients[positions[order]])
    try:
        ctx.linkages.accept(rows)
    except SiteError as error:  # the store's refusals, under this task's name
        raise type(error)(**{**error.values(), "task": wire.ACCEPT}) from None
    return TaskReply({"pairs": rows.n_pairs}, contributors=rows.n_pairs)


# ------------------------------------------------------------------ helpers


def _inputs(ctx: SiteContext, task: str) -> tuple[SiteIdentifiers, Any]:
    if ctx.identifiers is None:
        raise DisclosureError(
            site=ctx.name,
            task=task,
            reason="this site holds no identifier table and [linkage] schema, so it takes part "
            "in no record linkage (its data engineer gives them to the site: the identifiers "
            "harmonize read under a study specification with a [linkage] table)",
            rule="linkage",
        )
    if ctx.secure_aggregation is None:
        raise DisclosureError(
            site=ctx.name,
            task=task,
            reason="a record linkage's keys are signed and checked with the study's pinned "
            "roster and signing key, which this site does not have",
            rule="roster",
        )
    return ctx.identifiers, ctx.secure_aggregation


def _other_site(ctx: SiteContext, sites: tuple[str, str], pin: Any, task: str) -> str:
    if ctx.name not in sites:
        raise MalformedRequestError(
            site=ctx.name, task=task, reason="the linkage's two sites must include this site"
        )
    other = sites[1] if sites[0] == ctx.name else sites[0]
    if pin.unknown_sites([other]):
        raise DisclosureError(
            site=ctx.name,
            task=task,
            reason="the other site of the linkage is not on this site's pinned roster",
            rule="roster",
        )
    return other


def _own_schema(ctx: SiteContext, inputs: SiteIdentifiers, fingerprint: str, task: str) -> None:
    if fingerprint != inputs.fingerprint:
        raise _refused(
            ctx,
            task,
            f"the request names linkage schema {fingerprint[:12]}, not this site's own "
            f"{inputs.fingerprint[:12]} (from its study specification's [linkage] table); "
            "both sites must encode under the study's one schema",
        )


def _refused(ctx: SiteContext, task: str, reason: str) -> DisclosureError:
    return DisclosureError(site=ctx.name, task=task, reason=reason, rule="linkage")
