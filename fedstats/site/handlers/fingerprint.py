"""Site side of the fingerprint check: the schema of the frame this site serves.

A remote coordinator cannot read ``frame.attrs``; it asks each site for its
fingerprint (:mod:`harmonize.fingerprint`) and refuses to combine sites whose
fingerprints differ before any analysis task runs
(:meth:`fedstats.Federation.verify_fingerprints`). The site recomputes the
fingerprint from the frame it actually serves, with the study digest and
units its harmonisation recorded, so a frame edited after harmonisation shows
as different. A fingerprint lists column names, kinds, declared levels and
units: nothing about patients, so the reply is not subject to the disclosure
threshold. The reply also names the protocol the site approved (its SHA-256) and
whether the site verifies paths.
Its size depends on the specification, never on the number of
patients.
"""

from __future__ import annotations

import json
from typing import Any

from fedstats.site.task import SiteContext, TaskReply
from harmonize.fingerprint import FINGERPRINT_ATTR, SiteFingerprint, fingerprint_frame


def fingerprint(ctx: SiteContext, args: dict[str, Any]) -> TaskReply:
    """The fingerprint of the served frame as JSON, or ``""`` if it was not harmonised,
    the SHA-256 of the protocol the site approved (``""`` when it has none), which the
    coordinator records for the compliance report, and ``paths``: ``"verified"`` when the
    site answers exact iterative fits only on verified paths (the coordinator then relays
    each round's signed replies, :mod:`fedstats.site.verified_paths`), else ``""``."""
    protocol = "" if ctx.protocol is None else ctx.protocol.digest
    paths = "verified" if ctx.verified_paths else ""
    recorded = ctx.frame.attrs.get(FINGERPRINT_ATTR)
    if recorded is None:
        return TaskReply(
            {"fingerprint": "", "protocol_sha256": protocol, "paths": paths}, contributors=None
        )
    declared = SiteFingerprint.from_record(recorded)
    units = {c.name: c.unit for c in declared.columns if c.unit and c.name in ctx.frame.columns}
    served = fingerprint_frame(ctx.frame, units=units, spec_digest=declared.spec_digest)
    return TaskReply(
        {
            "fingerprint": json.dumps(served.as_record()),
            "protocol_sha256": protocol,
            "paths": paths,
        },
        contributors=None,
    )
