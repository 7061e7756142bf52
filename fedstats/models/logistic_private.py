"""Differentially private federated logistic regression by noisy Newton steps.

Method (Avella-Medina, Bradshaw & Loh, "Differentially private inference
via noisy optimization", Ann. Statist. 51(5), 2023): each of ``T`` rounds
releases the score ``g`` and information ``H`` at the current coefficients
with Gaussian noise, and takes ``beta <- beta + H_+^{-1} g``, where ``H_+``
is the symmetrised noisy information with eigenvalues floored at the noise
level (``sqrt(p)`` times the per-entry noise standard deviation, the scale
of the noise matrix's spectral norm), which keeps every step a descent step.
Newton steps converge in few rounds, so the budget is split over few
releases; this beats noisy gradient descent, whose many steps each pay, and
needs no approximation of the likelihood as sufficient-statistics
perturbation (PASS-GLM, Huggins et al. 2017) does.

Record-level privacy (:class:`~fedstats.models.privacy.RecordDP`): every site
scales its design columns to ``[-1, 1]`` by public bounds, clips rows to
norm ``B``, and adds noise to its own score and information after charging
its own ledger (:mod:`fedstats.site.private_release`). Client-level privacy
(:class:`~fedstats.models.privacy.ClientDP`): the coordinator clips each site's
score and information, noises the sum and charges its ledger.

Inference: the reported covariance is the sampling covariance
``H_+^{-1}`` plus the covariance the privacy noise adds, estimated by a
parametric bootstrap of the whole noisy run (:func:`noise_covariance`),
mapped back to the original design coordinates; the log-likelihood is not
released.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import dp_accounting
import numpy as np

from fedstats.contract.design import SITE_COLUMN, DesignSpec, feature_scaling, unscale
from fedstats.contract.dp_request import DpRequest
from fedstats.errors import StudyConfigurationError
from fedstats.models.agree import Agreement
from fedstats.models.client_release import GaussianSum, clipped_sum, release
from fedstats.models.federation import Federation
from fedstats.models.noisy_newton import NoisyPath
from fedstats.models.privacy import (
    ClientDP,
    PrivacyAccount,
    RecordDP,
    coordinator_spending,
    information_rounds,
    preview_coordinator_budget,
    preview_site_budgets,
    site_spending,
)
from fedstats.models.results import PRIVATE_BOOTSTRAP, LogisticRegressionResults, Provenance
from fedstats.models.secure_aggregation import (
    SecureAggregation,
    SecureSum,
    secure_record,
    secure_sum,
)
from fedstats.models.utility import count_warnings, noise_shares, noise_warnings, warn

if TYPE_CHECKING:
    from fedstats.models.logistic import LogisticRegression


def fit_private(
    model: LogisticRegression,
    federation: Federation,
    record: RecordDP | None,
    client: ClientDP | None,
    secure: SecureAggregation | None = None,
) -> LogisticRegressionResults:
    """Fit ``model`` on ``federation`` under record-level and/or client-level privacy.

    With ``secure`` (:class:`~fedstats.models.secure_aggregation.SecureAggregation`, record-level
    only), every round's score and information are summed by secure
    aggregation: the coordinator sees only the sums, and each site adds
    ``1/sqrt(t)`` of the noise (distributed noise), so the sum carries the
    noise of one central release instead of one per site.

    The steps: preview the whole fit against every budget and agree the
    design with noisy counts (:func:`_prepared`); run the noisy Newton rounds
    (:func:`_noisy_round`); estimate the covariance with the privacy noise's
    share (:func:`noise_covariance`); account what was spent.
    """
    started = datetime.now(UTC)
    run = _prepared(model, federation, record, client, secure)
    rng = federation.noise_rng()
    path = NoisyPath.starting_at(
        _start(run.spec, run.agreement.counts, run.scaling, federation.sites)
    )
    for round_no in range(1, run.rounds + 1):
        _noisy_round(run, path, round_no, rng)
    A = unscale(run.spec.columns, run.scaling, federation.sites)
    sampling_scaled, noise_scaled = path.covariances(rng)
    sampling = A @ sampling_scaled @ A.T
    noise = A @ noise_scaled @ A.T
    shares = noise_shares(sampling, noise)
    counts = run.agreement.counts
    problems = count_warnings(counts.n_obs, counts.n_events) if counts.noisy else []
    problems += noise_warnings(list(run.spec.columns), shares)
    warn(problems, stacklevel=4)  # the caller of LogisticRegression.fit
    account = _account(
        federation, record, run.sigmas, client, run.sigma_c, run.rounds, run.row_norm,
        path.last_replies,
    )  # fmt: skip
    if secure is not None:
        account = account.with_secure_aggregation(
            secure_record(secure, len(federation.sites), path.secure_rounds)
        )
    result = LogisticRegressionResults(
        names=list(run.spec.columns),
        params=A @ path.theta,
        cov=sampling + noise,
        llf=math.nan,
        converged=True,
        iterations=run.rounds,
        provenance=Provenance.of_fit(federation, run.analysis, counts, run.rounds, started),
        notes=_notes(run.rounds, record is not None, account),
        n_events=counts.n_events,
        privacy=account,
        interval_method=PRIVATE_BOOTSTRAP,
        noise_share=shares,
        utility_warnings=problems,
    )
    result.design = run.spec.to_wire()  # what predict() builds a frame into
    return result


@dataclass(frozen=True)
class _PrivateRun:
    """What a private fit fixes before its first round: the privacy options and their
    noise multipliers (``sigmas`` by ``(round, group)`` at the sites, ``sigma_c`` at the
    coordinator), the rounds that release information, the agreed design, its public
    scaling and the row clipping norm ``B``."""

    federation: Federation
    analysis: str
    record: RecordDP | None
    client: ClientDP | None
    secure: SecureAggregation | None
    sigmas: dict[tuple[int, str], float]
    sigma_c: float | None
    rounds: int
    informed: frozenset[int]
    agreement: Agreement
    scaling: np.ndarray
    row_norm: float

    @property
    def spec(self) -> DesignSpec:
        return self.agreement.spec

    def noisy_sites(self, replies: int) -> float:
        """Sites whose noise a round's sum carries (under secure aggregation, ``t`` shares
        make one site's noise)."""
        if self.secure is None:
            return float(replies)
        return replies / self.secure.threshold_for(len(self.federation.sites))


