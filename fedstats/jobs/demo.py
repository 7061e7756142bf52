"""The demonstrations ``fedstats demo`` runs: a federated fit beside its pooled twin, then a
private study from raw EHR extracts to a recorded study directory and its report.

The first (:func:`run_heart_demo`) fits logistic regression on the UCI
heart-disease data of four hospitals, prints it next to statsmodels' GLM on
the pooled rows and, under record-level differential privacy, with each
hospital's ledger.

The second (:func:`run_demo_study`) is a whole private study.

Four synthetic hospitals (:mod:`harmonize.synthetic_ehr`; no real patient):
two export FHIR R4 NDJSON, two OMOP CDM 5.4 CSV. Each is harmonised under
``fedstats/examples/demo/study.toml`` (death within five years of a first visit),
each keeps a record-level privacy ledger (budget epsilon 3 at delta 1e-5 per
site) and the coordinator a client-level one (epsilon 4 at delta 1e-5). The
coordinator fits the same logistic regression three times on one federation:

1. exactly (non-private; the reference for utility);
2. under record-level DP (:class:`fedstats.RecordDP`, epsilon 1 per site),
   its sums by secure aggregation (each site adds its share of one noise);
3. under client-level DP (:class:`fedstats.ClientDP`, epsilon 1 for the
   federation), whose noise covers a whole hospital's contribution.

Every hospital answers only inside the protocol its privacy officer approved
(``fedstats/examples/demo/protocol.toml``; its SHA-256 is in the report), answers the
exact fit only on verified paths (:mod:`fedstats.site.verified_paths`) and trusts the
coordinator with the client-level fit's coefficients, which carry the coordinator's own
noise (``trusts_client_level``; client-level DP trusts the coordinator). Site-by-site
heterogeneity of the exact fit is recorded as a diagnostic.
Everything is written with :class:`~reports.recorder.StudyRecorder`; noise
comes from OS entropy unless ``noise_seed`` is given (then the report says so).
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import typer

import accounting
import fedstats
from fedstats import datasets
from fedstats.errors import DataFileError, DemoFailed, DisclosureError, FedstatsError
from fedstats.jobs.events import emit
from fedstats.site.protocol import load_protocol
from harmonize.run import harmonize
from harmonize.spec import load_spec
from harmonize.synthetic_ehr import synthetic_ehr, write_fhir_ndjson, write_omop_csv
from reports import budget_table, data_flows
from reports.errors import RecordingError
from reports.recorder import StudyRecorder

_log = logging.getLogger(__name__)

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
        emit(_log, "demo.harmonised", f"{site.name}: harmonised", site=site.name)

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
        trusts_client_level=True,  # the client-level fit's coefficients carry its noise
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
            "site_paths": sorted(federation.path_sites or ()),
            "noise_seed": noise_seed,
            "runtime": "in-process federation (one codec, same checks as remote sites)",
        }
    )

    model = fedstats.LogisticRegression(FORMULA, levels=LEVELS)
    emit(_log, "demo.fitting", "fitting the exact model", fit="logistic-exact")
    exact = model.fit(federation)
    recorder.record_fit(
        "logistic-exact", exact, description="Logistic regression, exact (no privacy noise)"
    )
    spread = fedstats.heterogeneity(model, federation)
    recorder.record_diagnostic(
        "heterogeneity-exact",
        "Between-site heterogeneity of the exact fit (Cochran's Q, I², DerSimonian–Laird tau²)",
        spread.summary_frame,
        analyses=spread.analyses,  # the table's design and its one fit per site
    )
    emit(_log, "demo.fitting", "fitting under record-level DP", fit="logistic-record-dp")
    with _warnings_in_the_record():
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
    emit(_log, "demo.fitting", "fitting under client-level DP", fit="logistic-client-dp")
    with _warnings_in_the_record():
        client = model.fit(federation, privacy=client_dp)
    recorder.record_fit(
        "logistic-client-dp",
        client,
        description="Logistic regression under client-level DP (the federation, epsilon 1)",
        reference="logistic-exact",
    )
    recorder.record_inventory(federation.inventory)
    return recorder.finish()


@contextmanager
def _warnings_in_the_record() -> Iterator[None]:
    """Private fits whose noise swamps them say so in their summary, record and report
    (``result.utility_warnings``); the demo does not repeat them as Python warnings."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", fedstats.PrivacyUtilityWarning)
        yield


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


