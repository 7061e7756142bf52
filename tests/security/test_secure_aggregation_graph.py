"""SecAgg+ under attack: a coordinator that picks a site's neighbours, fakes dropouts, replays
or misroutes shares.

In SecAgg+ (Bell et al., CCS 2020) a site shares its secrets with, and masks against, only
its ``k`` graph neighbours. Every attack below is the coordinator's: it relays every
message and may change any of them, but no site colludes with it and every site pinned the
study's roster. Each attack is refused by the site it targets, naming the rule
(``secagg-graph``, ``secagg-shares``, ``secagg-survivors``, ``roster``), or yields nothing
beyond the survivors' sum.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import fedstats
from fedstats.contract.secagg_session import Adverts, signature_hex
from fedstats.contract.secure_aggregation import MaskBlock
from fedstats.errors import DisclosureError, MalformedRequestError, SecureAggregationAborted
from fedstats.models.secure_rounds import OpenSession, unmasked
from fedstats.secagg import crypto, graph, roster, shamir
from fedstats.secagg import ring as secagg_ring
from fedstats.site import secure_aggregation as secagg_site
from fedstats.site import secure_unmasking as secagg_unmasking
from tests.security.secagg_sessions import session

TWELVE = [f"s{i:02d}" for i in range(12)]  # t = n: a ring of degree 4, t_k = 4 of 5 holders
TWENTY = [f"s{i:02d}" for i in range(20)]  # t = 18: degree 8, t_k = 6 of 9 holders


def test_the_graph_is_sparse_for_many_sites_and_complete_for_few():
    """Degree and per-neighbourhood threshold follow from (n, t) alone (both sides compute
    them); with few sites, or many dropouts tolerated, the graph is the complete one."""
    assert graph.neighbourhood(12, 12) == graph.Neighbourhood(4, 4, False)
    assert graph.neighbourhood(20, 18) == graph.Neighbourhood(8, 6, False)
    assert graph.neighbourhood(100, 100).degree == 12
    assert graph.neighbourhood(8, 8).complete and graph.neighbourhood(30, 16).complete
    for n in (10, 30, 100, 256):
        for t in (n, n - 1, -(-9 * n // 10)):
            shape = graph.neighbourhood(n, t)
            if not shape.complete:  # privacy: a survivor beside k/2 missing keeps < t_k holders
                assert shape.share_threshold >= shape.degree // 2 + 2
                assert shape.degree % 2 == 0 and 2 * shape.degree < n
    for names, t in ((TWELVE, 12), (TWENTY, 18)):
        drawn = session(names, threshold=t).advertise()
        k, t_k = drawn.plan.shape.degree, drawn.plan.shape.share_threshold
        ring = graph.ring_order(drawn.plan.graph_seed(drawn.adverts.keys[names[0]]), names)
        for at, site in enumerate(ring):
            near = {ring[(at + step) % len(ring)] for step in range(-k // 2, k // 2 + 1)}
            assert set(drawn.graph.neighbours(site)) == near - {site}  # H(k, n) on the ring
            # a site whose k/2 neighbours on one side are gone keeps k/2 + 1 holders: < t_k
            one_side = {ring[(at + step) % len(ring)] for step in range(1, k // 2 + 1)}
            assert len(set(drawn.graph.holders(site)) - one_side) == k // 2 + 1 < t_k


def test_a_site_refuses_neighbours_other_than_the_graph_gives_it():
    """The coordinator swaps one of a site's neighbours for another signed site, leaves one
    out, or lists them out of order: refused, rule ``secagg-graph``, and nothing is sealed."""
    drawn = session(TWELVE).advertise()
    target = TWELVE[3]
    mine = list(drawn.graph.neighbours(target))
    stranger = next(s for s in TWELVE if s not in mine and s != target)
    for relayed in ([*mine[:-1], stranger], mine[:-1], mine[::-1]):
        with pytest.raises(DisclosureError, match="not the ones the session's graph") as refused:
            secagg_site.share(drawn.contexts[target], drawn.share_args(target, relayed))
        assert refused.value.rule == "secagg-graph"
    state = secagg_site.sessions(drawn.contexts[target])[drawn.plan.session]
    assert not state.neighbours and not state.shares  # nothing drawn, nothing sealed
    reply = secagg_site.share(drawn.contexts[target], drawn.share_args(target))
    assert reply.payload["sealed"].shape == (4, secagg_site.SEALED_BYTES)


def test_a_neighbour_list_built_to_surround_a_target_is_refused():
    """The coordinator wants the target's neighbours to be sites it chose. Relaying them as
    the neighbours is refused (``secagg-graph``); grinding the graph's seed instead — keys it
    made for the first site, until the graph gives the target exactly those neighbours — is
    refused too, since the keys are not the ones that site signed (``roster``)."""
    drawn = session(TWELVE).advertise()
    target, chosen = TWELVE[5], TWELVE[7:11]
    assert set(drawn.graph.neighbours(target)) != set(chosen)
    with pytest.raises(DisclosureError) as refused:
        secagg_site.share(drawn.contexts[target], drawn.share_args(target, chosen))
    assert refused.value.rule == "secagg-graph"

    forger = roster.in_process_pins(TWELVE)[TWELVE[0]]  # a key the coordinator holds
    for _ in range(20_000):
        keys = crypto.public_bytes(crypto.new_private_key()) * 2
        if set(drawn.plan.graph(keys).neighbours(target)) == set(chosen):
            break
    else:
        pytest.fail("no ground seed found")
    ground = drawn.plan.graph(keys)
    for signature in (forger.sign_advert(drawn.plan.advert(TWELVE[0], keys)),
                      drawn.adverts.signatures[TWELVE[0]]):  # fmt: skip
        args = drawn.share_args(target, ground.neighbours(target))
        args["contributor"] = Adverts({TWELVE[0]: keys}, {TWELVE[0]: signature}).to_wire()
        with pytest.raises(DisclosureError, match="not signed") as refused:
            secagg_site.share(drawn.contexts[target], args)
        assert refused.value.rule == "roster"
    wrong_seeder = drawn.share_args(target)
    wrong_seeder["contributor"] = drawn.only([TWELVE[1]]).to_wire()
    with pytest.raises(DisclosureError, match="seeded by the session's first site") as refused:
        secagg_site.share(drawn.contexts[target], wrong_seeder)
    assert refused.value.rule == "secagg-graph"


def test_the_graph_is_drawn_afresh_by_each_sessions_first_site():
    """Four sessions of the same sites in the same order draw four different graphs: the
    seed is the first site's fresh keys, nothing the coordinator sends; a site's graph is
    the same whoever computes it."""
    graphs = set()
    for i in range(4):
        drawn = session(TWELVE, session_id=f"{i:032d}").advertise()
        seeded = drawn.plan.graph(drawn.adverts.keys[TWELVE[0]])
        assert seeded == drawn.graph
        graphs.add(tuple(seeded.neighbours(s) for s in TWELVE))
    assert len(graphs) == 4


def test_a_share_replayed_from_another_session_is_refused():
    """Shares sealed in one session, relayed in the next (same sites, same order): they do
    not open under the new session's keys and bound session id (``secagg-shares``), and the
    site masks nothing. A neighbour's keys replayed from an earlier session are refused too:
    their signature covers that session (``roster``)."""
    first = session(TWELVE, session_id="1" * 32).advertise().share()
    second = session(TWELVE, session_id="2" * 32, sites=first.contexts).advertise().share()
    target = TWELVE[0]
    old_rows = [first.row(v, target) for v in first.graph.neighbours(target)]
    replayed = MaskBlock(second.plan.session, old_rows)
    with pytest.raises(DisclosureError, match="does not open") as refused:
        secagg_site.open_shares(second.contexts[target], replayed, "t")
    assert refused.value.rule == "secagg-shares"
    assert not secagg_site.sessions(second.contexts[target])[second.plan.session].masked
    # a neighbour's keys replayed from the first session: signed for another session
    third = session(TWELVE, session_id="3" * 32, sites=first.contexts).advertise()
    neighbour = third.graph.neighbours(target)[0]
    args = third.share_args(target)
    keys, signatures = dict(third.adverts.keys), dict(third.adverts.signatures)
    keys[neighbour] = first.adverts.keys[neighbour]
    signatures[neighbour] = first.adverts.signatures[neighbour]
    third.adverts = Adverts(keys, signatures)
    args["neighbours"] = third.only(third.graph.neighbours(target)).to_wire()
    with pytest.raises(DisclosureError, match="not signed") as refused:
        secagg_site.share(third.contexts[target], args)
    assert refused.value.rule == "roster"


def test_shares_addressed_to_other_sites_or_missing_are_refused():
    """A site sent the share pair its neighbour sealed for another site, or fewer rows than it
    has neighbours (a masked round whose masks would not cancel): refused, ``secagg-shares``."""
    drawn = session(TWELVE).advertise().share()
    target = TWELVE[2]
    neighbour = drawn.graph.neighbours(target)[0]
    other = next(w for w in drawn.graph.neighbours(neighbour) if w != target)
    block = drawn.block(target)
    misaddressed = MaskBlock(block.session, [drawn.row(neighbour, other), *block.sealed[1:]])
    with pytest.raises(DisclosureError, match="does not open") as refused:
        secagg_site.open_shares(drawn.contexts[target], misaddressed, "t")
    assert refused.value.rule == "secagg-shares"
    short = MaskBlock(block.session, block.sealed[:-1])
    with pytest.raises(DisclosureError, match="every neighbour's shares") as refused:
        secagg_site.open_shares(drawn.contexts[target], short, "t")
    assert refused.value.rule == "secagg-shares"
    secagg_site.open_shares(drawn.contexts[target], block, "t")  # the honest block opens


def masked_twenty(values=None):
    drawn = session(TWENTY, threshold=18).advertise().share()
    return drawn.mask(values=values or {s: float(i) for i, s in enumerate(TWENTY)})


def test_claiming_a_site_dropped_then_asking_for_its_seed_yields_neither_twice():
    """The coordinator tells the target's holders that the target dropped (to collect shares
    of its masking key), then asks them for the seed of the same target as a survivor. Each
    holder signs one survivor set per session and unmasks once: the second set is refused
    (``secagg-survivors``), the second unmasking finds no session, and the seed shares it
    holds stay below ``t_k``."""
    drawn = masked_twenty()
    target = TWENTY[4]
    without = [s for s in TWENTY if s != target]
    drawn.confirm(without, without)
    holders = [h for h in drawn.graph.holders(target) if h != target]
    key_shares = {
        drawn.plan.point(h): drawn.unmask(h, without)[drawn.graph.holders(h).index(target)]
        for h in holders
    }
    rebuilt = shamir.combine(key_shares, drawn.plan.shape.share_threshold)
    assert (
        crypto.public_bytes(crypto.private_from_bytes(rebuilt)) == (drawn.adverts.keys[target][32:])
    )  # the dropped site's key, as the protocol allows
    for h in holders:
        with pytest.raises(MalformedRequestError, match="no open secure-aggregation session"):
            drawn.confirm([h], TWENTY)
    # Split instead: half the target's holders see it survive, half see it drop.
    drawn = masked_twenty()
    half = len(holders) // 2
    drawn.confirm([*holders[:half], target], TWENTY)
    drawn.confirm([s for s in without if s not in holders[:half]], without)
    for h in holders[:half]:
        with pytest.raises(DisclosureError) as refused:
            drawn.confirm([h], without)
        assert refused.value.rule == "secagg-survivors"
    saw_alive = [s for s in TWENTY if s in holders[:half] or s == target]
    with pytest.raises(DisclosureError, match="signatures from survivors") as refused:
        drawn.unmask(holders[0], TWENTY, signers=saw_alive)  # 5 signatures of 18 needed
    assert refused.value.rule == "secagg-survivors"
    forged = drawn.unmask_args(TWENTY)  # 20 signatures, 15 of them over the other set
    with pytest.raises(DisclosureError, match="not signed by") as refused:
        secagg_unmasking.unmask(drawn.contexts[holders[0]], forged)
    assert refused.value.rule == "secagg-survivors"


def test_declaring_all_of_a_targets_neighbours_dropped_is_refused():
    """To strip the target's pairwise masks the coordinator would need its neighbours'
    masking keys, i.e. a survivor set without them: it leaves 12 of 20 sites, below the
    threshold, and no site signs it."""
    drawn = masked_twenty()
    target = TWENTY[9]
    isolated = [s for s in TWENTY if s not in drawn.graph.neighbours(target)]
    for site in isolated:
        with pytest.raises(MalformedRequestError, match="fewer than the threshold 18"):
            drawn.confirm([site], isolated)


def test_the_honest_unmasking_gives_the_survivors_sum_and_no_part_of_it():
    """With two sites dropped after masking, the revealed shares rebuild every survivor's seed
    and the dropped sites' keys, which give exactly the survivors' sum. The survivors' graph
    stays connected: a mask between two survivors is never removable (neither key is
    revealed), so no part of the sum can be unmasked apart from the rest."""
    values = {s: float(i) for i, s in enumerate(TWENTY)}
    drawn = session(TWENTY, threshold=18).advertise().share()
    dropped = [TWENTY[1], TWENTY[11]]
    alive = [s for s in TWENTY if s not in dropped]
    drawn.mask(sites=alive, values=values).confirm(alive, alive)
    revealed = {h: drawn.unmask(h, alive) for h in alive}
    opened = OpenSession(drawn.plan, drawn.graph, dict(drawn.adverts.keys), drawn.sealed)
    total, seeds = unmasked(opened, {s: drawn.masked[s] for s in alive}, revealed)
    assert secagg_ring.decode(total, 32)[0] == pytest.approx(sum(values[s] for s in alive))
    assert set(seeds) == set(alive)
    reached, frontier = {alive[0]}, [alive[0]]
    while frontier:  # the survivors' graph is connected
        site = frontier.pop()
        for other in drawn.graph.neighbours(site):
            if other in alive and other not in reached:
                reached.add(other)
                frontier.append(other)
    assert reached == set(alive)


def test_a_coordinator_splitting_the_survivors_through_the_public_api_unmasks_nothing():
    """End to end over in-process silos: a coordinator that gives each half of the sites a
    different survivor set at the consistency round cannot collect the threshold's signatures
    over either; the session aborts and no share is revealed."""
    from fedstats.contract import codec
    from tests.fedstats.test_secure_aggregation import frames, summaries_args

    base = fedstats.Federation.in_process(frames(20), verified_paths=False)
    names = list(base.sites)

    class Splitting:
        def __init__(self, site, handle):
            self.site, self.handle = site, handle

        def __call__(self, request: bytes) -> bytes:
            message = codec.decode(request)
            if message["task"] == "secagg.confirm" and names.index(self.site) % 2:
                bits = np.unpackbits(message["args"]["survivors"])
                bits[0] = 0  # the odd sites are told the first site dropped
                message["args"]["survivors"] = np.packbits(bits)
                request = codec.encode(message)
            return self.handle(request)

    fed = fedstats.Federation({s: Splitting(s, silo.handle) for s, silo in base.silos.items()})
    fed.silos = base.silos
    with pytest.raises(SecureAggregationAborted) as aborted:
        fedstats.secure_sum(
            fed,
            "logistic.summaries",
            summaries_args(base),
            analysis="split",
            options=fedstats.SecureAggregation(threshold=18),
        )
    assert "unmasking" in str(aborted.value)
    unmasks = fed.inventory.to_frame("split").query("task == 'secagg.unmask'")
    assert set(unmasks["status"]) == {"refused"}
    assert set(unmasks["reason"]) == {"secagg-survivors"}


def test_advert_rows_round_trip_and_reject_padding_tricks():
    row = bytes([3, 1, 2, 3]) + bytes(69)
    assert signature_hex(row) == "010203"
    with pytest.raises(ValueError):
        signature_hex(bytes([3, 1, 2, 3, 9]) + bytes(68))
    with pytest.raises(ValueError):
        signature_hex(bytes([90]) + bytes(72))


SHAPED = st.one_of(
    st.none(),
    st.integers(-3, 300),
    st.text(max_size=6),
    st.lists(st.integers(0, 255), max_size=4),
    st.dictionaries(st.sampled_from(["sites", "keys", "signatures"]), st.none(), max_size=3),
    hnp.arrays(np.float64, hnp.array_shapes(max_dims=2, max_side=4)),
    hnp.arrays(
        np.uint8,
        st.sampled_from([(4, 64), (4, 73), (4, 160), (5, 66), (2,), (1,), (0, 73), (3, 160)]),
    ),
)


@given(
    task=st.sampled_from(["secagg.share", "masked", "secagg.confirm", "secagg.unmask"]),
    path=st.sampled_from(
        [
            "session",
            "contributor",
            "neighbours",
            "neighbours.keys",
            "neighbours.signatures",
            "neighbours.sites",
            "sealed",
            "survivors",
            "signers",
            "signatures",
            "holders",
        ]
    ),
    value=SHAPED,
)
@settings(max_examples=150, deadline=None)
def test_any_malformed_secure_aggregation_field_gets_a_typed_refusal(task, path, value):
    """Whatever a coordinator puts in a field of a SecAgg+ round (random shapes, dtypes,
    bytes), the site answers or refuses with a typed error, never an internal failure."""
    drawn = session(TWELVE[:10]).advertise()
    site = TWELVE[0]
    if task == "secagg.share":
        args = drawn.share_args(site)
    else:
        drawn.share()
        if task == "masked":
            args = {"secagg": drawn.block(site).to_wire()}
        else:
            drawn.mask()
            alive = list(drawn.plan.sites)
            if task == "secagg.confirm":
                args = {"session": drawn.plan.session, "survivors": drawn.plan.bitmap(alive)}
            else:
                drawn.confirm(alive, alive)
                args = drawn.unmask_args(alive)
    head, _, tail = path.partition(".")
    target = args["secagg"] if task == "masked" else args
    if head in target:
        if tail and isinstance(target[head], dict):
            target[head] = {**target[head], tail: value}
        elif not tail:
            target[head] = value
    try:
        if task == "masked":
            block = MaskBlock.from_args(args)
            secagg_site.open_shares(drawn.contexts[site], block, "t")
        else:
            drawn.call(site, task, args)
    except (MalformedRequestError, DisclosureError):
        pass
