"""Two sites that share some patients, each with an identifier table, for linkage tests.

People are drawn with :func:`linkage.synthetic.people` (clkhash's name frequency tables,
uniform birth dates and postal codes). The registry holds ``both + registry_only`` people,
the hospital ``both + hospital_only``; the hospital's copy of a shared person carries 0 to
``max_errors`` FEBRL-like typographical errors (:func:`linkage.synthetic.corrupted_copy`).
Each site's patients get labels of its own, in a shuffled order; ``truth`` is the set of
(registry patient, hospital patient) pairs that are the same person.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

import fedstats
from linkage.schema import EXAMPLE_TABLE
from linkage.synthetic import corrupted_copy, people

LINKAGE = EXAMPLE_TABLE
"""The study's ``[linkage]`` table (as ``StudySpec.linkage`` holds it)."""


@dataclass
class TwoSites:
    registry: pd.DataFrame
    """The registry's identifier table."""
    hospital: pd.DataFrame
    truth: set[tuple[str, str]]


def two_sites(
    both: int, registry_only: int, hospital_only: int, *, seed: int, max_errors: int = 1
) -> TwoSites:
    rng = np.random.default_rng(seed)
    crowd = people(both + registry_only + hospital_only, rng)
    shared = crowd.iloc[:both]
    if max_errors:
        errors = rng.random(both) < 0.5  # half the shared people carry errors
        copy = shared.copy()
        copy.loc[errors] = corrupted_copy(shared.loc[errors], rng, max_errors=max_errors).to_numpy()
        shared_at_hospital = copy
    else:
        shared_at_hospital = shared
    at_registry = pd.concat([shared, crowd.iloc[both : both + registry_only]])
    at_hospital = pd.concat([shared_at_hospital, crowd.iloc[both + registry_only :]])
    registry_labels = np.array([f"R{i:04d}" for i in rng.permutation(len(at_registry))])
    hospital_labels = np.array([f"H{i:04d}" for i in rng.permutation(len(at_hospital))])
    registry = at_registry.set_axis(registry_labels).sample(frac=1, random_state=seed)
    hospital = at_hospital.set_axis(hospital_labels).sample(frac=1, random_state=seed + 1)
    truth = set(zip(registry_labels[:both], hospital_labels[:both], strict=True))
    return TwoSites(registry.astype(object), hospital.astype(object), truth)


def frames_of(sites: TwoSites, seed: int = 0) -> dict[str, pd.DataFrame]:
    """A registry frame holding an outcome ``y`` and a hospital frame holding ``x``."""
    rng = np.random.default_rng(seed)
    return {
        "registry": pd.DataFrame({"y": rng.integers(0, 2, len(sites.registry))},
                                 index=sites.registry.index),
        "hospital": pd.DataFrame({"x": rng.normal(size=len(sites.hospital))},
                                 index=sites.hospital.index),
    }  # fmt: skip


def federation(sites: TwoSites, **options) -> fedstats.Federation:
    """Both sites in process, each with its identifier table and the study's [linkage]."""
    return fedstats.Federation.in_process(
        frames_of(sites),
        identifiers={"registry": sites.registry, "hospital": sites.hospital},
        linkage=LINKAGE,
        **options,
    )


def accepted_pairs(fed: fedstats.Federation, linkage_id: str, first: str, second: str) -> set:
    """The (first patient, second patient) pairs the two sites accepted under one linkage,
    joined by pair id: read at the sites, where the test (not the coordinator) can look."""
    rows = {s: fed.silos[s].linked_rows(linkage_id) for s in (first, second)}
    by_id = dict(zip(rows[second].pair_ids.tolist(), rows[second].patients.tolist(), strict=True))
    return {
        (patient, by_id[pair])
        for pair, patient in zip(
            rows[first].pair_ids.tolist(), rows[first].patients.tolist(), strict=True
        )
    }
