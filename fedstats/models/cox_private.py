"""Differentially private federated Cox regression by noisy Newton steps on a time grid.

The model is Cox's with a baseline hazard constant on each interval of the
study's grid (the piecewise exponential model; Holford 1980, Laird &
Olivier 1981): ``lambda_s(t | x) = exp(alpha_sk + x' beta)``, one baseline
``alpha_s`` per site (``strata="site"``) or one shared by all sites
(``strata=None``). Why not the partial likelihood, and how each patient's
influence is bounded, is in :mod:`fedstats.site.handlers.cox_private`:
every site clips each patient's score to ``C_g`` and information to ``C_H``
(Frobenius), and releases the sums with Gaussian noise after charging its
own ledger, as the private logistic fit does.

The fit is the noisy Newton method of Avella-Medina, Bradshaw & Loh (Ann.
Statist. 2023) over ``theta = (alpha, beta)``, with the budget split and
information reuse of :class:`~fedstats.models.privacy.RecordDP` and
intervals from the parametric bootstrap of the noisy run
(:mod:`fedstats.models.noisy_newton`). With per-site baselines the entries
of ``alpha_s`` carry site ``s``'s noise only and those of ``beta`` the noise
of every site: the noise scales are per entry. Secure aggregation sums
everything over sites, so it applies to the shared baseline only; each site
then adds ``1/sqrt(t)`` of one central noise.

Bounds: with rows clipped to ``||x|| <= B`` and a patient's cumulative hazard
``Lambda_i <= L`` (:data:`HAZARD_CAP`), ``||g_i|| <= (1 + L) sqrt(1 + B^2)``
and ``||H_i||_F <= L (1 + B^2)``; these are the clipping bounds, so only
patients with ``Lambda_i > L`` are clipped (censored patients with long
follow-up at high risk), which biases the fit slightly towards lower hazards
for them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING

import numpy as np

from fedstats.contract.design import feature_scaling
from fedstats.contract.dp_request import DpRequest
from fedstats.contract.tasks.cox_private import TASK
from fedstats.errors import StudyConfigurationError
from fedstats.models.agree import Agreement
from fedstats.models.federation import Federation
from fedstats.models.noisy_newton import NoisyPath
from fedstats.models.privacy import (
    PrivacyAccount,
    RecordDP,
    preview_site_budgets,
    site_spending,
)
from fedstats.models.results import PRIVATE_BOOTSTRAP, CoxPHResults, Provenance
from fedstats.models.secure_aggregation import SecureAggregation, secure_record, secure_sum
from fedstats.models.utility import count_warnings, noise_shares, noise_warnings, warn

if TYPE_CHECKING:
    from fedstats.models.cox import CoxPH

HAZARD_CAP = 3.0
"""``L``: the cumulative hazard up to which a patient's score and information are not
clipped (a public constant; about 5 % of uncensored patients exceed 3 under the model)."""

POOLED = "all sites"


def every_round(record: RecordDP) -> set[int]:
    """The rounds that release the information: all of them. A Poisson-type information
    ``sum_i mu_i ...`` scales with the baseline hazard, which moves most in the first
    rounds, so reusing an earlier round's (as the logistic fit does) overshoots."""
    return set(range(1, record.rounds + 1))


def patient_bounds(row_norm: float, hazard_cap: float = HAZARD_CAP) -> tuple[float, float]:
    """``(C_g, C_H) = ((1 + L) sqrt(1 + B^2), L (1 + B^2))``: the per-patient clipping bounds."""
    return (1 + hazard_cap) * math.sqrt(1 + row_norm**2), hazard_cap * (1 + row_norm**2)


