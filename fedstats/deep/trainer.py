"""The coordinator's federated training loop for a registered network.

Each round: sample sites (each with probability ``p``), send them the
global weights with ``deep.train``, combine their flat updates with weights
``n_k / (N p)`` (:mod:`fedstats.deep.aggregation`) — in the clear through an
:data:`~fedstats.deep.aggregation.Aggregator`, or by secure aggregation, in
which each site scales its own update and the coordinator learns only the
sum — and take the server step (:mod:`fedstats.deep.server_optimizers`).
SCAFFOLD's server control variate moves by ``sum_{k in S} Delta c_k / N_sites``
(Karimireddy et al., ICML 2020, Alg. 1). After the last round every site of
the evaluation federation scores the model (``deep.evaluate``).

Record-level privacy (:class:`~fedstats.models.privacy.RecordDP`): every site runs
DP-SGD (:mod:`fedstats.deep.dp_sgd`) and charges its own ledger before each
round; the coordinator first asks every site whether the whole planned
training fits its budget (``privacy.status``) and refuses to start
otherwise. ``RecordDP.epsilon``/``delta`` are the fit's target per site
(``noise_multiplier`` instead fixes ``sigma``); ``bounds`` add to the
trainer's bounds; ``rounds`` and ``row_norm`` are options of Newton fits and
do not apply (the trainer's ``rounds`` and ``max_grad_norm`` do).

Client-level privacy (:class:`~fedstats.models.client_dp.DPFedAvg`, unit: site):
the coordinator clips each sampled site's update to L2 norm ``C`` (fixed,
or adapted towards a quantile of the update norms), sums, adds
``N(0, (z_u C)^2 I)`` and divides by the expected number of sites
``m = q n`` (McMahan et al., ICLR 2018; Andrew et al., NeurIPS 2021). The
whole planned training is previewed against the coordinator's ledger
before anything is sent, and each round's event is charged there before
its aggregate moves the model (:mod:`fedstats.models.client_dp`). It combines with
record-level DP-SGD (both guarantees, both accounts), not with secure
aggregation or a custom aggregator.

Quantised updates (``quantize_bits``): each site rounds its update
stochastically to ``b`` bits per entry (unbiased; :mod:`fedstats.models.quantize`)
and sends the bit-packed codes and the scale, ``ceil(d b / 8) + 8`` bytes
instead of ``4 d`` for float32; the coordinator decodes them. The history
reports the update bytes of every round with and without quantisation.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm

from fedstats.deep.aggregation import Aggregator, client_weights, sample_sites, weighted_sum
from fedstats.deep.dp_sgd import ENGINES
from fedstats.deep.evaluation import Evaluation, combine_binary, combine_survival
from fedstats.deep.local_training import ALGORITHMS
from fedstats.deep.losses import BINARY, SURVIVAL
from fedstats.deep.models import build_model
from fedstats.deep.privacy_plan import (
    COUNTS_NOISE_MULTIPLIER,
    DpSgdSchedule,
    calibrate_noise,
    default_sample_rate,
    steps_for_epochs,
)
from fedstats.deep.results import DeepModelResults
from fedstats.deep.server_optimizers import ServerOptimizer
from fedstats.deep.site_data import input_columns
from fedstats.deep.site_tasks import DP_GROUP, EVALUATE_TASK, TRAIN_TASK
from fedstats.deep.weights import checked_arrays, flatten, parameter_arrays, unflatten
from fedstats.errors import InvalidReplyError, ModelSpecError, StudyConfigurationError
from fedstats.models import client_dp
from fedstats.models.agree import Agreement, agree_design
from fedstats.models.client_dp import DPFedAvg
from fedstats.models.federation import Federation
from fedstats.models.privacy import (
    PrivacyAccount,
    RecordDP,
    ScopeSpending,
    coordinator_spending,
    preview_site_budgets,
    privacy_levels,
    site_spending,
)
from fedstats.models.quantize import Quantized, check_bits, dequantize
from fedstats.models.results import Provenance
from fedstats.secagg.coordinator import SecureAggregation, SecureSum, secure_record, secure_sum
from fedstats.site.design import Level, feature_scaling, parse_formula, survival_outcome
from fedstats.site.private_release import DpRequest

FLOAT32_BYTES = 4
"""Bytes of one entry of an unquantised update (float32 on the wire)."""


class FederatedTrainer:
    """Federated training of a registered ``torch`` network on the sites' agreed design.

    Parameters
    ----------
    model, hyper:
        A name in the model registry (:func:`fedstats.deep.register_model`;
        built in: ``"mlp"``, ``"survival_mlp"``, ``"linear"``) and its
        hyperparameters (plain values), e.g. ``hyper={"hidden": [32], "dropout": 0.1}``.
    formula, levels, bounds:
        The design: a formula with a 0/1 outcome (binary cross-entropy) or
        ``Surv(time, event)`` (Cox partial likelihood); the categorical
        levels; public ``(low, high)`` bounds of every numeric design column,
        used to scale inputs to ``[-1, 1]``.
    algorithm, mu:
        ``"fedavg"``, ``"fedprox"`` (proximal weight ``mu``) or ``"scaffold"``.
    rounds, local_epochs, local_steps, lr, batch_size:
        Rounds; local work per round as epochs or steps (one of them); local
        SGD learning rate; batch size (under DP: the expected batch size of
        the median site, unless ``sample_rate`` is given).
    server_optimizer, server_lr:
        ``None`` (FedAvg's step, ``server_lr`` default 1), ``"adam"`` or
        ``"yogi"`` (Reddi et al. 2021; ``server_lr`` default 0.01).
    sample_rate_sites:
        Probability that a site takes part in a round.
    max_grad_norm, sample_rate, engine:
        DP-SGD's per-patient clipping norm, Poisson sampling rate (default
        ``batch_size / median n_k``) and clipping engine
        (:mod:`fedstats.deep.dp_sgd`).
    aggregator:
        A replacement for the weighted sum of updates (a robust rule of
        :mod:`fedstats.models.aggregation`); it does not combine with secure
        aggregation, which shows the coordinator only the sum.
    quantize_bits:
        Bits per entry of the sites' quantised updates (1..16), or ``None``
        for float32 updates; not with secure aggregation.
    seed:
        Initial weights, site sampling and (without record-level privacy)
        the sites' batch order; ``None`` draws it from OS entropy.
    progress:
        A progress bar over rounds (``tqdm.auto``: a widget in notebooks).
    """

    def __init__(
        self,
        model: str = "mlp",
        hyper: Mapping[str, Any] | None = None,
        *,
        formula: str,
        bounds: Mapping[str, tuple[float, float]],
        levels: Mapping[str, Sequence[Level]] | None = None,
        algorithm: str = "fedavg",
        rounds: int = 10,
        local_epochs: int | None = None,
        local_steps: int | None = None,
        lr: float = 0.05,
        batch_size: int = 32,
        mu: float = 0.0,
        server_optimizer: str | None = None,
        server_lr: float | None = None,
        sample_rate_sites: float = 1.0,
        max_grad_norm: float = 1.0,
        sample_rate: float | None = None,
        engine: str = "auto",
        missing: str = "raise",
        aggregator: Aggregator | None = None,
        quantize_bits: int | None = None,
        seed: int | None = None,
        progress: bool = True,
    ) -> None:
        if algorithm not in ALGORITHMS:
            raise StudyConfigurationError(f"algorithm must be one of {ALGORITHMS}")
        if (local_epochs is None) == (local_steps is None):
            raise StudyConfigurationError("give exactly one of local_epochs and local_steps")
        for name, value in (("rounds", rounds), ("batch_size", batch_size)):
            if type(value) is not int or value < 1:
                raise StudyConfigurationError(f"{name} must be a positive integer")
        for name, value in (("local_epochs", local_epochs), ("local_steps", local_steps)):
            if value is not None and (type(value) is not int or value < 1):
                raise StudyConfigurationError(f"{name} must be a positive integer")
        if not (_finite(lr) and lr > 0 and _finite(mu) and mu >= 0):
            raise StudyConfigurationError("lr must be positive and mu non-negative")
        if algorithm == "fedprox" and mu <= 0:
            raise StudyConfigurationError("FedProx needs mu > 0 (mu = 0 is FedAvg)")
        if not (_finite(sample_rate_sites) and 0 < sample_rate_sites <= 1):
            raise StudyConfigurationError("sample_rate_sites must be in (0, 1]")
        if not (_finite(max_grad_norm) and max_grad_norm > 0):
            raise StudyConfigurationError("max_grad_norm must be positive")
        if sample_rate is not None and not (_finite(sample_rate) and 0 < sample_rate <= 1):
            raise StudyConfigurationError("sample_rate must be in (0, 1]")
        if engine not in ENGINES:
            raise StudyConfigurationError(f"engine must be one of {ENGINES}")
        if quantize_bits is not None:
            check_bits(quantize_bits)
        self.model = model
        self.hyper = dict(hyper or {})
        self.formula = formula
        self.bounds = dict(bounds)
        self.levels = levels
        self.kind = SURVIVAL if survival_outcome(parse_formula(formula).outcome) else BINARY
        self.algorithm = algorithm
        self.rounds = rounds
        self.local_epochs = local_epochs
        self.local_steps = local_steps
        self.lr = float(lr)
        self.batch_size = batch_size
        self.mu = float(mu)
        default_lr = 1.0 if server_optimizer is None else 0.01
        self.server = (server_optimizer, float(default_lr if server_lr is None else server_lr))
        ServerOptimizer(*self.server)  # checks the options now
        self.sample_rate_sites = float(sample_rate_sites)
        self.max_grad_norm = float(max_grad_norm)
        self.sample_rate = sample_rate
        self.engine = engine
        self.missing = missing
        self.aggregator = aggregator or weighted_sum
        self.quantize_bits = quantize_bits
        self.seed = seed
        self.progress = progress

    # ------------------------------------------------------------------ fit

    def fit(
        self,
        federation: Federation,
        *,
        privacy: RecordDP | DPFedAvg | tuple[RecordDP | DPFedAvg, ...] | None = None,
        secure_aggregation: SecureAggregation | None = None,
        evaluation: Federation | bool = True,
        initial_weights: list[np.ndarray] | None = None,
    ) -> DeepModelResults:
        """Train on ``federation``; evaluate on it (or on ``evaluation``, e.g. the sites' test
        sets; ``False`` skips evaluation). ``initial_weights`` (float arrays in ``state_dict``
        order) replace the seeded initialisation.

        ``privacy``: :class:`~fedstats.RecordDP` (DP-SGD at every site, charged to each
        site's ledger), :class:`~fedstats.models.client_dp.DPFedAvg` (client-level DP-FedAvg at the
        coordinator, charged to ``federation.ledger``), or one of each in a tuple.
        """
        record, client = privacy_levels(
            privacy,
            DPFedAvg,
            "fedstats.RecordDP(...) (DP-SGD at every site), fedstats.DPFedAvg(...) "
            "(client-level DP at the coordinator), or one of each in a tuple",
        )
        self._check_options(record, client, secure_aggregation, federation)
        if client is not None:  # before any message: the whole training must fit the budget
            client_dp.preview_training(federation, client, self.rounds)
        started = datetime.now(UTC)
        analysis = federation.new_analysis("deep")
        rng = np.random.default_rng(self.seed)
        bounds = {**self.bounds, **(dict(record.bounds) if record else {})}
        schedule: DpSgdSchedule | None = None
        if record is not None and self.sample_rate is not None:
            schedule = self._schedule(record, self.sample_rate)
            preview_site_budgets(federation, schedule.planned_event(), analysis, what="training")
        counts_dp = None
        if record is not None:
            counts_dp = DpRequest(
                {"n_obs": COUNTS_NOISE_MULTIPLIER}, federation.study, analysis, "counts"
            )
        agreement = agree_design(
            federation,
            self.formula,
            analysis=analysis,
            levels=self.levels,
            missing=self.missing,
            dp=counts_dp,
            outcome_kind=self.kind,
        )
        n_obs = dict(agreement.counts.n_obs)
        if record is not None and schedule is None:
            schedule = self._schedule(record, default_sample_rate(self.batch_size, n_obs))
            training_only = schedule.planned_event()  # counts are in the ledgers already
            preview_site_budgets(federation, training_only.events[1], analysis, what="training")
        spec = agreement.spec
        scaling = feature_scaling(agreement.layout, spec.columns, bounds, federation.sites)
        columns = tuple(input_columns(spec))
        init_seed = int(rng.integers(2**31))
        torch.manual_seed(init_seed)
        network = build_model(self.model, len(columns), self.hyper)
        shapes = parameter_arrays(network)
        if initial_weights is not None:
            try:
                shapes = checked_arrays(list(initial_weights), network, "initial_weights")
            except ModelSpecError as error:
                raise StudyConfigurationError(str(error)) from None
        global_weights = flatten(shapes)
        n_params = global_weights.size
        control = np.zeros_like(global_weights) if self.algorithm == "scaffold" else None
        server = ServerOptimizer(*self.server)
        history: list[dict[str, Any]] = []
        last_public: dict[str, dict[str, Any]] = {}
        dp_steps = dict.fromkeys(federation.sites, 0)
        sessions: list[SecureSum] = []
        participation = dict.fromkeys(federation.sites, 0)
        noise_rng = federation.noise_rng() if client is not None else None
        clip = client.clip if client is not None else math.nan
        base = self._base_args(spec.to_wire(), scaling, analysis, schedule, federation.study)
        bar = tqdm(range(1, self.rounds + 1), desc="rounds", disable=not self.progress)
        for round_no in bar:
            tick = time.perf_counter()
            sampled = sample_sites(federation.sites, self.sample_rate_sites, rng)
            if not sampled and client is None:
                history.append({"round": round_no, "sites": 0, "train_loss": math.nan,
                                "update_norm": 0.0, "seconds": 0.0})  # fmt: skip
                continue
            row: dict[str, Any] = {"round": round_no}
            weights = client_weights(n_obs, sampled, self.sample_rate_sites) if sampled else {}
            args = {
                **base,
                "weights": unflatten(global_weights, shapes),
                "seed": None if schedule else round_seed(self.seed, round_no),
            }
            if schedule is not None:
                args["dp"] = DpRequest(
                    {DP_GROUP: schedule.noise_multiplier},
                    federation.study,
                    analysis,
                    f"DP-SGD round {round_no}",
                ).to_args()
            if control is not None:
                args["control"] = control
            part = federation if len(sampled) == len(federation.sites) else (
                federation.subset(sampled) if sampled else None
            )  # fmt: skip
            if secure_aggregation is not None:
                args["scale"] = weights
                args["control_scale"] = 1.0 / len(federation.sites)
                summed = secure_sum(
                    part, TRAIN_TASK, args, analysis=analysis, options=secure_aggregation
                )
                sessions.append(summed)
                contributed = list(summed.survivors)
                aggregate = np.asarray(summed.total["update"], dtype=np.float64)
                control_step = summed.total.get("control_update")
                loss = summed.total.get("train_loss", math.nan)
                loss = loss / sum(weights[s] for s in contributed) if schedule is None else loss
                last_public.update(summed.public)
            else:
                replies = {} if part is None else part.request(TRAIN_TASK, args, analysis=analysis)
                contributed = list(replies)
                updates = self._received_updates(replies, n_params, row)
                if client is not None:
                    # charged before the noisy aggregate exists, let alone moves the model
                    released = client.aggregate(
                        federation, updates, clip, noise_rng, dimension=n_params,
                        analysis=analysis, task=TRAIN_TASK, round_no=round_no,
                    )  # fmt: skip
                    aggregate = released.update
                    row["clip"] = clip
                    if client.adaptive:
                        row["unclipped_fraction"] = released.clipped_fraction
                    clip = released.next_clip
                else:
                    aggregate = self.aggregator(updates, [weights[s] for s in contributed])
                control_step = (
                    None
                    if control is None
                    else sum(replies[s]["control_update"] for s in contributed)
                    / len(federation.sites)
                )
                loss = (
                    math.nan
                    if schedule is not None or client is not None
                    else sum(weights[s] * replies[s]["train_loss"] for s in contributed)
                    / sum(weights[s] for s in contributed)
                )
                last_public.update(replies)
                for site in contributed:
                    dp_steps[site] += int(replies[site].get("dp_steps", 0))
            for site in contributed:
                participation[site] += 1
            global_weights = server.step(global_weights, aggregate)
            if control is not None and control_step is not None:
                control = (control + np.asarray(control_step, dtype=np.float64)).astype(np.float32)
            history.append(
                {
                    **row,
                    "sites": len(contributed),
                    "train_loss": float(loss),
                    "update_norm": float(np.linalg.norm(aggregate)),
                    "seconds": time.perf_counter() - tick,
                }
            )
            if self.progress and math.isfinite(loss):
                bar.set_postfix(loss=f"{loss:.4f}")
        final = unflatten(global_weights, shapes)
        evaluated = None
        if evaluation is not False:
            target = federation if evaluation is True else evaluation
            evaluated = self.evaluate(target, final, spec_wire=spec.to_wire(), scaling=scaling,
                                      analysis=analysis)  # fmt: skip
        scopes = []
        if schedule is not None:
            scopes += _site_scopes(federation, record, schedule, participation, last_public)
        if client is not None:
            scopes.append(
                coordinator_spending(
                    federation,
                    client_dp.planned_training(client, self.rounds),
                    (client.noise_multiplier,),
                    self.rounds,
                )
            )
        account = PrivacyAccount(tuple(scopes), self.rounds, None) if scopes else None
        if account is not None and secure_aggregation is not None:
            account = account.with_secure_aggregation(
                secure_record(secure_aggregation, len(federation.sites), sessions)
            )
        notes = self._notes(agreement, schedule, client, secure_aggregation, account, federation)
        return DeepModelResults(
            model=self.model,
            hyper=dict(self.hyper),
            columns=columns,
            scaling=scaling,
            weights=final,
            algorithm=self.algorithm,
            history=pd.DataFrame(history),
            evaluation=evaluated,
            provenance=Provenance.of_fit(
                federation, analysis, agreement.counts, self.rounds, started
            ),
            privacy=account,
            notes=notes,
            dp_schedule=schedule,
            design=spec,
            dp_steps=dp_steps if schedule is not None and secure_aggregation is None else None,
        )

    def evaluate(
        self,
        federation: Federation,
        weights: list[np.ndarray],
        *,
        spec_wire: dict | None = None,
        scaling: np.ndarray | None = None,
        analysis: str | None = None,
    ) -> Evaluation:
        """Per-site and pooled performance of ``weights`` on ``federation``'s rows.

        Without ``spec_wire``/``scaling`` the design is agreed with these sites
        first (the same formula, levels and bounds).
        """
        analysis = analysis or federation.new_analysis("deep-evaluate")
        if spec_wire is None or scaling is None:
            agreement = agree_design(federation, self.formula, analysis=analysis,
                                     levels=self.levels, missing=self.missing,
                                     outcome_kind=self.kind)  # fmt: skip
            spec_wire = agreement.spec.to_wire()
            scaling = feature_scaling(
                agreement.layout, agreement.spec.columns, self.bounds, federation.sites
            )
        replies = federation.request(
            EVALUATE_TASK,
            {"design": spec_wire, "scaling": scaling, "model": self.model,
             "hyper": dict(self.hyper), "weights": list(weights)},
            analysis=analysis,
        )  # fmt: skip
        table = combine_binary(replies) if self.kind == BINARY else combine_survival(replies)
        return Evaluation(table=table, kind=self.kind)

    # ------------------------------------------------------------ internals

    def _check_options(
        self,
        record: RecordDP | None,
        client: DPFedAvg | None,
        secure: SecureAggregation | None,
        federation: Federation,
    ) -> None:
        if record is not None:
            if record.row_norm is not None:
                raise StudyConfigurationError(
                    "RecordDP.row_norm bounds design rows of Newton fits; DP-SGD clips each "
                    "patient's gradient instead: set max_grad_norm on the trainer"
                )
            if self.kind == SURVIVAL:
                raise StudyConfigurationError(
                    "record-level DP-SGD needs a loss that is a sum over patients; the Cox "
                    "partial likelihood couples patients through risk sets, so survival "
                    "networks train without record-level DP"
                )
        if secure is not None and (self.aggregator is not weighted_sum or client is not None):
            raise StudyConfigurationError(
                "secure aggregation shows the coordinator only the weighted sum of updates; "
                "a custom aggregator or client-level DP-FedAvg needs each update"
            )
        if secure is not None and self.quantize_bits is not None:
            raise StudyConfigurationError(
                "quantised updates cannot be summed by secure aggregation, which masks exact "
                "fixed-point values: set quantize_bits=None or drop secure_aggregation"
            )
        if client is not None:
            _check_client(self, client, federation)

    def _schedule(self, privacy: RecordDP, sample_rate: float) -> DpSgdSchedule:
        steps = self.local_steps or steps_for_epochs(self.local_epochs, sample_rate)
        sigma = privacy.noise_multiplier or calibrate_noise(
            privacy.epsilon, privacy.delta, sample_rate, steps * self.rounds
        )
        return DpSgdSchedule(
            sample_rate=sample_rate,
            noise_multiplier=sigma,
            max_grad_norm=self.max_grad_norm,
            local_steps=steps,
            rounds=self.rounds,
            delta=privacy.delta,
            engine=self.engine,
        )

    def _base_args(
        self,
        design: dict,
        scaling: np.ndarray,
        analysis: str,
        schedule: DpSgdSchedule | None,
        study: str,
    ) -> dict[str, Any]:
        args: dict[str, Any] = {
            "design": design,
            "scaling": scaling,
            "model": self.model,
            "hyper": dict(self.hyper),
            "algorithm": self.algorithm,
            "lr": self.lr,
            "batch_size": self.batch_size,
            "mu": self.mu,
            "analysis": f"{study}/{analysis}",
        }
        if self.quantize_bits is not None:
            args["quantize_bits"] = self.quantize_bits
        if schedule is not None:
            args["local_steps"] = schedule.local_steps
            args["dp_sgd"] = schedule.round_plan().to_args()
        elif self.local_steps is not None:
            args["local_steps"] = self.local_steps
        else:
            args["local_epochs"] = self.local_epochs
        return args

    def _received_updates(
        self, replies: Mapping[str, Mapping[str, Any]], n_params: int, row: dict[str, Any]
    ) -> list[np.ndarray]:
        """The sites' flat updates (quantised ones decoded); records the bytes they took in
        ``row`` (``update_bytes``) beside the bytes of float32 updates
        (``update_bytes_unquantized``)."""
        updates, sent = [], 0
        for site, reply in replies.items():
            if self.quantize_bits is None:
                updates.append(np.asarray(reply["update"], dtype=np.float64))
                sent += int(reply["update"].nbytes)
            else:
                received = _quantized_update(site, reply, self.quantize_bits, n_params)
                updates.append(dequantize(received))
                sent += received.nbytes
        row["update_bytes"] = sent
        row["update_bytes_unquantized"] = len(replies) * n_params * FLOAT32_BYTES
        return updates

    def _notes(
        self,
        agreement: Agreement,
        schedule: DpSgdSchedule | None,
        client: DPFedAvg | None,
        secure: SecureAggregation | None,
        account: PrivacyAccount | None,
        federation: Federation,
    ) -> list[str]:
        notes = [
            f"{self.algorithm} over {self.rounds} rounds; local SGD lr {self.lr}; "
            + (f"{self.local_steps} local steps" if self.local_steps else
               f"{self.local_epochs} local epoch(s)")
            + (f"; server optimiser {self.server[0]} (lr {self.server[1]})"
               if self.server[0] else "")
        ]  # fmt: skip
        dropped = agreement.counts.dropped_note()
        if dropped:
            notes.append(dropped)
        if self.seed is not None:
            notes.append(
                f"FIXED SEED {self.seed}: initial weights, site sampling"
                + (" and the sites' batch order" if schedule is None else "")
                + " are reproducible; privacy noise is not drawn from it"
            )
        if schedule is not None:
            notes.append(
                f"record-level DP-SGD at every site: Poisson sampling q={schedule.sample_rate:.4g}"
                f", clipping norm {schedule.max_grad_norm:g}, noise multiplier "
                f"{schedule.noise_multiplier:.4g}, {schedule.local_steps} steps per round; "
                "counts and FedAvg weights are noisy"
            )
        if client is not None:
            notes.append(_client_note(client, len(federation.sites)))
        if self.quantize_bits is not None:
            notes.append(
                f"the sites sent their updates stochastically rounded to {self.quantize_bits} "
                "bits per entry (unbiased), bit-packed with one float64 scale"
            )
        if account is not None:
            notes += account.notes()
        elif secure is not None:
            notes.append("secure aggregation: the coordinator saw only the sums of the updates")
        return notes


def _site_scopes(
    federation: Federation,
    privacy: RecordDP,
    schedule: DpSgdSchedule,
    participation: dict[str, int],
    public: dict[str, dict[str, Any]],
) -> list[ScopeSpending]:
    return [
        site_spending(
            site,
            schedule.planned_event(participation[site]),
            privacy.delta,
            public.get(site, {}),
            (COUNTS_NOISE_MULTIPLIER, schedule.noise_multiplier),
            1 + schedule.local_steps * participation[site],
        )
        for site in federation.sites
    ]


def _check_client(trainer: FederatedTrainer, client: DPFedAvg, federation: Federation) -> None:
    """DP-FedAvg's sampling and denominator must be the trainer's and the federation's."""
    if trainer.aggregator is not weighted_sum:
        raise StudyConfigurationError(
            "client-level DP-FedAvg is itself the aggregation rule (clip, sum, noise, divide "
            "by m); drop the custom aggregator"
        )
    if trainer.algorithm == "scaffold":
        raise StudyConfigurationError(
            "SCAFFOLD's control variates would leave the coordinator without client-level "
            "noise; use fedavg or fedprox with DP-FedAvg"
        )
    if not math.isclose(client.sample_rate, trainer.sample_rate_sites, rel_tol=1e-12):
        raise StudyConfigurationError(
            f"DPFedAvg.sample_rate ({client.sample_rate:g}) is the site sampling its privacy "
            f"amplification assumes; the trainer samples sites at sample_rate_sites="
            f"{trainer.sample_rate_sites:g}. Make them equal."
        )
    expected = client.sample_rate * len(federation.sites)
    if not math.isclose(client.expected_sites, expected, rel_tol=1e-9):
        raise StudyConfigurationError(
            f"DPFedAvg.expected_sites ({client.expected_sites:g}) must be q n = "
            f"{client.sample_rate:g} x {len(federation.sites)} sites = {expected:g}; build it "
            f"with DPFedAvg.for_budget(..., sites={len(federation.sites)}, "
            f"sample_rate={client.sample_rate:g})"
        )