def _prepared(
    model: LogisticRegression,
    federation: Federation,
    record: RecordDP | None,
    client: ClientDP | None,
    secure: SecureAggregation | None,
) -> _PrivateRun:
    """Check the options, preview the whole planned fit against every site's budget and
    the coordinator's before any message, then agree the design (counts noisy under
    record-level privacy) and fix the public scaling and row norm."""
    rounds, bounds = _plan(record, client)
    if secure is not None and (record is None or client is not None):
        raise StudyConfigurationError(
            "secure aggregation applies to record-level private fits: client-level privacy "
            "clips each site's contribution, which secure aggregation hides from the coordinator"
        )
    analysis = federation.new_analysis("logistic-dp")
    sigmas = record.noise_multipliers() if record else {}
    sigma_c = client.sigma() if client else None
    counts_dp = None
    if record is not None:
        preview_site_budgets(federation, record.planned_event(sigmas), analysis)
        counts_dp = DpRequest({"n_obs": sigmas[0, "n_obs"]}, federation.study, analysis, "counts")
    if client is not None:
        _preview_coordinator(federation, client, sigma_c)
    agreement = model.agree(federation, analysis, dp=counts_dp)
    scaling = feature_scaling(agreement.layout, agreement.spec.columns, bounds, federation.sites)
    row_norm = (
        record.row_norm if record and record.row_norm else math.sqrt(agreement.layout.n_terms)
    )
    return _PrivateRun(
        federation=federation,
        analysis=analysis,
        record=record,
        client=client,
        secure=secure,
        sigmas=sigmas,
        sigma_c=sigma_c,
        rounds=rounds,
        informed=frozenset(information_rounds(rounds)),
        agreement=agreement,
        scaling=scaling,
        row_norm=row_norm,
    )


def _noisy_round(
    run: _PrivateRun, path: NoisyPath, round_no: int, rng: np.random.Generator
) -> None:
    """One noisy Newton step ``beta <- beta + H_+^{-1} g``: request the sites' noisy score
    (and, in an information round, information), add the coordinator's client-level
    noise, record the round's noise variances and floor the released information."""
    federation, record, client = run.federation, run.record, run.client
    gradient_only = round_no not in run.informed
    round_sigmas = {g: run.sigmas[r, g] for (r, g) in run.sigmas if r == round_no}
    args = _round_args(run.spec, path.theta, run.row_norm, run.scaling)
    if record is not None:
        note = f"logistic round {round_no}"
        args["dp"] = DpRequest(round_sigmas, federation.study, run.analysis, note).to_args()
        args["release"] = "gradient" if gradient_only else "both"
    path.last_replies, scores, infos = _gathered(
        federation, args, run.analysis, run.secure, gradient_only, path.secure_rounds
    )
    if client is not None:
        score, hessian = _client_release(
            federation, client, run.sigma_c, scores, infos, rng, run.analysis, round_no
        )
    else:
        score, hessian = sum(scores), (None if infos is None else sum(infos))
    score_var, entry_sd = _round_noise(
        run.noisy_sites(len(path.last_replies)), round_sigmas, run.row_norm, run.sigma_c,
        client, informed=hessian is not None,
    )  # fmt: skip
    path.step(score, hessian, score_var, entry_sd)


