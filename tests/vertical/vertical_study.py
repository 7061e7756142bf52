"""A vertical study on disk: a FHIR hospital and an OMOP registry, their site.toml files,
the study specification with its ``[linkage]`` table, the study's roster, and a study.toml.

The population is :func:`harmonize.synthetic_ehr.synthetic_ehr` with identifiers, split as
in :mod:`tests.vertical.test_fhir_omop_linked` (a tenth of the shared patients misspelt at
the hospital). ``truth`` is the set of (registry patient, hospital patient) pairs of the
same generated person, the oracle of the linkage and of the joined rows.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import tomli_w

from fedstats.flower import study_pki
from fedstats.secagg.roster import write_roster
from harmonize.synthetic_ehr import person_keys, synthetic_ehr, write_fhir_ndjson, write_omop_csv
from tests.vertical.test_fhir_omop_linked import DEMO, STUDY_LINKAGE, misspelt, part

STUDY = "vertical-study"
FORMULA = "died ~ age + C(sex) + diabetes + hypertension + statin"
SITES = ("registry", "hospital")


@dataclass
class VerticalStudy:
    root: Path
    spec: Path
    site_tomls: dict[str, Path]
    shared: list[str]
    omop_id: dict[str, str]
    """FHIR patient id -> the registry's OMOP person_id for the same person."""

    def truth(self, registry: pd.DataFrame, hospital: pd.DataFrame) -> set[tuple[str, str]]:
        """True (registry, hospital) pairs among the two harmonised frames' patients."""
        return {
            (self.omop_id[pid], pid)
            for pid in self.shared
            if pid in hospital.index and self.omop_id[pid] in registry.index
        }


def write_spec(path: Path) -> Path:
    raw = tomllib.loads(DEMO.read_text())
    raw["linkage"] = STUDY_LINKAGE
    raw["identifiers"] = {"omop_names": "person_source_value"}
    path.write_text(tomli_w.dumps(raw), encoding="utf-8")
    return path


def make_study(root: Path, *, n: int = 480, seed: int = 21) -> VerticalStudy:
    """Sources, specification, keys and site.toml files of both sites under ``root``."""
    population = synthetic_ehr(n, seed=seed, identifiers=True)
    ids = population.patients["person_id"].tolist()
    third = n // 4
    at_registry, at_hospital = set(ids[: 3 * third]), set(ids[third:])
    shared = sorted(at_registry & at_hospital)
    rng = np.random.default_rng(seed)
    typos = list(rng.choice(shared, size=len(shared) // 10, replace=False))
    hospital_ehr = misspelt(part(population, at_hospital), typos)
    registry_ehr = part(population, at_registry)
    omop = write_omop_csv(registry_ehr, root / "registry" / "omop")
    person = pd.read_csv(omop / "person.csv", dtype=str, keep_default_na=False)
    names = registry_ehr.patients.set_index("person_id")
    person["person_source_value"] = [
        f"{names.at[pid, 'family_name']}^{names.at[pid, 'given_name']}"
        for pid in registry_ehr.patients["person_id"]
    ]
    person.to_csv(omop / "person.csv", index=False)
    fhir = write_fhir_ndjson(hospital_ehr, root / "hospital" / "fhir")
    spec = write_spec(root / "study-spec.toml")
    keys = {site: study_pki.make_node_key(root / site / "pki", site) for site in SITES}
    roster = write_roster(
        root / "roster.toml",
        STUDY,
        {site: key.public_key.read_text(encoding="utf-8") for site, key in keys.items()},
    )
    sources = {"registry": {"omop": str(omop)}, "hospital": {"fhir": [str(fhir)]}}
    tomls = {}
    for site in SITES:
        config: dict[str, Any] = {
            "site": {"name": site, "workdir": str(root / site / "work")},
            "data": {**sources[site], "spec": str(spec)},
            "privacy": {"ledger": str(root / site / "site.ledger")},
            "secure_aggregation": {
                "roster": str(roster),
                "signing_key": str(keys[site].private_key),
            },
            "coordinator": {"superlink": "127.0.0.1:9", "insecure": True},
        }
        tomls[site] = root / site / "site.toml"
        tomls[site].write_text(tomli_w.dumps(config), encoding="utf-8")
    return VerticalStudy(root, spec, tomls, shared, person_keys(registry_ehr))


def study_toml(study: VerticalStudy, out: Path, **extra: Any) -> Path:
    """The coordinator's study.toml: one link, one vertical fit."""
    config: dict[str, Any] = {
        "study": {"name": STUDY, "sites": list(SITES), "out": str(out), "spec": str(study.spec)},
        "links": [{"id": "registry-hospital", "first": "registry", "second": "hospital"}],
        "fits": [
            {
                "kind": "vertical_logistic",
                "name": "died_vertical",
                "formula": FORMULA,
                "outcome_site": "registry",
                "covariate_sites": ["hospital"],
                "linkage": ["registry-hospital"],
            }
        ],
        **extra,
    }
    path = out.parent / f"{out.name}-study.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(tomli_w.dumps(config), encoding="utf-8")
    return path
