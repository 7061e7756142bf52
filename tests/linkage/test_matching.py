"""Matching against an oracle written here: brute-force Dice on bitarrays, greedy one-to-one."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

import linkage
from linkage import EncodingMismatch, synthetic
from linkage.matching import candidate_pairs

SECRET = bytes(range(100, 132))
FIELDS = [
    {"name": "given_name", "ngram": 2, "bits": 200},
    {"name": "family_name", "ngram": 2, "bits": 200},
    {"name": "birth_date", "ngram": 1, "bits": 300, "positional": True},
    {"name": "sex", "ngram": 1, "bits": 30, "positional": True},
    {"name": "postal_code", "ngram": 1, "bits": 150, "positional": True},
]
NO_LIMIT = 10**9


def schema_with(blocking, threshold=0.6):
    table = {"fields": FIELDS, "length": 512, "threshold": threshold, "blocking": blocking}
    return linkage.parse_linkage_table(table)


def tables(seed: int, n: int = 120, strangers: int = 40):
    """n people in both tables (the second corrupted and shuffled), plus strangers in each."""
    first, second, truth = synthetic.linked_tables(n, seed=seed)
    rng = np.random.default_rng(seed + 1000)
    first = pd.concat([first, synthetic.people(strangers, rng)], ignore_index=True)
    second = pd.concat([second, synthetic.people(strangers, rng)], ignore_index=True)
    return first, second, truth


def dice(a, b) -> float:
    """D(a, b) = 2 |a & b| / (|a| + |b|), 0 when both are empty."""
    total = a.count() + b.count()
    return 2 * (a & b).count() / total if total else 0.0


def shares_block(schema, enc_a, enc_b, i, j) -> bool:
    if schema.blocking.method == "none":
        return True
    ta, tb = enc_a.blocking_tokens[i], enc_b.blocking_tokens[j]
    return bool(np.any((ta == tb) & (ta != 0)))


def oracle(schema, enc_a, enc_b) -> set[tuple[int, int]]:
    """All pairs sharing a block with Dice >= threshold, best first (ties: lower positions),
    each linked when neither record is linked yet."""
    bits_a, bits_b = enc_a.bitarrays(), enc_b.bitarrays()
    scored = []
    for i, a in enumerate(bits_a):
        for j, b in enumerate(bits_b):
            if shares_block(schema, enc_a, enc_b, i, j):
                similarity = dice(a, b)
                if similarity >= schema.threshold:
                    scored.append((-similarity, i, j))
    used_a, used_b, pairs = set(), set(), set()
    for _, i, j in sorted(scored):
        if i not in used_a and j not in used_b:
            used_a.add(i)
            used_b.add(j)
            pairs.add((i, j))
    return pairs


@pytest.mark.parametrize("blocking", ["none", "keys"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_link_equals_the_brute_force_oracle(blocking, seed):
    schema = schema_with(blocking)
    first, second, _ = tables(seed)
    enc_a = linkage.encode(first, schema, SECRET)
    enc_b = linkage.encode(second, schema, SECRET)
    result = linkage.link(enc_a, enc_b, schema, seed=seed, candidates_per_record=NO_LIMIT)
    expected = oracle(schema, enc_a, enc_b)
    assert result.pairs() == expected
    assert len(expected) >= 100  # most of the 120 shared people, not a vacuous comparison
    bits_a, bits_b = enc_a.bitarrays(), enc_b.bitarrays()
    for pair_id, i, score in zip(
        result.first.pair_ids, result.first.positions, result.first.scores, strict=True
    ):
        j = result.second.positions[result.second.pair_ids == pair_id][0]
        assert score == pytest.approx(dice(bits_a[i], bits_b[j]), abs=1e-12)


def test_the_default_candidate_limit_does_not_change_these_linkages():
    schema = schema_with("keys")
    first, second, _ = tables(5)
    enc = [linkage.encode(t, schema, SECRET) for t in (first, second)]
    limited = linkage.link(*enc, schema, seed=0)
    unlimited = linkage.link(*enc, schema, seed=0, candidates_per_record=NO_LIMIT)
    assert limited.pairs() == unlimited.pairs()


@pytest.mark.parametrize("seed", [3, 4])
def test_key_blocking_never_loses_a_pair_that_shares_a_key(seed):
    """Every pair with Dice >= threshold whose clear-text birth year, postal code prefix or
    family name prefix agree is a candidate; pairs sharing none are not compared."""
    schema = schema_with("keys", threshold=0.5)
    first, second, truth = tables(seed, n=200, strangers=0)
    enc_a, enc_b = (linkage.encode(t, schema, SECRET) for t in (first, second))
    sims, _, (rec_a, rec_b) = candidate_pairs(enc_a, enc_b, schema)
    found = set(zip(rec_a, rec_b, strict=True))
    bits_a, bits_b = enc_a.bitarrays(), enc_b.bitarrays()

    def clear_keys(row):
        keys = [
            ("birth_date", row.birth_date[:4]),
            ("postal_code", row.postal_code[:3]),
            ("family_name", row.family_name[:2]),
        ]
        return {k for k in keys if k[1]}

    keys_a = [clear_keys(r) for r in first.itertuples()]
    keys_b = [clear_keys(r) for r in second.itertuples()]
    sharing = [(i, j) for i, j in truth if keys_a[i] & keys_b[j]]
    assert len(sharing) > 190
    for i, j in sharing:
        if dice(bits_a[i], bits_b[j]) >= schema.threshold:
            assert (i, j) in found
    for i, j in found:
        assert keys_a[i] & keys_b[j]
    assert min(sims) >= schema.threshold


def test_bit_blocking_compares_only_pairs_without_blocking_would_and_keeps_identical_ones():
    schema = schema_with({"method": "bits", "tables": 8, "bits": 12, "seed": 7})
    unblocked = schema_with("none")
    first, _, _ = tables(6, n=80, strangers=0)
    second = pd.concat([first.iloc[:40], synthetic.people(40, np.random.default_rng(6))])
    second = second.reset_index(drop=True)
    enc = [linkage.encode(t, schema, SECRET) for t in (first, second)]
    enc_free = [linkage.encode(t, unblocked, SECRET) for t in (first, second)]
    _, _, blocked_pairs = candidate_pairs(*enc, schema)
    _, _, free_pairs = candidate_pairs(*enc_free, unblocked)
    blocked = set(zip(*blocked_pairs, strict=True))
    assert blocked <= set(zip(*free_pairs, strict=True))
    assert {(i, i) for i in range(40)} <= blocked  # identical encodings share every block


def test_each_party_sees_its_positions_and_shuffled_pair_ids_only():
    schema = schema_with("keys")
    first, second, _ = tables(7)
    enc = [linkage.encode(t, schema, SECRET) for t in (first, second)]
    result = linkage.link(*enc, schema, seed=11)
    for party, size in ((result.first, len(first)), (result.second, len(second))):
        assert np.all(np.diff(party.positions) > 0) and party.positions.max() < size
        assert sorted(party.pair_ids.tolist()) == list(range(len(party)))
        assert party.pair_ids.dtype == np.int64 and party.positions.dtype == np.int64
    by_id_a = dict(zip(result.first.pair_ids.tolist(), result.first.scores.tolist(), strict=True))
    by_id_b = dict(zip(result.second.pair_ids.tolist(), result.second.scores.tolist(), strict=True))
    assert by_id_a == by_id_b
    # pair ids do not follow the first party's record order
    assert result.first.pair_ids.tolist() != list(range(len(result.first)))
    other = linkage.link(*enc, schema, seed=12)
    assert other.pairs() == result.pairs()
    assert other.first.pair_ids.tolist() != result.first.pair_ids.tolist()


def test_a_registry_linked_to_two_hospitals_is_one_call_per_hospital():
    schema = schema_with("keys")
    registry, hospital_1, _ = tables(8, n=100, strangers=20)
    hospital_2 = pd.concat([registry.iloc[50:], synthetic.people(30, np.random.default_rng(9))])
    enc_r = linkage.encode(registry, schema, SECRET)
    for hospital in (hospital_1, hospital_2.reset_index(drop=True)):
        enc_h = linkage.encode(hospital, schema, SECRET)
        result = linkage.link(enc_r, enc_h, schema, seed=0, candidates_per_record=NO_LIMIT)
        assert result.pairs() == oracle(schema, enc_r, enc_h)


def test_encodings_under_another_schema_are_refused():
    schema = schema_with("keys")
    other = schema_with("keys", threshold=0.7)
    first, second, _ = tables(9, n=20, strangers=0)
    enc_a = linkage.encode(first, schema, SECRET)
    enc_b = linkage.encode(second, other, SECRET)
    with pytest.raises(EncodingMismatch, match="second party"):
        linkage.link(enc_a, enc_b, schema)
    stripped = linkage.Encodings(enc_a.clks, enc_a.fingerprint, None)
    with pytest.raises(EncodingMismatch, match="no blocking tokens"):
        linkage.link(stripped, enc_a, schema)


def test_records_without_any_blocking_value_are_counted_not_dropped_silently():
    schema = schema_with("keys")
    first, second, _ = tables(10, n=30, strangers=0)
    second = second.copy()
    second.loc[[0, 1], ["birth_date", "postal_code", "family_name"]] = ""
    enc = [linkage.encode(t, schema, SECRET) for t in (first, second)]
    result = linkage.link(*enc, schema, seed=0)
    assert result.unblocked == (0, 2)
    assert not {0, 1} & set(result.second.positions.tolist())