def _round_args(
    spec: DesignSpec, beta: np.ndarray, row_norm: float, scaling: np.ndarray
) -> dict[str, Any]:
    """One round's ``logistic.summaries`` request: the coefficients and the clipping the sites
    apply (each scaled row to L2 norm ``row_norm``)."""
    return {
        "design": spec.to_wire(),
        "beta": beta,
        "clip": {"row_norm": row_norm, "scaling": scaling},
    }


def _round_noise(
    noisy_sites: float,
    round_sigmas: dict[str, float],
    row_norm: float,
    sigma_c: float | None,
    client: ClientDP | None,
    *,
    informed: bool,
) -> tuple[float, float | None]:
    """The variance of each released score entry, and the standard deviation of each released
    information entry (``None`` in a gradient-only round), from every noise source."""
    score_var = _summed_noise_var(
        noisy_sites,
        round_sigmas.get("gradient"),
        row_norm,
        sigma_c,
        client.gradient_clip if client else 0.0,
    )
    if not informed:
        return score_var, None
    entry_var = _summed_noise_var(
        noisy_sites,
        round_sigmas.get("hessian"),
        row_norm**2 / 4,
        sigma_c,
        client.hessian_clip if client else 0.0,
    )
    return score_var, math.sqrt(entry_var)


def _gathered(
    federation: Federation,
    args: dict,
    analysis: str,
    secure: SecureAggregation | None,
    gradient_only: bool,
    secure_rounds: list[SecureSum],
) -> tuple[dict, list[np.ndarray], list[np.ndarray] | None]:
    """One round's replies (under secure aggregation, the sum's public part), the sites'
    scores and, in an information round, their information matrices."""
    if secure is not None:
        summed = secure_sum(
            federation, "logistic.summaries", args, analysis=analysis, options=secure
        )
        secure_rounds.append(summed)
        infos = None if gradient_only else [summed.total["hessian"]]
        return summed.public, [summed.total["gradient"]], infos
    replies = federation.request("logistic.summaries", args, analysis=analysis)
    infos = None if gradient_only else [r["hessian"] for r in replies.values()]
    return replies, [r["gradient"] for r in replies.values()], infos


def _notes(rounds: int, record_level: bool, account: PrivacyAccount) -> list[str]:
    what = "differentially private fit" if record_level else "client-level private fit"
    counts = "; counts are noisy" if record_level else ""
    return [
        f"{what}: {rounds} noisy Newton rounds; the log-likelihood is not released{counts}",
        *account.notes(),
    ]


def _start(spec, counts, scaling: np.ndarray, sites: tuple[str, ...]) -> np.ndarray:
    """Where the noisy Newton run starts.

    From exact counts (client-level privacy alone): the intercept(s) the
    counts imply, slopes 0 — ``logit(events / n)`` is the intercept of the
    slopes-zero model with numeric columns centred, pooled or per site — which
    saves a round.

    From noisy counts (record-level privacy), or with an offset or no
    intercept: ``beta = 0``. There every fitted probability is 1/2, so the
    first information is ``X'X / 4``, which bounds the logistic information at
    every ``beta`` (Böhning & Lindsay, "Monotonicity of quadratic-approximation
    algorithms", Ann. Inst. Statist. Math. 40, 1988): the steps that reuse it
    are never too long. A start computed from noisy counts would be random, and
    an information measured at a random start too small wherever the start
    lies in a tail; steps from there overshoot into the region where the
    log-likelihood is far from quadratic, where the bootstrap's replays
    (:func:`fedstats.models.noisy_newton.noise_covariance`) cannot follow,
    and the intervals are too narrow.
    """
    beta = np.zeros(spec.n_params)
    if spec.offset is not None or counts.noisy:
        return beta

    def logit(events: float, n: float) -> float:
        rate = min(max(events / n, 0.01), 0.99) if n > 0 else 0.5
        return math.log(rate / (1 - rate))

    columns = list(spec.columns)
    if "Intercept" in columns:
        beta[columns.index("Intercept")] = logit(
            sum(counts.n_events.values()), sum(counts.n_obs.values())
        )
    for site in sites:
        name = SITE_COLUMN.format(site)
        if name in columns:
            beta[columns.index(name)] = logit(counts.n_events[site], counts.n_obs[site])
    return beta


