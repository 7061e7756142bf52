"""The wire of ``harmonize.fingerprint``: the served frame's schema and the site's protocol."""

from __future__ import annotations

from typing import Any

from fedstats.contract.task_spec import TaskSpec
from fedstats.schema import Text

MAX_CHARS = 50_000
"""Largest fingerprint a site may send (about 500 columns with their levels)."""


def fingerprint_schema(args: dict[str, Any]) -> dict:
    return {
        "fingerprint": Text(max_chars=MAX_CHARS),
        "protocol_sha256": Text(max_chars=64),
        "paths": Text(max_chars=8),
    }


TASK = "harmonize.fingerprint"
FINGERPRINT = TaskSpec(
    name=TASK,
    schema=fingerprint_schema,
    description="schema of the served frame: columns, kinds, levels, units, study digest",
    about_patients=False,
)
