"""A record linkage run over the wire by the coordinator as linkage unit (``fedstats.link``).

Truth: the people two sites share (:mod:`tests.vertical.linked_population`), half of them
with a typographical error at the hospital. The oracle of the linkage is that truth, read
against the pairs the two sites accepted (joined by pair id at the sites, which the
coordinator cannot do); the record is read back with the report's own reader
(:class:`studyfiles.linkage_records.LinkageRecord`).
"""

from __future__ import annotations

import json
import time

import pandas as pd
import pytest

import fedstats
from fedstats.errors import DisclosureError, ProtocolError, StudyConfigurationError
from fedstats.site.disclosure import DisclosurePolicy
from fedstats.site.protocol import Protocol
from linkage import parse_linkage_table
from linkage.quality import quality
from studyfiles.linkage_records import LinkageRecord
from tests.vertical.linked_population import (
    LINKAGE,
    accepted_pairs,
    federation,
    frames_of,
    two_sites,
)


def test_link_over_the_wire_finds_the_shared_patients_and_writes_the_record(tmp_path):
    sites = two_sites(both=120, registry_only=60, hospital_only=40, seed=1)
    fed = federation(sites)
    start = time.perf_counter()
    result = fedstats.link(
        fed, first="registry", second="hospital", linkage_id="L1", schema=LINKAGE,
        roles={"registry": "outcome", "hospital": "covariates"}, record_dir=tmp_path,
    )  # fmt: skip
    seconds = time.perf_counter() - start
    linked = accepted_pairs(fed, "L1", "registry", "hospital")
    measured = quality(linked, sites.truth)
    print(
        f"linkage over the wire: {len(linked)} pairs, precision {measured.precision:.3f}, "
        f"recall {measured.recall:.3f}, {seconds:.2f} s"
    )
    assert measured.precision >= 0.95 and measured.recall >= 0.95
    assert result.pairs == len(linked) == result.linked["registry"] == result.linked["hospital"]
    assert result.records == {"registry": 180, "hospital": 160}
    assert result.fingerprint == parse_linkage_table(LINKAGE).fingerprint()
    counts = [b["count"] for b in result.score_histogram]
    assert sum(c for c in counts if c is not None) <= result.pairs
    assert all(c is None or c == 0 or c >= result.k for c in counts)
    # the record, read with the report's reader: settings and counts, never a value
    path = tmp_path / "linkages" / "L1.json"
    assert result.record_path == path
    record = LinkageRecord.model_validate_json(path.read_text())
    assert record.pairs == result.pairs and record.schema_fingerprint == result.fingerprint
    assert [(s.site, s.role, s.records_sent) for s in record.sites] == [
        ("registry", "outcome", 180), ("hospital", "covariates", 160)
    ]  # fmt: skip
    assert "X25519" in record.secret and "roster" in record.secret
    values = set(sites.registry.to_numpy().ravel()) | set(sites.hospital.to_numpy().ravel())
    written = set(string_values(json.loads(path.read_text())))
    assert not written & (values - {""}), written & values


def string_values(tree):
    """Every string value (not key) of a JSON tree."""
    if isinstance(tree, dict):
        for item in tree.values():
            yield from string_values(item)
    elif isinstance(tree, list):
        for item in tree:
            yield from string_values(item)
    elif isinstance(tree, str):
        yield tree


def test_a_registry_is_linked_to_each_hospital_by_its_own_call():
    """One registry, two hospitals: one linkage (and id) per hospital, each accepted at the
    registry beside the other (the two linkages cover different patients)."""
    north = two_sites(both=60, registry_only=0, hospital_only=20, seed=2, max_errors=0)
    south = two_sites(both=50, registry_only=0, hospital_only=20, seed=3, max_errors=0)
    south.registry = south.registry.set_axis([f"S{x}" for x in south.registry.index])
    truth_south = {(f"S{r}", h.replace("H", "K")) for r, h in south.truth}
    south.hospital = south.hospital.set_axis([x.replace("H", "K") for x in south.hospital.index])
    registry = pd.concat([north.registry, south.registry])
    frames = {
        "registry": pd.DataFrame({"y": 0}, index=registry.index),
        "north": frames_of(north)["hospital"],
        "south": pd.DataFrame({"x": 0.0}, index=south.hospital.index),
    }
    fed = fedstats.Federation.in_process(
        frames,
        identifiers={"registry": registry, "north": north.hospital, "south": south.hospital},
        linkage=LINKAGE,
    )
    for hospital in ("north", "south"):
        fedstats.link(fed, first="registry", second=hospital, linkage_id=f"L-{hospital}",
                      schema=LINKAGE)  # fmt: skip
    assert accepted_pairs(fed, "L-north", "registry", "north") == north.truth
    assert accepted_pairs(fed, "L-south", "registry", "south") == truth_south