def _plan(record: RecordDP | None, client: ClientDP | None) -> tuple[int, dict]:
    if record is None and client is None:
        raise StudyConfigurationError("a private fit needs RecordDP, ClientDP or both")
    if record is not None and client is not None:
        if record.rounds != client.rounds:
            raise StudyConfigurationError("RecordDP and ClientDP must plan the same rounds")
        if record.bounds and client.bounds and dict(record.bounds) != dict(client.bounds):
            raise StudyConfigurationError("RecordDP and ClientDP were given different bounds")
    rounds = (record or client).rounds
    bounds = dict(
        (record.bounds if record and record.bounds else None)
        or (client.bounds if client else {})
        or {}
    )
    return rounds, bounds


def _preview_coordinator(federation: Federation, client: ClientDP, sigma: float) -> None:
    planned = dp_accounting.SelfComposedDpEvent(
        dp_accounting.GaussianDpEvent(sigma), client.releases
    )
    preview_coordinator_budget(
        federation,
        planned,
        f"client-level fit ({client.releases} Gaussian releases, noise multiplier {sigma:.4g})",
        "Lower the rounds or epsilon, or raise the coordinator's budget.",
    )


def _client_release(
    federation: Federation,
    client: ClientDP,
    sigma: float,
    scores: list[np.ndarray],
    infos: list[np.ndarray] | None,
    rng: np.random.Generator,
    analysis: str,
    round_no: int,
) -> tuple[np.ndarray, np.ndarray | None]:
    """Clip each site's score and information, charge the coordinator's ledger, noise the sums
    (:func:`fedstats.models.client_release.release`)."""
    sums = [GaussianSum(clipped_sum(scores, client.gradient_clip), sigma * client.gradient_clip)]
    if infos is not None:
        info = clipped_sum(infos, client.hessian_clip)
        sums.append(GaussianSum(info, sigma * client.hessian_clip, symmetric=True))
    event = dp_accounting.ComposedDpEvent([dp_accounting.GaussianDpEvent(sigma)] * len(sums))
    released = release(
        federation,
        sums,
        event,
        rng,
        note=f"client-level logistic round {round_no}",
        analysis=analysis,
        task="logistic.summaries",
        parameters={
            "noise_multiplier": sigma,
            "gradient_clip": client.gradient_clip,
            "hessian_clip": client.hessian_clip,
        },
    )
    return released[0], (released[1] if infos is not None else None)


def _summed_noise_var(
    sites: float,
    sigma_r: float | None,
    site_sensitivity: float,
    sigma_c: float | None,
    client_clip: float,
) -> float:
    """Variance of each entry of a summed statistic's noise.

    Record-level: ``sites`` releases of ``N(0, (sigma_r * sensitivity)^2)``
    each — one per site, or, under secure aggregation with threshold ``t``,
    ``survivors / t`` (each survivor adds ``1/t`` of that variance);
    client-level: the coordinator adds ``N(0, (sigma_c * clip)^2)`` to the sum.
    (The fixed-point rounding of secure aggregation inflates the sites' noise
    by a relative ``sqrt(d) 2^(-f-1) / sensitivity``, below ``1e-8`` here.)
    """
    var = 0.0
    if sigma_r is not None:
        var += sites * (sigma_r * site_sensitivity) ** 2
    if sigma_c is not None:
        var += (sigma_c * client_clip) ** 2
    return var


def _account(
    federation: Federation,
    record: RecordDP | None,
    sigmas: dict[tuple[int, str], float],
    client: ClientDP | None,
    sigma_c: float | None,
    rounds: int,
    row_norm: float,
    replies: dict,
) -> PrivacyAccount:
    scopes = []
    if record is not None:
        scopes.extend(
            site_spending(
                site,
                record.planned_event(sigmas),
                record.delta,
                replies.get(site, {}),
                tuple(sigmas.values()),
                record.releases,
            )
            for site in federation.sites
        )
    if client is not None:
        event = dp_accounting.SelfComposedDpEvent(
            dp_accounting.GaussianDpEvent(sigma_c), client.releases
        )
        scopes.append(
            coordinator_spending(federation, event, (sigma_c,), client.releases, client.delta)
        )
    return PrivacyAccount(tuple(scopes), rounds, row_norm if record else None)
