"""The linkage unit's matching of two parties' encodings: blocks, Dice candidates, one-to-one.

For encodings a (first party) and b (second party) under the same schema:

1. Blocking (:class:`linkage.schema.Blocking`): anonlink's ``bit_blocking`` on the CLKs
   (``"bits"``), the parties' keyed blocking tokens (``"keys"``), or none. Both work on
   what the linkage unit holds anyway; no clear-text identifier is needed.
2. Candidates: ``anonlink.candidate_generation.find_candidate_pairs`` with the Dice
   coefficient ``D(a, b) = 2 |a AND b| / (|a| + |b|)`` (popcount-accelerated,
   ``anonlink.similarities.dice_coefficient_accelerated``), keeping pairs in a common
   block with ``D >= threshold``.
3. One-to-one: ``anonlink.solving.greedy_solve`` takes candidates in decreasing
   similarity and links two records when neither is linked yet.

The linked pairs get pair ids 0..m-1 in a random order (OS entropy unless a seed is
given), so that neither party learns the other's record order from them. Each party
receives only :class:`PartyLinks`: its own record positions, their pair ids and scores.
A registry linked to several hospitals is one :func:`link` per hospital; each linkage
has its own pair ids.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass

import numpy as np
from bitarray import bitarray

from linkage._anonlink import blocking, candidate_generation, similarities, solving
from linkage.encoding import Encodings
from linkage.errors import EncodingMismatch
from linkage.schema import Blocking, LinkageSchema


@dataclass(frozen=True, eq=False)
class PartyLinks:
    """What one party learns of a linkage: which of its records are linked, under which id.

    Attributes
    ----------
    positions
        ``int64``, ascending: positions of the party's linked records in its identifier table.
    pair_ids
        ``int64``: the pair id of each of those records (same order).
    scores
        ``float64``: the Dice similarity of each linked pair (same order), for quality.
    """

    positions: np.ndarray
    pair_ids: np.ndarray
    scores: np.ndarray

    def __len__(self) -> int:
        return int(self.positions.size)


@dataclass(frozen=True, eq=False)
class Linkage:
    """A two-party linkage: each party's view, and how many candidate pairs were scored.

    ``unblocked`` counts, per party, the records that share no block with any record
    (keyed blocking: every blocking value missing); they were never compared.
    """

    first: PartyLinks
    second: PartyLinks
    candidates: int
    unblocked: tuple[int, int] = (0, 0)

    def pairs(self) -> set[tuple[int, int]]:
        """The linked (first position, second position) pairs — the linkage unit's view."""
        by_id = dict(
            zip(self.second.pair_ids.tolist(), self.second.positions.tolist(), strict=True)
        )
        return {
            (a, by_id[p])
            for a, p in zip(
                self.first.positions.tolist(), self.first.pair_ids.tolist(), strict=True
            )
        }


