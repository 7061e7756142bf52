"""Attacks of a malicious linkage unit (the coordinator) on the linkage wire, each refused.

The coordinator relays the adverts, so it may try: an advert of its own making (unsigned,
signed with a key of its own, a site's own advert reflected back to it as the other's,
an advert of another linkage replayed), to hold the secret and read the encodings by a
dictionary attack; a second encoding of the same linkage, or an encoding under another
schema; a declared shape other than the site's own; and, at acceptance, a mapping with
repeated positions or pair ids, positions out of range, fewer than k pairs, or one patient
away from a linkage the site accepted (differencing). The reply check refuses record codes
in any other task, or of another width or count.
"""

from __future__ import annotations

import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric import ed25519

import fedstats
from fedstats.contract.tasks import record_linkage as wire
from fedstats.errors import DisclosureError, MalformedRequestError
from fedstats.schema import Number, RecordCodes
from fedstats.secagg import crypto
from fedstats.secagg.roster import sign
from fedstats.site.encoding_replies import check_record_codes
from linkage import Encodings, link, parse_linkage_table
from tests.vertical.linked_population import LINKAGE, accepted_pairs, federation, two_sites

SCHEMA = parse_linkage_table(LINKAGE)
FINGERPRINT = SCHEMA.fingerprint()
SITES = ["registry", "hospital"]


@pytest.fixture(scope="module")
def population():
    return two_sites(both=60, registry_only=20, hospital_only=10, seed=11, max_errors=0)


@pytest.fixture
def fed(population):
    return federation(population)


def ask(fed, site, task, args, linkage_id="L"):
    base = {"study": fed.study, "linkage": linkage_id, "sites": SITES, "fingerprint": FINGERPRINT}
    return fed.request(task, {**base, **args}, analysis="attack", sites=[site])[site]


def refused(call, rule=None, error=DisclosureError):
    with pytest.raises(error) as caught:
        call()
    if rule is not None:
        assert caught.value.rule == rule, caught.value
    return caught.value


def encode_args(fed, site, peer_advert, records):
    peer = {"public_key": peer_advert["public_key"].astype(np.uint8),
            "signature": peer_advert["signature"]}  # fmt: skip
    return {"records": records, "clk_bytes": SCHEMA.length_bytes, "token_keys": 3, "peer": peer}


def forged(fed, key: bytes, signature: str) -> dict:
    return {"public_key": np.frombuffer(key, dtype=np.uint8).copy(), "signature": signature}


# ------------------------------------------------------------------ adverts


def test_an_advert_the_coordinator_made_is_refused(fed):
    """The coordinator's own X25519 key, relayed as the hospital's: unsigned, signed with a
    key of its own, or signed by the registry itself (its own advert reflected back)."""
    ask(fed, "registry", wire.ADVERTISE, {})
    own = ask(fed, "hospital", wire.ADVERTISE, {})
    mine = crypto.public_bytes(crypto.new_private_key())  # the coordinator would hold the secret
    statement = wire.advert_statement(fed.study, "L", SITES, FINGERPRINT, "hospital", mine)
    attempts = {
        "unsigned": forged(fed, mine, ""),
        "coordinator's key": forged(fed, mine, sign(ed25519.Ed25519PrivateKey.generate(),
                                                    statement)),
        "reflected": ask(fed, "registry", wire.ADVERTISE, {}),
        "signature of another key": forged(fed, mine, own["signature"]),
    }  # fmt: skip
    for name, advert in attempts.items():
        error = refused(
            lambda a=advert: ask(fed, "registry", wire.ENCODE, encode_args(fed, "r", a, 80)),
            "roster",
        )
        assert "not signed by the key this site pinned" in str(error), name
    # none of them spent the encoding: the real advert is still answered
    reply = ask(fed, "registry", wire.ENCODE, encode_args(fed, "registry", own, 80))
    assert reply["clks"].shape == (80, SCHEMA.length_bytes)


def test_an_advert_of_another_linkage_or_schema_is_refused(fed):
    """The hospital's genuine advert for linkage L0, replayed into linkage L."""
    other = ask(fed, "hospital", wire.ADVERTISE, {}, linkage_id="L0")
    ask(fed, "registry", wire.ADVERTISE, {})
    refused(lambda: ask(fed, "registry", wire.ENCODE, encode_args(fed, "r", other, 80)), "roster")


def test_a_site_encodes_a_linkage_once(fed):
    ask(fed, "registry", wire.ADVERTISE, {})
    peer = ask(fed, "hospital", wire.ADVERTISE, {})
    ask(fed, "registry", wire.ENCODE, encode_args(fed, "registry", peer, 80))
    error = refused(
        lambda: ask(fed, "registry", wire.ENCODE, encode_args(fed, "registry", peer, 80)),
        "linkage",
    )
    assert "encoded once" in str(error)
    # a fresh advert under the same id gives the same key: no second secret
    again = ask(fed, "registry", wire.ADVERTISE, {})
    assert again["signature"] == ask(fed, "registry", wire.ADVERTISE, {})["signature"]
    refused(lambda: ask(fed, "registry", wire.ENCODE, encode_args(fed, "registry", peer, 80)),
            "linkage")  # fmt: skip
    # nor can the id be taken for other sites or another schema
    refused(lambda: ask(fed, "registry", wire.ADVERTISE, {"sites": SITES[::-1]}), "linkage")


def test_another_schema_fingerprint_is_refused(fed):
    other = parse_linkage_table({**LINKAGE, "threshold": 0.5}).fingerprint()
    error = refused(lambda: ask(fed, "registry", wire.ADVERTISE, {"fingerprint": other}), "linkage")
    assert "not this site's own" in str(error)
    ask(fed, "registry", wire.ADVERTISE, {})
    peer = ask(fed, "hospital", wire.ADVERTISE, {})
    refused(lambda: ask(fed, "registry", wire.ENCODE,
                        {**encode_args(fed, "registry", peer, 80), "fingerprint": other}),
            "linkage")  # fmt: skip