def fit_private_cox(
    model: CoxPH,
    federation: Federation,
    record: RecordDP,
    secure: SecureAggregation | None = None,
) -> CoxPHResults:
    """Fit ``model`` on ``federation`` under record-level privacy (see the module docstring).

    The steps: check the options and preview the whole fit against every
    site's budget; agree the design with noisy counts (:func:`_prepared`);
    run the noisy Newton rounds (:func:`_noisy_round`); estimate the noise's
    share of the covariance by the bootstrap; account what was spent.
    """
    started = datetime.now(UTC)
    run = _prepared(model, federation, record, secure)
    rng = federation.noise_rng()
    path = NoisyPath.starting_at(_start(run))
    for round_no in range(1, record.rounds + 1):
        _noisy_round(run, path, round_no, rng)
    sampling_scaled, noise_scaled = path.covariances(rng)
    beta_part = slice(run.dim - run.p, run.dim)
    A = np.diag(1.0 / run.scaling[:, 1])
    sampling = A @ sampling_scaled[beta_part, beta_part] @ A.T
    noise = A @ noise_scaled[beta_part, beta_part] @ A.T
    names = list(run.agreement.spec.columns)
    shares = noise_shares(sampling, noise)
    counts = run.agreement.counts
    problems = count_warnings(
        counts.n_obs, counts.n_events, used_for="the fit's starting baseline hazard"
    ) + noise_warnings(names, shares)
    warn(problems, stacklevel=4)  # the caller of CoxPH.fit
    account = PrivacyAccount(
        tuple(
            site_spending(
                site,
                record.planned_event(run.sigmas),
                record.delta,
                path.last_replies.get(site, {}),
                tuple(run.sigmas.values()),
                len(run.sigmas),
            )
            for site in federation.sites
        ),
        record.rounds,
        run.row_norm,
    )
    if secure is not None:
        account = account.with_secure_aggregation(
            secure_record(secure, len(federation.sites), path.secure_rounds)
        )
    return CoxPHResults(
        names=names,
        params=A @ path.theta[beta_part],
        cov=sampling + noise,
        llf=math.nan,
        converged=True,
        iterations=record.rounds,
        provenance=Provenance.of_fit(federation, run.analysis, counts, record.rounds, started),
        notes=_notes(run, record, account),
        n_events=counts.n_events,
        ties="none (piecewise exponential baseline)",
        strata=() if run.pooled else ("site",),
        design=run.design,
        privacy=account,
        interval_method=PRIVATE_BOOTSTRAP,
        noise_share=shares,
        utility_warnings=problems,
    )


@dataclass(frozen=True)
class _PrivateCox:
    """What a private Cox fit fixes before its first round."""

    federation: Federation
    analysis: str
    record: RecordDP
    secure: SecureAggregation | None
    sigmas: dict[tuple[int, str], float]
    agreement: Agreement
    design: dict
    """The agreed design in wire form, sent with every request."""
    grid: np.ndarray
    scaling: np.ndarray
    row_norm: float
    bounds: tuple[float, float]
    pooled: bool

    @property
    def strata(self) -> tuple[str, ...]:
        return (POOLED,) if self.pooled else self.federation.sites

    @property
    def K(self) -> int:
        return len(self.grid)

    @property
    def p(self) -> int:
        return self.agreement.spec.n_params

    @property
    def dim(self) -> int:
        return len(self.strata) * self.K + self.p

    def blocks(self, stratum: int) -> np.ndarray:
        """Indices of ``theta`` one stratum's reply covers: its ``alpha``, then ``beta``."""
        alpha = np.arange(stratum * self.K, (stratum + 1) * self.K)
        return np.concatenate([alpha, np.arange(self.dim - self.p, self.dim)])

    def noises(self, replies: int) -> float:
        """Noises one summed entry carries: one per site, or ``survivors / t`` under secure
        aggregation (each survivor adds ``1/t`` of the variance)."""
        if self.secure is None:
            return float(replies)
        return replies / self.secure.threshold_for(len(self.federation.sites))


def _prepared(
    model: CoxPH, federation: Federation, record: RecordDP, secure: SecureAggregation | None
) -> _PrivateCox:
    """Refuse what cannot be fitted privately, preview the whole fit against every site's
    budget before any message, then agree the design with noisy counts."""
    if model.grid is None:
        raise StudyConfigurationError(
            "a private Cox fit works on the study's time grid (its baseline hazard is constant "
            "between grid points): give grid=[...] or width= and horizon="
        )
    if model.strata:
        raise StudyConfigurationError(
            "private Cox fits take strata='site' or strata=None; strata columns within sites "
            f"({list(model.strata)}) would need a baseline per stratum and site"
        )
    if model.robust or model.penalizer:
        raise StudyConfigurationError(
            "robust standard errors and ridge penalties are not offered for private Cox fits"
        )
    if secure is not None and not model.pooled:
        raise StudyConfigurationError(
            "secure aggregation shows the coordinator only sums over sites; a baseline per "
            "site is not such a sum. Use strata=None (one baseline) or drop secure_aggregation"
        )
    analysis = federation.new_analysis("cox-dp")
    sigmas = record.noise_multipliers(every_round(record))
    preview_site_budgets(federation, record.planned_event(sigmas), analysis)
    counts_dp = DpRequest({"n_obs": sigmas[0, "n_obs"]}, federation.study, analysis, "counts")
    agreement = model.agree(federation, analysis, dp=counts_dp)
    scaling = feature_scaling(
        agreement.layout,
        agreement.spec.columns,
        dict(record.bounds),
        federation.sites,
        shift_absorbed=True,
    )
    row_norm = record.row_norm or math.sqrt(agreement.layout.n_terms)
    return _PrivateCox(
        federation=federation,
        analysis=analysis,
        record=record,
        secure=secure,
        sigmas=sigmas,
        agreement=agreement,
        design=agreement.spec.to_wire(),
        grid=np.asarray(model.grid, dtype=np.float64),
        scaling=scaling,
        row_norm=row_norm,
        bounds=patient_bounds(row_norm),
        pooled=model.pooled,
    )


