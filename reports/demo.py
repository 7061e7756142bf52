"""The demonstration study, from raw EHR extracts to a recorded study directory.

Four synthetic hospitals (:mod:`harmonize.synthetic_ehr`; no real patient):
two export FHIR R4 NDJSON, two OMOP CDM 5.4 CSV. Each is harmonised under
``examples/demo/study.toml`` (death within five years of a first visit),
each keeps a record-level privacy ledger (budget epsilon 3 at delta 1e-5 per
site) and the coordinator a client-level one (epsilon 4 at delta 1e-5). The
coordinator fits the same logistic regression three times on one federation:

1. exactly (non-private; the reference for utility);
2. under record-level DP (:class:`fedstats.RecordDP`, epsilon 1 per site),
   its sums by secure aggregation (each site adds its share of one noise);
3. under client-level DP (:class:`fedstats.ClientDP`, epsilon 1 for the
   federation), whose noise covers a whole hospital's contribution.

Every hospital answers only inside the protocol its privacy officer approved
(``examples/demo/protocol.toml``; its SHA-256 is in the report). Site-by-site
heterogeneity of the exact fit is recorded as a diagnostic.
Everything is written with :class:`~reports.recorder.StudyRecorder`; noise
comes from OS entropy unless ``noise_seed`` is given (then the report says so).
"""

from __future__ import annotations

import shutil
from dataclasses import asdict, dataclass
from pathlib import Path

import accounting
import fedstats
from fedstats.site.protocol import load_protocol
from harmonize.run import harmonize
from harmonize.spec import load_spec
from harmonize.synthetic_ehr import synthetic_ehr, write_fhir_ndjson, write_omop_csv
from reports.errors import RecordingError
from reports.recorder import StudyRecorder

SPEC = Path(__file__).resolve().parents[1] / "examples" / "demo" / "study.toml"
"""The demonstration study's specification."""
PROTOCOL = SPEC.with_name("protocol.toml")
"""The protocol every demonstration hospital approved (:mod:`fedstats.site.protocol`)."""

FORMULA = "died ~ age + C(sex) + diabetes + hypertension + statin"
LEVELS = {"sex": ["female", "male"]}
BOUNDS = {
    "age": (18.0, 110.0),
    "diabetes": (0.0, 1.0),
    "hypertension": (0.0, 1.0),
    "statin": (0.0, 1.0),
}
"""Public ranges of the numeric design columns, from the specification (ages 18-110; 0/1 flags)."""

SITE_BUDGET = (3.0, 1e-5)
COORDINATOR_BUDGET = (4.0, 1e-5)


@dataclass(frozen=True)
class DemoSite:
    """One synthetic hospital: its export format, size and generator seed."""

    name: str
    source: str  # "fhir" or "omop"
    patients: int
    seed: int


SITES = (
    DemoSite("north", "fhir", 1200, 11),
    DemoSite("south", "omop", 1500, 12),
    DemoSite("east", "fhir", 900, 13),
    DemoSite("west", "omop", 1100, 14),
)