def run_heart_demo(
    data_dir: Path | None, *, site_intercepts: bool, private: bool, out_dir: Path
) -> None:
    """Fit, compare with the pooled GLM, then (``private``) the DP fit and the private study.

    The private study needs no data file (its hospitals are synthetic): when the heart-disease
    files cannot be read, it still runs, and the demo then fails naming the files.
    """
    if out_dir.exists() and not out_dir.is_dir():
        raise DemoFailed(
            f"--out-dir {out_dir} is a file, not a folder: name a folder (it is created if "
            "missing) for the study and its compliance report"
        )
    try:
        everyone = datasets.heart_disease(data_dir)
    except DataFileError as error:
        if private:
            typer.secho(
                "warning: the heart-disease files cannot be read (the error follows at the "
                "end); the private study runs first",
                fg=typer.colors.YELLOW,
                err=True,
            )
            _study_demo(out_dir)
        raise DemoFailed(f"the heart-disease part did not run: {error}") from None
    try:
        model = fedstats.LogisticRegression(
            datasets.HEART_EXACT_FORMULA, site_intercepts=site_intercepts
        )
        data, federation, result = _fit_where_answered(everyone, model)
    except FedstatsError as error:
        raise DemoFailed(str(error)) from None

    typer.echo(f"Data: {data.source}")
    typer.echo(f"(read from {data.folder})")
    typer.echo(data.counts().to_string())
    typer.echo(f"(excluded: {data.exclusion_reason})\n")
    typer.echo(result.summary())
    typer.echo("")
    comparison, largest = _compare_with_pooled(data.frames, result, site_intercepts)
    typer.echo("Federated vs pooled statsmodels GLM Binomial (fit to tol=1e-12):")
    typer.echo(comparison.to_string(float_format=lambda v: f"{v:.10f}"))
    typer.echo(
        f"\nLargest |difference|: coefficients {largest['params']:.2e}, "
        f"standard errors {largest['bse']:.2e}, log-likelihood {largest['llf']:.2e}"
    )
    typer.echo("\nWhat left each site (messages and bytes; no row-level data):")
    flows = data_flows(federation.inventory)
    typer.echo(flows[["messages", "refused", "bytes_out", "bytes_in"]].to_string())
    if private:
        _private_demo(everyone.frames, result, site_intercepts)
        _study_demo(out_dir)


def _study_demo(out_dir: Path) -> None:
    """Harmonise, fit, record and report the demonstration study under ``out_dir``."""
    from reports import ReportError, build_report, format_epsilon, write_html, write_pdf
    from reports.study import Study

    started = time.perf_counter()
    sources = ", ".join(f"{s.name} ({s.source.upper()})" for s in SITES)
    typer.echo(f"\nA private study from raw extracts: harmonising {sources} ...")
    try:
        study_dir = run_demo_study(out_dir)
        emit(_log, "demo.reporting", "writing the compliance report", study=str(study_dir))
        study = Study.load(study_dir)
        report = build_report(study)
        html = write_html(report, out_dir / "compliance-report.html")
        pdf = write_pdf(report, out_dir / "compliance-report.pdf")
    except (FedstatsError, ReportError) as error:
        raise DemoFailed(str(error)) from None
    typer.echo("Privacy spent per scope (from the ledgers in the study directory):")
    budgets = pd.DataFrame(
        [
            {
                "owner": s.owner,
                "level": s.level,
                "budget epsilon": s.budget_epsilon,
                "epsilon (RDP)": s.epsilon_rdp,
                "epsilon (PLD)": s.epsilon_pld,
                "charges": s.entries,
            }
            for s in report.scopes
        ]
    )
    typer.echo(budgets.to_string(index=False, float_format=format_epsilon))
    typer.echo(f"\nStudy directory: {study_dir.resolve()}")
    typer.echo(f"Compliance report (HTML): {html.resolve()}")
    typer.echo(f"Compliance report (PDF):  {pdf.resolve()}")
    typer.echo(f"(study and report in {time.perf_counter() - started:.0f} s)")


