"""No identifier value and not the sites' secret in any message of a linkage run.

Every request and reply of ``fedstats.link`` is captured as the bytes the transport carries.
The secret each site derives is captured at the site (the test wraps the key agreement the
handler calls; the coordinator cannot). Checked: the raw bytes of every message hold no
name or birth date (``YYYY-MM-DD`` or clkhash's ``YYYYMMDD``) of either site, and neither
the secret nor its hex; every decoded string is none of those values; the only
arrays as long as a site's table are the encode replies (uint8 CLKs, uint64 tokens) and the
mappings the sites accept (positions and pair ids).
"""

from __future__ import annotations

import numpy as np

import fedstats
from fedstats.contract import codec
from fedstats.contract.tasks import record_linkage as wire
from fedstats.site.handlers import record_linkage as site_handlers
from tests.vertical.linked_population import LINKAGE, federation, two_sites
from tests.vertical.test_vertical_messages import leaves


def test_no_message_of_a_linkage_carries_an_identifier_value_or_the_secret(monkeypatch):
    sites = two_sites(both=60, registry_only=30, hospital_only=20, seed=31)
    fed = federation(sites)
    secrets = []
    agreed = site_handlers.crypto.agreed_key

    def recorded(*args):
        secrets.append(agreed(*args))
        return secrets[-1]

    monkeypatch.setattr(site_handlers.crypto, "agreed_key", recorded)
    captured = []
    for site in fed.sites:
        carry = fed._transports[site]

        def tapped(request, carry=carry, site=site):
            reply = carry(request)
            captured.append((site, request, reply))
            return reply

        fed._transports[site] = tapped
    result = fedstats.link(fed, first="registry", second="hospital", linkage_id="L", schema=LINKAGE)
    assert result.pairs >= 50
    assert len(secrets) == 2 and secrets[0] == secrets[1]  # both sites, one secret
    values = set()
    for table in (sites.registry, sites.hospital):
        for column in ("given_name", "family_name", "postal_code", "birth_date"):
            values |= set(table[column]) - {""}
        values |= {d.replace("-", "") for d in table["birth_date"] if d}
    # 5 characters or more: a shorter value (a 4-digit postal code) could occur by chance
    # in some 30 kB of random CLK bytes; every value is also checked as a decoded string
    needles = [v.encode() for v in values if len(v) >= 5]
    needles += [s for s in secrets] + [s.hex().encode() for s in secrets]
    sizes = {"registry": 90, "hospital": 80}
    tasks = []
    for site, request, reply in captured:
        for raw in (request, reply):
            found = [n for n in needles if n in raw]
            assert not found, f"{site}: a message holds {found[:3]}"
        decoded_request, decoded_reply = codec.decode(request), codec.decode(reply)
        task = decoded_request["task"]
        tasks.append(task)
        assert decoded_reply["status"] == "ok", decoded_reply
        for path, leaf in [*leaves(decoded_request, "request"), *leaves(decoded_reply, "reply")]:
            if isinstance(leaf, str):
                assert leaf not in values, f"{task} {path}"
            if isinstance(leaf, np.ndarray) and leaf.ndim and leaf.shape[0] > 32:
                allowed = {
                    (wire.ENCODE, "reply.result.clks"): (sizes[site], 128),
                    (wire.ENCODE, "reply.result.tokens"): (sizes[site], 3),
                    (wire.ACCEPT, "request.args.positions"): (result.pairs,),
                    (wire.ACCEPT, "request.args.pair_ids"): (result.pairs,),
                }
                assert allowed.get((task, path)) == leaf.shape, f"{task} {path} {leaf.shape}"
    assert tasks == [wire.ADVERTISE] * 2 + [wire.ENCODE] * 2 + [wire.ACCEPT] * 2
