"""What the linkage unit sees: linkable encodings under one secret, unlinkable ones across
secrets, and how much hardening shrinks the bit pattern shared by a common name.

The pattern test gives the attacker the best case (it knows which records share the most
frequent family name; frequent-itemset mining, Christen et al. 2017/2018, has to find
them): it measures the bits set in all of those records and how well that pattern picks
them out of the rest. XOR folding (the default) shrinks the pattern and makes it a poor
detector; it does not make the attack impossible, as the last assertion shows.
"""

from __future__ import annotations

import numpy as np
import pytest

import linkage
from linkage import synthetic

SECRET = bytes(range(32))
FIELDS = [
    {"name": "given_name", "ngram": 2, "bits": 200},
    {"name": "family_name", "ngram": 2, "bits": 200},
    {"name": "birth_date", "ngram": 1, "bits": 300, "positional": True},
    {"name": "sex", "ngram": 1, "bits": 30, "positional": True},
    {"name": "postal_code", "ngram": 1, "bits": 150, "positional": True},
]
TABLE = {"fields": FIELDS, "length": 1024, "threshold": 0.55}


def dice_rows(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Row-wise Dice of two equally shaped uint8 arrays: 2|a&b| / (|a|+|b|)."""
    bits_a, bits_b = np.unpackbits(a, axis=1), np.unpackbits(b, axis=1)
    return 2 * (bits_a & bits_b).sum(1) / (bits_a.sum(1) + bits_b.sum(1))


@pytest.fixture(scope="module")
def people():
    first, second, truth = synthetic.linked_tables(400, seed=21)
    return first, second, truth


def test_same_secret_links_the_same_person_and_another_secret_does_not(people):
    first, second, truth = people
    schema = linkage.parse_linkage_table(TABLE)
    order = [j for _, j in sorted(truth)]
    second = second.iloc[order].reset_index(drop=True)  # row i: the copy of first's row i
    a = linkage.encode(first, schema, SECRET).clks
    b = linkage.encode(second, schema, SECRET).clks
    a_other_secret = linkage.encode(first, schema, bytes(reversed(SECRET))).clks
    assert np.all(dice_rows(a, a) == 1.0)
    same_person = dice_rows(a, b)
    strangers = dice_rows(a, np.roll(b, 1, axis=0))
    across_secrets = dice_rows(a_other_secret, a)
    assert np.median(same_person) > 0.8 and np.median(strangers) < 0.5
    # Under another secret a person's own record looks like a stranger's.
    assert abs(np.mean(across_secrets) - np.mean(strangers)) < 0.05
    assert across_secrets.max() < schema.threshold
    result = linkage.link(
        linkage.encode(first, schema, bytes(reversed(SECRET))),
        linkage.encode(second, schema, SECRET),
        schema,
        seed=0,
    )
    assert len(result.first) <= 2  # nothing links across secrets (chance pairs at most)


def common_name_pattern(schema_table: dict, frame):
    """Bits set in every record of the most frequent family name, and how they select."""
    schema = linkage.parse_linkage_table(schema_table)
    bits = np.unpackbits(linkage.encode(frame, schema, SECRET).clks, axis=1).astype(bool)
    common = frame["family_name"].value_counts().index[0]
    named = (frame["family_name"] == common).to_numpy()
    share = bits[named].mean(0)
    out = {}
    for cut in (1.0, 0.95):
        pattern = share >= cut
        selected = bits[:, pattern].all(1)
        out[cut] = {
            "bits": int(pattern.sum()),
            "precision": float((selected & named).sum() / max(selected.sum(), 1)),
            "recall": float((selected & named).sum() / named.sum()),
        }
    return out, int(named.sum())


def test_xor_folding_shrinks_the_pattern_of_a_common_name_but_does_not_remove_it():
    frame = synthetic.people(4000, np.random.default_rng(0))
    unfolded, named = common_name_pattern({**TABLE, "xor_folds": 0}, frame)
    plain, _ = common_name_pattern(
        {
            **TABLE,
            "xor_folds": 0,
            "hash": "double",
            "fields": [
                {k: v for k, v in f.items() if k != "bits"} | {"bits_per_token": f["bits"] // 8}
                for f in FIELDS
            ],
        },
        frame,
    )
    folded, _ = common_name_pattern(TABLE, frame)  # the defaults: BLAKE2, one fold
    assert named >= 30
    # Unfolded (hardened hashing or not): >100 bits shared by every record of the name,
    # and that pattern picks out exactly those records.
    for measured in (unfolded, plain):
        assert measured[1.0]["bits"] > 100
        assert measured[1.0]["precision"] == 1.0 and measured[1.0]["recall"] == 1.0
    # Folded: a handful of bits survive in all of them, and they select strangers too.
    assert folded[1.0]["bits"] < 0.1 * unfolded[1.0]["bits"]
    assert folded[1.0]["precision"] < 0.8
    # Not a defence on its own: the bits shared by 95% of them still single out a subset.
    assert folded[0.95]["precision"] > 0.9 and folded[0.95]["recall"] > 0.3