def _fit_where_answered(
    data: datasets.SiteFrames, model: fedstats.LogisticRegression
) -> tuple[datasets.SiteFrames, fedstats.Federation, fedstats.LogisticRegressionResults]:
    """Fit at every hospital that answers; a hospital whose disclosure rules refuse the exact
    fit (Switzerland's cells are too small, VA's women without disease too few) is named with
    its reason and left out."""
    while True:
        federation = fedstats.Federation.in_process(data.frames, study="heart-disease-demo")
        try:
            return data, federation, model.fit(federation)
        except DisclosureError as refusal:
            if refusal.site not in data.frames or len(data.frames) == 1:
                raise
            typer.secho(
                f"{refusal}\nThe exact fit goes on without {refusal.site!r} (it can take part "
                "in private analyses, where noise protects its small cells).\n",
                fg=typer.colors.YELLOW,
            )
            data = data.only([s for s in data.frames if s != refusal.site])


def _private_demo(
    frames: dict[str, pd.DataFrame],
    exact: fedstats.LogisticRegressionResults,
    site_intercepts: bool,
) -> None:
    """The same model under record-level DP, each site charging its own ledger."""
    study = "heart-disease-demo"
    privacy = fedstats.RecordDP(epsilon=1.0, delta=1e-3, bounds=datasets.HEART_BOUNDS)
    with tempfile.TemporaryDirectory() as folder:
        ledgers = {}
        for site in frames:
            ledger = accounting.Ledger(Path(folder) / f"{site}.ledger")
            ledger.set_budget(
                accounting.Scope(unit="patient", owner=site, study=study), epsilon=3.0, delta=1e-3
            )
            ledgers[site] = ledger
        federation = fedstats.Federation.in_process(
            frames, study=study, ledgers=ledgers, trusts_client_level=True
        )
        model = fedstats.LogisticRegression(
            datasets.HEART_FORMULA, levels=datasets.HEART_LEVELS, site_intercepts=site_intercepts
        )
        try:
            with _warnings_in_the_record():
                result = model.fit(federation, privacy=privacy)
        except FedstatsError as error:
            raise DemoFailed(str(error)) from None
        typer.echo(
            "\nUnder record-level differential privacy (each hospital: epsilon 1, delta "
            "1e-3 for this fit, out of a budget of 3):"
        )
        typer.echo(result.summary())
        ratios = pd.DataFrame(  # the coefficients both fits have (restecg is coded apart)
            {
                "exact odds ratio": exact.odds_ratios()["odds_ratio"],
                "private odds ratio": result.odds_ratios()["odds_ratio"],
            }
        ).dropna()
        typer.echo(ratios.to_string(float_format=lambda v: f"{v:.3f}"))
        typer.echo("\nEach hospital's ledger after the fit:")
        budgets = pd.concat(
            [budget_table(ledger) for ledger in ledgers.values()], ignore_index=True
        )
        typer.echo(
            budgets[
                ["owner", "budget_epsilon", "epsilon_rdp", "epsilon_pld", "remaining", "entries"]
            ].to_string(index=False, float_format=lambda v: f"{v:.4f}")
        )
        for ledger in ledgers.values():
            ledger.close()


def _compare_with_pooled(
    frames: dict[str, pd.DataFrame],
    result: fedstats.LogisticRegressionResults,
    site_intercepts: bool,
) -> tuple[pd.DataFrame, dict[str, float]]:
    import statsmodels.api as sm
    import statsmodels.formula.api as smf

    pooled = pd.concat(frames.values(), ignore_index=True)
    formula = datasets.HEART_EXACT_FORMULA
    if site_intercepts:
        pooled["site"] = np.repeat(list(frames), [len(f) for f in frames.values()])
        formula = formula.replace("~", "~ 0 + C(site) +")
    model = smf.glm(formula, pooled, family=sm.families.Binomial())
    first = model.fit(tol=1e-12)
    # One more IRLS pass from the estimate, so statsmodels' weights (and bse) are at the MLE.
    reference = model.fit(start_params=first.params, tol=1e-12)
    # statsmodels names a true/false term I(...)[T.True]; fedstats names it I(...)
    rename = {
        n: n.replace("C(site)[", "site[").replace(")[T.True]", ")") for n in reference.params.index
    }
    ref_params = reference.params.rename(rename)[result.params.index]
    ref_bse = reference.bse.rename(rename)[result.params.index]
    table = pd.DataFrame(
        {
            "federated": result.params,
            "pooled": ref_params,
            "|diff|": (result.params - ref_params).abs(),
            "se federated": result.bse,
            "se pooled": ref_bse,
        }
    )
    largest = {
        "params": float(table["|diff|"].max()),
        "bse": float((result.bse - ref_bse).abs().max()),
        "llf": abs(result.llf - reference.llf),
    }
    return table, largest