def test_a_declared_shape_other_than_the_sites_own_is_refused(fed):
    ask(fed, "registry", wire.ADVERTISE, {})
    peer = ask(fed, "hospital", wire.ADVERTISE, {})
    args = encode_args(fed, "registry", peer, 80)
    for change in ({"records": 79}, {"records": 81}, {"clk_bytes": 64}, {"token_keys": 0}):
        refused(lambda c=change: ask(fed, "registry", wire.ENCODE, {**args, **c}),
                error=MalformedRequestError)  # fmt: skip
    assert ask(fed, "registry", wire.ENCODE, args)["tokens"].shape == (80, 3)


def test_a_site_outside_the_roster_or_a_table_under_k_is_refused(population):
    fed = federation(population)
    refused(lambda: ask(fed, "registry", wire.ADVERTISE, {"sites": ["registry", "mallory"]}),
            "roster")  # fmt: skip
    small = federation(population, disclosure=fedstats.DisclosurePolicy(min_count=100))
    refused(lambda: ask(small, "registry", wire.ADVERTISE, {}), "threshold")


# ------------------------------------------------------------------ mappings


def linked(fed, linkage_id="L1"):
    return fedstats.link(fed, first="registry", second="hospital", linkage_id=linkage_id,
                         schema=LINKAGE, seed=0)  # fmt: skip


def encoded(fed, linkage_id):
    """Advertise and encode at the registry by hand; its number of records."""
    ask(fed, "registry", wire.ADVERTISE, {}, linkage_id)
    peer = ask(fed, "hospital", wire.ADVERTISE, {}, linkage_id)
    ask(fed, "registry", wire.ENCODE, encode_args(fed, "registry", peer, 80), linkage_id)
    return 80


def accept(fed, positions, pair_ids, linkage_id="L"):
    mapping = {"linkage": linkage_id, "positions": np.asarray(positions, dtype=np.int64),
               "pair_ids": np.asarray(pair_ids, dtype=np.int64)}  # fmt: skip
    return fed.request(wire.ACCEPT, mapping, analysis="attack", sites=["registry"])["registry"]


def test_malformed_mappings_are_refused(fed):
    refused(lambda: accept(fed, range(20), range(20)), "linkage")  # nothing encoded yet
    n = encoded(fed, "L")
    twelve = np.arange(12)
    for positions, pair_ids, why in (
        ([*range(11), 3], twelve, "mapped twice"),
        (twelve, [*range(11), 3], "two records"),
        ([*range(11), n], twelve, "outside"),
        ([*range(11), -1], twelve, "outside"),
    ):
        error = refused(lambda p=positions, q=pair_ids: accept(fed, p, q),
                        error=MalformedRequestError)  # fmt: skip
        assert why in str(error)
    refused(lambda: accept(fed, range(9), range(9)), "threshold")  # fewer than k = 10
    assert accept(fed, range(10, 30), range(20))["pairs"] == 20


def test_a_linkage_one_patient_away_from_an_accepted_one_is_refused(fed, population):
    """Link L1 in full; then, in a second linkage L2 of the same sites, send the registry
    L2's own mapping less one pair: it differs from L1 by one patient (differencing)."""
    first = linked(fed, "L1")
    assert accepted_pairs(fed, "L1", "registry", "hospital") == population.truth
    adverts = {s: ask(fed, s, wire.ADVERTISE, {}, "L2") for s in SITES}
    replies = {
        s: ask(fed, s, wire.ENCODE, encode_args(fed, s, adverts[o], first.records[s]), "L2")
        for s, o in (("registry", "hospital"), ("hospital", "registry"))
    }
    matched = link(
        *(Encodings(replies[s]["clks"], FINGERPRINT, replies[s]["tokens"]) for s in SITES),
        SCHEMA,
    )
    positions, pair_ids = matched.first.positions, matched.first.pair_ids
    assert len(positions) == first.pairs
    error = refused(lambda: accept(fed, positions[1:], pair_ids[1:], "L2"), "differencing")
    assert error.task == wire.ACCEPT
    # the whole of L2 (the same patients as L1) is accepted
    assert accept(fed, positions, pair_ids, "L2")["pairs"] == first.pairs


# ------------------------------------------------------------------ the reply check


def test_record_codes_leave_only_as_the_sites_own_encodings(fed):
    """The reply check refuses record codes in another task, at a site without identifiers,
    of another width, dtype or count; it passes exactly the site's own shape."""
    identifiers = fed.silos["registry"]._context.identifiers
    own = {"clks": RecordCodes(80, SCHEMA.length_bytes, "uint8"),
           "tokens": RecordCodes(80, 3, "uint64")}  # fmt: skip
    check = lambda schema, task=wire.ENCODE, ids=identifiers: check_record_codes(  # noqa: E731
        schema, ids, site="registry", task=task)  # fmt: skip
    check(own)
    check({"pairs": Number()}, task="prepare")  # no record codes: nothing to check
    refused(lambda: check(own, task="prepare"), "shape")
    refused(lambda: check(own, ids=None), "shape")
    for name, field in (
        ("clks", RecordCodes(80, SCHEMA.length_bytes * 2, "uint8")),
        ("clks", RecordCodes(80, SCHEMA.length_bytes // 8, "uint64")),
        ("clks", RecordCodes(81, SCHEMA.length_bytes, "uint8")),
        ("tokens", RecordCodes(80, 4, "uint64")),
        ("names", RecordCodes(80, 16, "uint8")),
    ):
        refused(lambda n=name, f=field: check({**own, n: f}), "shape")
