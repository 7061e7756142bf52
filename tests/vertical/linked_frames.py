"""A joined frame split vertically: the outcome to a registry, covariates to hospitals, each
site's rows relabelled and shuffled on its own, linked by pair ids: accepted at the sites by
hand (as a linkage unit's mapping would give them), or, with ``wire=True``, linked over the
wire by ``fedstats.link`` from identifier tables each site holds for its rows (one synthetic
person per joined row, :func:`linkage.synthetic.people`), one call per hospital; the pairs
the sites accepted are then checked to be the joined rows."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

import fedstats
from fedstats.site.linked_rows import LinkedRows
from linkage.synthetic import people
from tests.vertical.linked_population import LINKAGE, accepted_pairs


@dataclass
class VerticalStudy:
    federation: fedstats.Federation
    joined: dict[str, pd.DataFrame]
    """Each hospital's joined rows (outcome and covariates), for the oracle."""
    linkages: dict[str, str]
    linked: dict[str, fedstats.LinkageResult] = field(default_factory=dict)
    """With ``wire=True``: each hospital's linkage result."""
    linkage_analyses: list[str] = field(default_factory=list)
    """With ``wire=True``: the inventory labels of the linkages' messages."""


def relabelled(
    frame: pd.DataFrame, prefix: str, rng: np.random.Generator
) -> tuple[pd.DataFrame, np.ndarray]:
    """The frame under new patient labels, its rows shuffled; and the label of each of the
    original rows (by position)."""
    labels = np.array([f"{prefix}{i}" for i in rng.permutation(len(frame))])
    out = frame.reset_index(drop=True).set_axis(labels)
    return out.iloc[rng.permutation(len(frame))], labels


def vertical_study(
    parts: dict[str, pd.DataFrame],
    outcome: list[str],
    seed: int = 0,
    registry: str = "registry",
    wire: bool = False,
    inventory: fedstats.MessageInventory | None = None,
    **options,
) -> VerticalStudy:
    """``parts``: each hospital's joined rows. The registry holds the ``outcome`` columns of
    every part's patients, each hospital the other columns of its own; linkage
    ``L-<hospital>`` joins them (over the wire with ``wire=True``, its messages recorded in
    ``inventory`` when one is given)."""
    rng = np.random.default_rng(seed)
    registry_parts, frames, links = [], {}, {}
    crowd = people(sum(len(j) for j in parts.values()), np.random.default_rng([seed, 7]))
    identities: dict[str, list[pd.DataFrame]] = {registry: []}
    for h, (hospital, joined) in enumerate(parts.items()):
        pair_ids = rng.choice(10 * len(joined) + 100, size=len(joined), replace=False)
        at_registry, registry_labels = relabelled(joined[outcome], f"R{h}-", rng)
        at_hospital, hospital_labels = relabelled(joined.drop(columns=outcome), f"P{h}-", rng)
        order = np.argsort(pair_ids)
        links[hospital] = (pair_ids[order], registry_labels[order], hospital_labels[order])
        registry_parts.append(at_registry)
        frames[hospital] = at_hospital
        persons, crowd = crowd.iloc[: len(joined)], crowd.iloc[len(joined) :]
        identities[registry].append(persons.set_axis(registry_labels))
        identities[hospital] = [persons.set_axis(hospital_labels)]
    frames = {registry: pd.concat(registry_parts).sample(frac=1, random_state=seed), **frames}
    if not wire:
        fed = fedstats.Federation.in_process(frames, **options)
        for hospital, (pairs, registry_patients, hospital_patients) in links.items():
            linkage = f"L-{hospital}"
            fed.silos[registry].accept_linkage(LinkedRows(linkage, pairs, registry_patients))
            fed.silos[hospital].accept_linkage(LinkedRows(linkage, pairs, hospital_patients))
        return VerticalStudy(fed, dict(parts), {h: f"L-{h}" for h in parts})
    tables = {site: pd.concat(found) for site, found in identities.items()}
    fed = fedstats.Federation.in_process(frames, identifiers=tables, linkage=LINKAGE, **options)
    if inventory is not None:
        fed.inventory = inventory
    linked = {}
    with fed.analyses_started() as analyses:
        for hospital in links:
            linked[hospital] = fedstats.link(
                fed, first=registry, second=hospital, linkage_id=f"L-{hospital}", schema=LINKAGE
            )
    for hospital, (_, registry_patients, hospital_patients) in links.items():
        truth = set(zip(registry_patients.tolist(), hospital_patients.tolist(), strict=True))
        if accepted_pairs(fed, f"L-{hospital}", registry, hospital) != truth:
            raise AssertionError(f"the linkage of {hospital!r} is not the joined rows")
    return VerticalStudy(fed, dict(parts), {h: f"L-{h}" for h in parts}, linked, analyses)
