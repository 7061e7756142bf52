"""The linkage record's format refuses small cells and names every bad field."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from studyfiles.errors import LinkageRecordError
from studyfiles.linkage_records import LinkageRecord, checked_linkage_record, suppressed

K = 10


def record(**changes):
    base = dict(
        linkage_id="L1", created=datetime(2026, 11, 27, tzinfo=UTC).isoformat(),
        schema_fingerprint="ab" * 32,
        fields=[{"name": "given_name", "ngram": 2, "bits": 200, "positional": False}],
        length=1024, hash_type="blakeHash", xor_folds=1, threshold=0.8,
        blocking={"method": "keys"}, secret="X25519 agreement signed with roster keys",
        sites=[{"site": "registry", "role": "outcome", "records_sent": 500, "linked": 120},
               {"site": "hospital", "role": "covariates", "records_sent": 300, "linked": 120}],
        pairs=120, candidate_pairs=900, score_edges=[0.8, 0.9, 1.0], score_counts=[None, 115], k=K,
    )  # fmt: skip
    return base | changes


def test_a_record_round_trips_through_its_reader():
    written = checked_linkage_record(record())
    read = LinkageRecord.model_validate_json(json.dumps(written))
    assert read.pairs == 120 and read.sites[1].site == "hospital"


@given(count=st.integers(1, K - 1), where=st.sampled_from(["pairs", "score", "linked", "sent"]))
def test_any_count_from_1_to_k_minus_1_is_refused(count, where):
    changes = {
        "pairs": {"pairs": count},
        "score": {"score_counts": [count, 115]},
        "linked": {
            "sites": [{"site": "r", "role": "outcome", "records_sent": 500, "linked": count}]
        },
        "sent": {
            "sites": [{"site": "r", "role": "outcome", "records_sent": count, "linked": None}]
        },
    }[where]
    with pytest.raises(LinkageRecordError, match=f"below k = {K}"):
        checked_linkage_record(record(**changes))


@given(count=st.integers(0, 10_000))
def test_suppressed_hides_exactly_the_small_cells(count):
    assert suppressed(count, K) == (None if 0 < count < K else count)


def test_bad_fields_are_named():
    with pytest.raises(LinkageRecordError) as caught:
        checked_linkage_record(record(threshold="high", length="long"))
    assert "threshold" in str(caught.value) and "length" in str(caught.value)
    with pytest.raises(LinkageRecordError, match="one more entry"):
        checked_linkage_record(record(score_edges=[0.8]))
