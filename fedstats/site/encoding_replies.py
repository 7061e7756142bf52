"""The second exception to the parameter-size rule: a site's record-linkage encodings.

Every reply's size follows from the number of parameters (:mod:`fedstats.site.disclosure`),
except a registry's Paillier ciphertexts (:mod:`fedstats.site.ciphertext_replies`) and the
reply of ``linkage.encode``: one keyed Bloom-filter encoding (CLK) and one row of keyed
blocking tokens per record of the site's identifier table
(:class:`fedstats.schema.RecordCodes`). The exception is narrow, and checked here, where
every reply is checked (:func:`fedstats.site.disclosure.check_reply`):

* only :data:`ENCODING_TASKS` may declare such a field, and only a site holding an
  identifier table and linkage schema (:mod:`fedstats.site.identifiers`);
* exactly two such fields: ``clks``, ``uint8`` of exactly the site's own schema's byte
  length, and ``tokens``, ``uint64`` of exactly its schema's blocking-key count;
* one row per record of the site's identifier table, no more and no fewer.

So no other value and no other width can leave in these fields, whatever a handler or a
request puts there; what the encodings themselves reveal to the linkage unit is
:mod:`linkage.schema`'s to say (frequency and pattern-mining attacks).
"""

from __future__ import annotations

from typing import Any

from fedstats.contract.tasks.record_linkage import ENCODE
from fedstats.errors import DisclosureError
from fedstats.schema import RecordCodes, ReplySchema

ENCODING_TASKS = frozenset({ENCODE})
"""The tasks whose reply may hold :class:`~fedstats.schema.RecordCodes` fields."""


def check_record_codes(schema: ReplySchema, identifiers: Any, *, site: str, task: str) -> None:
    """Refuse a reply whose :class:`~fedstats.schema.RecordCodes` fields break the rules of
    the module docstring (rule ``shape``). ``identifiers``: the site's
    :class:`~fedstats.site.identifiers.SiteIdentifiers` (``None`` when it links nothing).
    Call after the payload matched ``schema``, so the fields hold what it declares."""
    fields = {name: f for name, f in schema.items() if isinstance(f, RecordCodes)}
    if not fields:
        return
    if task not in ENCODING_TASKS or identifiers is None:
        raise _refused(site, task, "only a site's record-linkage encodings may be record codes")
    expected = {
        "clks": RecordCodes(identifiers.records, identifiers.schema.length_bytes, "uint8"),
        "tokens": RecordCodes(identifiers.records, identifiers.token_keys, "uint64"),
    }
    if fields != expected:
        raise _refused(
            site,
            task,
            "record codes are the site's CLKs (uint8, its schema's byte length) and blocking "
            "tokens (uint64, its schema's key count), one row per record of its identifier table",
        )


def _refused(site: str, task: str, reason: str) -> DisclosureError:
    return DisclosureError(site=site, task=task, reason=reason, rule="shape")
