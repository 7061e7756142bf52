"""The ledger's hash chain: tamper evidence for each scope's entries.

Each scope starts from a genesis hash derived from its identity; each entry's
hash is ``sha256(previous hash || "\\n" || canonical JSON of the entry's
content)`` (a hash chain in the manner of Haber & Stornetta, J. Cryptology
1991). Editing, deleting or reordering an entry breaks the chain from that
entry on; the scope row keeps the head, which a report can print so that a
reader can later check the ledger was not rewritten wholesale.
"""

from __future__ import annotations

import hashlib
import json

from accounting.scope import Scope


def canonical_json(value: object) -> str:
    """Sorted keys, no whitespace, exact (``repr``) floats, no NaN or infinity."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=False)


def _scope_identity(scope: Scope) -> dict[str, str]:
    return {
        "unit": scope.unit,
        "owner": scope.owner,
        "study": scope.study,
        "neighbouring": scope.neighbouring,
    }


def genesis_hash(scope: Scope) -> str:
    """The chain's starting hash for ``scope``."""
    text = "fedstats-ledger-genesis\n" + canonical_json(_scope_identity(scope))
    return hashlib.sha256(text.encode()).hexdigest()


def entry_content(
    *,
    scope: Scope,
    seq: int,
    event_json: str,
    epsilon: float,
    delta: float,
    epsilon_after: float,
    note: str | None,
    analysis: str | None,
    task: str | None,
    parameters_json: str,
    created_at: str,
    package_version: str,
) -> str:
    """Canonical text of everything an entry records (its hash input with the previous hash)."""
    return canonical_json(
        {
            "scope": _scope_identity(scope),
            "seq": seq,
            "event": event_json,
            "epsilon": epsilon,
            "delta": delta,
            "epsilon_after": epsilon_after,
            "note": note,
            "analysis": analysis,
            "task": task,
            "parameters": parameters_json,
            "created_at": created_at,
            "package_version": package_version,
        }
    )


def chain_hash(prev_hash: str, content: str) -> str:
    """``sha256(prev_hash || "\\n" || content)`` as hex."""
    return hashlib.sha256(f"{prev_hash}\n{content}".encode()).hexdigest()