def _client_note(client: DPFedAvg, n_sites: int) -> str:
    """What DP-FedAvg did, and how little one site is hidden among few."""
    m, z_u = client.expected_sites, client.update_noise_multiplier()
    clipping = (
        f"clip adapted from {client.clip:g} towards the {client.target_quantile:g} quantile of "
        "update norms"
        if client.adaptive
        else f"clip {client.clip:g}"
    )
    return (
        f"client-level DP-FedAvg at the coordinator: site updates clipped in L2 norm ({clipping}),"
        f" summed, Gaussian noise of {z_u:.3g} x clip added, divided by m = {m:g} expected "
        f"sites (site sampling rate {client.sample_rate:g}); one site moves a round's update by "
        f"at most clip/m and the noise per coordinate has {z_u:.3g} times that standard "
        f"deviation. With {n_sites} sites, hiding one hospital needs noise of the order of the "
        "updates themselves. The training loss is not released; the design agreement's "
        "counts and the evaluation are not covered by this guarantee"
    )


def _quantized_update(site: str, reply: Mapping[str, Any], bits: int, n_params: int) -> Quantized:
    """A site's quantised update as sent, checked (the reply schema fixed its shape)."""
    packed = reply["update_packed"]
    try:
        if packed.dtype != np.uint8:
            raise ValueError(f"codes of dtype {packed.dtype}, not uint8")
        return Quantized.from_wire(
            {"packed": packed, "scale": reply["update_scale"], "bits": bits, "length": n_params}
        )
    except ValueError as error:
        raise InvalidReplyError(f"site {site!r}, task {TRAIN_TASK!r}: {error}") from None


def round_seed(seed: int | None, round_no: int) -> int | None:
    """The sites' batch-order seed in round ``round_no`` (non-private training):
    ``SeedSequence([seed, round_no])``'s first word, or ``None`` (OS entropy) without a seed."""
    if seed is None:
        return None
    return int(np.random.SeedSequence([seed, round_no]).generate_state(1)[0])


def _finite(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