def test_a_site_without_identifiers_refuses_linkage():
    sites = two_sites(both=30, registry_only=0, hospital_only=0, seed=4)
    fed = fedstats.Federation.in_process(
        frames_of(sites), identifiers={"registry": sites.registry}, linkage=LINKAGE
    )
    with pytest.raises(DisclosureError, match="holds no identifier table") as caught:
        fedstats.link(fed, first="registry", second="hospital", linkage_id="L", schema=LINKAGE)
    assert caught.value.site == "hospital" and caught.value.rule == "linkage"


def test_a_site_that_requires_privacy_answers_no_linkage_task():
    """A private-only site refuses every linkage task (rule ``privacy-required``): the
    encodings are per-patient releases without noise, and serve only exact vertical fits,
    which it refuses too."""
    sites = two_sites(both=30, registry_only=0, hospital_only=0, seed=5)
    fed = federation(sites, disclosure=DisclosurePolicy(require_privacy=True))
    with pytest.raises(DisclosureError) as caught:
        fedstats.link(fed, first="registry", second="hospital", linkage_id="L", schema=LINKAGE)
    assert caught.value.rule == "privacy-required"
    log = fed.silos["registry"].log
    assert [(e.task, e.reason) for e in log] == [("linkage.advertise", "privacy-required")]


PROTOCOL = """
[protocol]
title = "linked registry study"
approved_by = "privacy office"
approved_on = 2026-11-20

[[protocol.analysis]]
name = "risk"
model = "{model}"
formula = "y ~ x"
"""


@pytest.mark.parametrize("model", ["vertical_logistic", "logistic"])
def test_a_protocol_admits_linkage_only_beside_a_vertical_analysis(model):
    sites = two_sites(both=30, registry_only=0, hospital_only=0, seed=6, max_errors=0)
    protocol = Protocol.from_toml(PROTOCOL.format(model=model))
    fed = federation(sites, protocols={"registry": protocol, "hospital": protocol})
    call = lambda: fedstats.link(  # noqa: E731
        fed, first="registry", second="hospital", linkage_id="L", schema=LINKAGE
    )
    if model == "logistic":
        with pytest.raises(ProtocolError, match="no exact vertical_logistic"):
            call()
    else:
        assert call().pairs == 30


def test_a_sites_linkage_inputs_are_checked_when_it_is_built():
    sites = two_sites(both=20, registry_only=0, hospital_only=0, seed=7)
    frame = frames_of(sites)["registry"]
    with pytest.raises(StudyConfigurationError, match="needs both"):
        fedstats.Silo("r", frame, identifiers=sites.registry)
    with pytest.raises(StudyConfigurationError, match="one row for each patient"):
        fedstats.Silo("r", frame, identifiers=sites.registry.iloc[1:], linkage=LINKAGE)
    bad = sites.registry.copy()
    bad.iloc[3, bad.columns.get_loc("birth_date")] = "03/04/1950"
    with pytest.raises(StudyConfigurationError, match="birth_date"):
        fedstats.Silo("r", frame, identifiers=bad, linkage=LINKAGE)
    with pytest.raises(StudyConfigurationError, match=r"\[linkage\] length"):
        fedstats.Silo("r", frame, identifiers=sites.registry, linkage={**LINKAGE, "length": 1000})
    with pytest.raises(StudyConfigurationError, match="unknown sites"):
        fedstats.Federation.in_process({"r": frame}, identifiers={"x": frame}, linkage=LINKAGE)