def _start(run: _PrivateCox) -> np.ndarray:
    """``alpha`` at the log of (noisy events) / (noisy patients x K / 2), the hazard per
    interval if patients stayed half the grid on average; ``beta = 0``."""
    counts = run.agreement.counts
    theta = np.zeros(run.dim)
    for s, stratum in enumerate(run.strata):
        sites = run.federation.sites if run.pooled else (stratum,)
        events = sum(counts.n_events[x] for x in sites)
        patients = sum(counts.n_obs[x] for x in sites)
        rate = max(events, 1.0) / max(patients * run.K / 2, 1.0)
        theta[s * run.K : (s + 1) * run.K] = math.log(min(max(rate, 1e-4), 1.0))
    return theta


def _noisy_round(
    run: _PrivateCox, path: NoisyPath, round_no: int, rng: np.random.Generator
) -> None:
    """One noisy Newton step on ``theta``: each stratum's clipped, noised sums, assembled
    into the full score and information; the noise scale of every entry recorded."""
    gradient_only = round_no not in every_round(run.record)
    round_sigmas = {g: run.sigmas[r, g] for (r, g) in run.sigmas if r == round_no}
    dp = DpRequest(round_sigmas, run.federation.study, run.analysis, f"Cox round {round_no}")
    score, info = np.zeros(run.dim), np.zeros((run.dim, run.dim))
    score_var = np.zeros(run.dim)
    info_var = np.zeros((run.dim, run.dim))
    C_g, C_H = run.bounds
    replies: dict = {}
    for s, stratum in enumerate(run.strata):
        index = run.blocks(s)
        args = {
            "design": run.design,
            "beta": path.theta[run.dim - run.p :],
            "alpha": path.theta[s * run.K : (s + 1) * run.K],
            "grid": run.grid,
            "clip": {"row_norm": run.row_norm, "scaling": run.scaling},
            "patient_bounds": {"score": C_g, "information": C_H},
            "release": "gradient" if gradient_only else "both",
            "dp": dp.to_args(),
        }
        sums, public = _gathered(run, path, stratum, args)
        replies.update(public)
        noises = run.noises(len(public))
        score[index] += sums["gradient"]
        score_var[index] += noises * (round_sigmas["gradient"] * C_g) ** 2
        if not gradient_only:
            info[np.ix_(index, index)] += sums["hessian"]
            info_var[np.ix_(index, index)] += noises * (round_sigmas["hessian"] * C_H) ** 2
    path.last_replies = replies
    if gradient_only:
        path.step(score, None, score_var, None)
    else:
        path.step(score, info, score_var, np.sqrt(info_var))


def _gathered(run: _PrivateCox, path: NoisyPath, stratum: str, args: dict) -> tuple[dict, dict]:
    """One stratum's summed release and the public part of each reply: every site's (or
    the secure sum's) for a shared baseline, the one site's for its own."""
    federation = run.federation
    if run.secure is not None:
        summed = secure_sum(federation, TASK, args, analysis=run.analysis, options=run.secure)
        path.secure_rounds.append(summed)
        return summed.total, summed.public
    sites = None if run.pooled else [stratum]
    replies = federation.request(TASK, args, analysis=run.analysis, sites=sites)
    fields = ("gradient", "hessian") if "hessian" in next(iter(replies.values())) else (
        "gradient",
    )  # fmt: skip
    return {f: sum(r[f] for r in replies.values()) for f in fields}, replies


def _notes(run: _PrivateCox, record: RecordDP, account: PrivacyAccount) -> list[str]:
    baseline = "one baseline across sites" if run.pooled else "a baseline per site"
    C_g, C_H = run.bounds
    return [
        f"differentially private Cox fit: {record.rounds} noisy Newton rounds on the "
        f"piecewise exponential model ({baseline}, constant between the {run.K} grid points; "
        "Holford 1980, Laird & Olivier 1981); hazard ratios as in Cox's model; the partial "
        "likelihood is not released; counts are noisy",
        f"each patient's score clipped to norm {C_g:.3g} and information to {C_H:.3g} "
        f"(cumulative hazard cap {HAZARD_CAP:g}, rows to norm {run.row_norm:.3g})",
        *account.notes(),
    ]