def link(
    first: Encodings,
    second: Encodings,
    schema: LinkageSchema,
    *,
    seed: int | None = None,
    candidates_per_record: int = 10,
) -> Linkage:
    """Link two parties' encodings one-to-one at the schema's threshold.

    Parameters
    ----------
    first, second
        The two parties' encodings (e.g. the registry's and one hospital's).
    schema
        The schema both were made under (its fingerprint is checked).
    seed
        Seeds the order of pair ids; None (production) draws it from the OS.
    candidates_per_record
        anonlink's ``k``: at most this many best candidates per record and block, and
        per record overall, are kept for the solve (it bounds memory; the one-to-one
        solve uses a record's best candidates first).

    Returns
    -------
    Linkage

    Raises
    ------
    EncodingMismatch
        The encodings were made under another schema, or lack the blocking tokens
        the schema's blocking needs.
    """
    fingerprint = schema.fingerprint()
    for name, party in (("first", first), ("second", second)):
        _check(name, party, schema, fingerprint)
    if candidates_per_record < 1:
        raise ValueError(f"candidates_per_record must be at least 1, got {candidates_per_record}")
    candidates = candidate_pairs(first, second, schema, k=candidates_per_record)
    groups = solving.greedy_solve(candidates)
    pairs = sorted(solving.pairs_from_groups(groups))
    sims, _, (rec0, rec1) = candidates
    score_of = {}
    for sim, i, j in zip(sims, rec0, rec1, strict=True):
        score_of.setdefault((i, j), sim)
    count = len(pairs)
    pair_ids = np.random.default_rng(seed).permutation(count).astype(np.int64)
    positions_a = np.fromiter((i for i, _ in pairs), dtype=np.int64, count=count)
    positions_b = np.fromiter((j for _, j in pairs), dtype=np.int64, count=count)
    scores = np.fromiter((score_of[p] for p in pairs), dtype=np.float64, count=count)
    order_b = np.argsort(positions_b, kind="stable")
    return Linkage(
        first=PartyLinks(positions_a, pair_ids, scores),
        second=PartyLinks(positions_b[order_b], pair_ids[order_b], scores[order_b]),
        candidates=len(sims),
        unblocked=(_unblocked(first, schema), _unblocked(second, schema)),
    )


def _unblocked(party: Encodings, schema: LinkageSchema) -> int:
    if schema.blocking.method != "keys" or party.blocking_tokens is None:
        return 0
    return int((~party.blocking_tokens.any(axis=1)).sum())


def candidate_pairs(
    first: Encodings, second: Encodings, schema: LinkageSchema, *, k: int | None = None
) -> tuple:
    """anonlink's candidate pairs (similarity, dataset indices, record indices), best first.

    Every pair of records that shares a block and whose Dice similarity is at least the
    schema's threshold; with ``k``, at most the k best per record (anonlink's ``k``).
    """
    datasets = [first.bitarrays(), second.bitarrays()]
    return candidate_generation.find_candidate_pairs(
        datasets,
        similarities.dice_coefficient_accelerated,
        schema.threshold,
        k=k,
        blocking_f=blocking_function(schema.blocking, first, second),
    )


def blocking_function(
    plan: Blocking, first: Encodings, second: Encodings
) -> Callable[[int, int, bitarray], Iterable[Hashable]] | None:
    """The anonlink blocking function of a blocking plan (None: no blocking).

    ``"bits"``: ``anonlink.blocking.bit_blocking(tables, bits, seed)``: a record's block
    in table t is its bits at ``bits`` positions drawn for t. ``"keys"``: a record's
    blocks are ``(key index, token)`` for each of its non-missing tokens, so two records
    share a block iff they have an equal token of the same key.
    """
    if plan.method == "none":
        return None
    if plan.method == "bits":
        return blocking.bit_blocking(plan.tables, plan.bits, seed=plan.seed)
    tokens = (first.blocking_tokens, second.blocking_tokens)

    def keyed_blocks(dataset: int, record: int, _clk: bitarray) -> Iterable[Hashable]:
        row = tokens[dataset][record]
        return [(k, int(t)) for k, t in enumerate(row.tolist()) if t]

    return keyed_blocks


def _check(name: str, party: Encodings, schema: LinkageSchema, fingerprint: str) -> None:
    if party.fingerprint != fingerprint:
        raise EncodingMismatch(
            f"the {name} party's encodings were made under schema {party.fingerprint[:12]}, "
            f"not the study's {fingerprint[:12]}; re-encode with the study's [linkage] table"
        )
    if party.clks.ndim != 2 or party.clks.shape[1] != schema.length_bytes:
        raise EncodingMismatch(
            f"the {name} party's encodings are not {schema.length_bytes} bytes per record"
        )
    if schema.blocking.method == "keys":
        tokens = party.blocking_tokens
        if tokens is None or tokens.shape != (len(party), len(schema.blocking.keys)):
            raise EncodingMismatch(
                f"the {name} party sent no blocking tokens for its {len(party)} records; "
                "the schema blocks on keys: encode with it"
            )