def run_demo_study(
    directory: str | Path,
    *,
    scale: float = 1.0,
    noise_seed: int | None = None,
    spec_path: str | Path = SPEC,
) -> Path:
    """Write the demonstration study into ``directory`` (sources in ``directory/sources``).

    ``scale`` multiplies every site's number of synthetic patients (tests use
    a smaller study). Returns the study directory (``directory/study``).
    """
    root = Path(directory)
    study_dir = root / "study"
    _clear_previous_run(root)
    spec = load_spec(spec_path)
    sites = [DemoSite(s.name, s.source, max(200, round(s.patients * scale)), s.seed) for s in SITES]
    recorder = StudyRecorder(study_dir, study=spec.study.name)
    recorder.record_spec(spec_path)
    frames = {}
    for site in sites:
        ehr = synthetic_ehr(site.patients, seed=site.seed)
        folder = root / "sources" / site.name
        if site.source == "fhir":
            harmonized = harmonize(spec, site=site.name, fhir=write_fhir_ndjson(ehr, folder))
        else:
            harmonized = harmonize(spec, site=site.name, omop=write_omop_csv(ehr, folder))
        recorder.record_harmonization(harmonized.report)
        frames[site.name] = harmonized.frame

    study = spec.study.name
    ledgers = {}
    for site in sites:
        ledger = recorder.ledger(site.name)
        ledger.set_budget(
            accounting.Scope(unit="patient", owner=site.name, study=study), *SITE_BUDGET
        )
        ledgers[site.name] = ledger
    coordinator = recorder.ledger("coordinator")
    coordinator.set_budget(
        accounting.Scope(unit="site", owner="coordinator", study=study), *COORDINATOR_BUDGET
    )
    disclosure = fedstats.DisclosurePolicy()
    protocol = load_protocol(PROTOCOL)
    federation = fedstats.Federation.in_process(
        frames,
        study=study,
        ledgers=ledgers,
        ledger=coordinator,
        disclosure=disclosure,
        noise_seed=noise_seed,
        protocols=dict.fromkeys(frames, protocol),
    )
    record_dp = fedstats.RecordDP(epsilon=1.0, delta=1e-5, bounds=BOUNDS)
    secure = fedstats.SecureAggregation()  # every site; each adds 1/sqrt(4) of the noise
    client_dp = fedstats.ClientDP(
        epsilon=1.0, delta=1e-5, gradient_clip=50.0, hessian_clip=100.0, bounds=BOUNDS
    )
    recorder.record_configuration(
        {
            "study": study,
            "formula": FORMULA,
            "levels": LEVELS,
            "bounds": {k: list(v) for k, v in BOUNDS.items()},
            "sites": [asdict(site) for site in sites],
            "budgets": {
                "site": {"epsilon": SITE_BUDGET[0], "delta": SITE_BUDGET[1]},
                "coordinator": {"epsilon": COORDINATOR_BUDGET[0], "delta": COORDINATOR_BUDGET[1]},
            },
            "privacy": {
                "logistic-record-dp": {
                    "kind": "RecordDP",
                    **_options(record_dp),
                    "secure_aggregation": secure.to_record(len(sites)),
                },
                "logistic-client-dp": {"kind": "ClientDP", **_options(client_dp)},
            },
            "disclosure": disclosure.as_record(),
            "site_protocols": dict(federation.site_protocols),
            "noise_seed": noise_seed,
            "runtime": "in-process federation (one codec, same checks as remote sites)",
        }
    )

    model = fedstats.LogisticRegression(FORMULA, levels=LEVELS)
    exact = model.fit(federation)
    recorder.record_fit(
        "logistic-exact", exact, description="Logistic regression, exact (no privacy noise)"
    )
    recorder.record_diagnostic(
        "heterogeneity-exact",
        "Between-site heterogeneity of the exact fit (Cochran's Q, I², DerSimonian–Laird tau²)",
        exact.heterogeneity(federation).summary_frame,
    )
    private = model.fit(federation, privacy=record_dp, secure_aggregation=secure)
    recorder.record_fit(
        "logistic-record-dp",
        private,
        description=(
            "Logistic regression under record-level DP (each site, epsilon 1), "
            "sums by secure aggregation"
        ),
        reference="logistic-exact",
    )
    client = model.fit(federation, privacy=client_dp)
    recorder.record_fit(
        "logistic-client-dp",
        client,
        description="Logistic regression under client-level DP (the federation, epsilon 1)",
        reference="logistic-exact",
    )
    recorder.record_inventory(federation.inventory)
    return recorder.finish()


def _clear_previous_run(root: Path) -> None:
    """Remove an earlier run's study and sources, so its ledgers' charges do not carry over."""
    study_dir = root / "study"
    if study_dir.exists():
        if not (study_dir / "study.json").is_file() and any(study_dir.iterdir()):
            raise RecordingError(
                f"{study_dir} exists and is not a study directory; choose another output folder"
            )
        shutil.rmtree(study_dir)
    shutil.rmtree(root / "sources", ignore_errors=True)


def _options(privacy: fedstats.RecordDP | fedstats.ClientDP) -> dict:
    options = asdict(privacy)
    options["bounds"] = {k: list(v) for k, v in privacy.bounds.items()}
    return options
