"""The coordinator's federated training loop for a registered network.

Each round: sample sites (each with probability ``p``), send them the
global weights with ``deep.train``, combine their flat updates with weights
``n_k / (N p)`` (:mod:`fedstats.deep.training.aggregation`) — in the clear through an
:data:`~fedstats.deep.training.aggregation.Aggregator`, or by secure aggregation, in
which each site scales its own update and the coordinator learns only the
sum — and take the server step (:mod:`fedstats.deep.training.server_optimizers`).
SCAFFOLD's server control variate moves by ``sum_{k in S} Delta c_k / N_sites``
(Karimireddy et al., ICML 2020, Alg. 1). After the last round every site of
the evaluation federation scores the model (``deep.evaluate``).

Record-level privacy (:class:`~fedstats.models.privacy.RecordDP`): every site runs
DP-SGD (:mod:`fedstats.deep.site.dp_sgd`) and charges its own ledger before each
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
stochastically to ``b`` bits per entry (unbiased; :mod:`fedstats.contract.quantize`)
and sends the bit-packed codes and the scale, ``ceil(d b / 8) + 8`` bytes
instead of ``4 d`` for float32; the coordinator decodes them. The history
reports the update bytes of every round with and without quantisation.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm

from fedstats.contract.aggregation import RULE_KEY
from fedstats.contract.aggregation import to_wire as aggregation_wire
from fedstats.contract.design import (
    DesignSpec,
    Level,
    feature_scaling,
    parse_formula,
    survival_outcome,
)
from fedstats.contract.dp_request import DpRequest
from fedstats.contract.path_rules import TRAINING_KEY
from fedstats.contract.paths import CLIENT_LEVEL_KEY, PATH_KEY, POINT_ARGUMENTS, PathRequest
from fedstats.deep.shared.losses import BINARY, SURVIVAL
from fedstats.deep.shared.models import build_model
from fedstats.deep.shared.weights import checked_arrays, flatten, parameter_arrays, unflatten
from fedstats.deep.shared.wire import DP_GROUP, EVALUATE_TASK, TRAIN_TASK, input_columns
from fedstats.deep.training.aggregation import (
    Aggregator,
    client_weights,
    sample_sites,
    weighted_sum,
)
from fedstats.deep.training.privacy_plan import (
    COUNTS_NOISE_MULTIPLIER,
    DpSgdSchedule,
    calibrate_noise,
    default_sample_rate,
    steps_for_epochs,
)
from fedstats.deep.training.results import DeepModelResults
from fedstats.deep.training.rounds import (
    RoundOutcome,
    TrainingState,
    received_updates,
    round_seed,
    secure_round,
    secure_train_args,
    train_arguments,
)
from fedstats.deep.training.server_optimizers import ServerOptimizer
from fedstats.deep.training.training_options import DpSgdOptions, LocalWork, RoundPlan
from fedstats.errors import ModelSpecError, StudyConfigurationError
from fedstats.models import client_dp
from fedstats.models.agree import Agreement, agree_design
from fedstats.models.classifier_scores import Evaluation, combine_binary, combine_survival
from fedstats.models.client_dp import DPFedAvg
from fedstats.models.federation import Federation
from fedstats.models.path_relay import PathRelay
from fedstats.models.privacy import (
    PrivacyAccount,
    RecordDP,
    ScopeSpending,
    coordinator_spending,
    preview_site_budgets,
    privacy_levels,
    site_spending,
)
from fedstats.models.results import Provenance
from fedstats.models.secure_aggregation import SecureAggregation, secure_record


@dataclass(frozen=True)
class _Run:
    """What one fit fixes before its first round: the federation and analysis label,
    the agreed design, DP-SGD's schedule, the input scaling and the privacy options."""

    federation: Federation
    analysis: str
    agreement: Agreement
    schedule: DpSgdSchedule | None
    scaling: np.ndarray
    client: DPFedAvg | None
    secure: SecureAggregation | None

    @property
    def spec(self) -> DesignSpec:
        return self.agreement.spec

    @property
    def columns(self) -> tuple[str, ...]:
        return tuple(input_columns(self.agreement.spec))


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
        (:mod:`fedstats.deep.site.dp_sgd`).
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

    The options are kept as three checked values: :attr:`local`
    (:class:`~fedstats.deep.training.training_options.LocalWork`), :attr:`dp_sgd`
    (:class:`~fedstats.deep.training.training_options.DpSgdOptions`) and :attr:`plan`
    (:class:`~fedstats.deep.training.training_options.RoundPlan`).
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
        self.local = LocalWork(algorithm, local_epochs, local_steps, lr, batch_size, mu)
        self.plan = RoundPlan.of(
            rounds, sample_rate_sites, quantize_bits, server_optimizer, server_lr
        )
        ServerOptimizer(self.plan.server_optimizer, self.plan.server_lr)  # checks them now
        self.dp_sgd = DpSgdOptions(max_grad_norm, sample_rate, engine)
        self.model = model
        self.hyper = dict(hyper or {})
        self.formula = formula
        self.bounds = dict(bounds)
        self.levels = levels
        self.kind = SURVIVAL if survival_outcome(parse_formula(formula).outcome) else BINARY
        self.missing = missing
        self.aggregator = aggregator or weighted_sum
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
        init_seed: int | None = None,
    ) -> DeepModelResults:
        """Train on ``federation``; evaluate on it (or on ``evaluation``, e.g. the sites' test
        sets; ``False`` skips evaluation). The initial network is drawn from ``init_seed``
        (``torch.manual_seed(init_seed)``, then the network built; default: a seed drawn from
        the trainer's ``seed``), which sites that verify paths rebuild and check;
        ``initial_weights`` (float arrays in ``state_dict`` order) replace it, and such sites
        refuse them (a global model the coordinator chose is what they guard against).
        Sites that verify paths evaluate only the network a training they re-derived ended
        at (every round exact or record-level DP-SGD, in the clear, of every site, combined by
        a rule of the contract); held-out sites check it when they pin the training sites'
        keys (``Federation.in_process(..., keys_of=training)``). A training they cannot
        re-derive (client-level private, sampled, secure, or with a rule of the coordinator's
        own) is not evaluated by default, and its notes say so.

        ``privacy``: :class:`~fedstats.RecordDP` (DP-SGD at every site, charged to each
        site's ledger), :class:`~fedstats.models.client_dp.DPFedAvg` (client-level DP-FedAvg at the
        coordinator, charged to ``federation.ledger``), or one of each in a tuple.

        The steps: check the options against each other; preview the whole
        training against the budgets; agree the design (:meth:`_agree`); start
        the model (:meth:`_start`); run the rounds (:meth:`_round`); evaluate;
        account the privacy spent (:meth:`_account`).
        """
        record, client = privacy_levels(
            privacy,
            DPFedAvg,
            "fedstats.RecordDP(...) (DP-SGD at every site), fedstats.DPFedAvg(...) "
            "(client-level DP at the coordinator), or one of each in a tuple",
        )
        self._check_options(record, client, secure_aggregation, federation)
        if client is not None:  # before any message: the whole training must fit the budget
            client_dp.preview_training(federation, client, self.plan.rounds)
        started = datetime.now(UTC)
        run = self._agree(federation, record, client, secure_aggregation)
        rng = np.random.default_rng(self.seed)
        state = self._start(run, rng, initial_weights, init_seed)
        bar = tqdm(range(1, self.plan.rounds + 1), desc="rounds", disable=not self.progress)
        base = self._base_args(run)  # the same in every round
        if state.init_seed is not None:
            base["init_seed"] = state.init_seed
        # rounds of every site, exact or DP-SGD in the clear, lie on a path the sites
        # re-derive (contract.paths)
        path = PathRelay(
            federation,
            enabled=run.client is None
            and (run.schedule is None or run.secure is None)
            and self.plan.sample_rate_sites >= 1
            and (self.aggregator is weighted_sum or RULE_KEY in base)
            and (run.secure is None or self.aggregator is weighted_sum),
        )
        for round_no in bar:
            loss = self._round(run, state, round_no, rng, base, path)
            if self.progress and math.isfinite(loss):
                bar.set_postfix(loss=f"{loss:.4f}")
        final = unflatten(state.weights, state.shapes)
        evaluated = None
        # a secure training's last round is masked: sites re-derive its rounds, but evaluate
        # only a network whose last round they can read in the clear
        unverifiable = (
            evaluation is True
            and (not path.enabled or run.secure is not None)
            and bool(federation.path_sites)
        )
        if evaluation is not False and not unverifiable:
            target = federation if evaluation is True else evaluation
            evidence = None
            if path.enabled and path.last is not None and run.secure is None:
                # the sites re-derive the final network from the last round's signed replies
                evidence = {
                    **PathRequest(path.sites, path.round + 1, None,
                                  previous=path.last).to_wire(),
                    TRAINING_KEY: {k: v for k, v in state.last_args.items()
                                   if k not in POINT_ARGUMENTS},
                }  # fmt: skip
            evaluated = self.evaluate(target, final, spec_wire=run.spec.to_wire(),
                                      scaling=run.scaling, analysis=run.analysis,
                                      path=evidence)  # fmt: skip
        account = self._account(run, record, state)
        return DeepModelResults(
            model=self.model,
            hyper=dict(self.hyper),
            columns=run.columns,
            scaling=run.scaling,
            weights=final,
            algorithm=self.local.algorithm,
            history=pd.DataFrame(state.history),
            evaluation=evaluated,
            provenance=Provenance.of_fit(
                federation, run.analysis, run.agreement.counts, self.plan.rounds, started
            ),
            privacy=account,
            notes=self._notes(run, account)
            + (
                [
                    "not evaluated: sites that verify paths evaluate only a network a training "
                    "they re-derived ended at in the clear (this one's rounds were client-level "
                    "private, sampled, masked by secure aggregation or combined by a rule of the "
                    "coordinator's own); pass evaluation= sites that do not verify paths to "
                    "evaluate it"
                ]
                if unverifiable
                else []
            ),
            dp_schedule=run.schedule,
            design=run.spec,
            dp_steps=(
                state.dp_steps if run.schedule is not None and secure_aggregation is None else None
            ),
        )

    def _agree(
        self,
        federation: Federation,
        record: RecordDP | None,
        client: DPFedAvg | None,
        secure: SecureAggregation | None,
    ) -> _Run:
        """Agree the design with the sites (noisy counts under record-level DP) and fix
        DP-SGD's schedule, previewing the training against every site's budget before
        the first training message: with a given ``sample_rate`` before the agreement,
        otherwise (the rate needs the median site size) right after it."""
        analysis = federation.new_analysis("deep")
        bounds = {**self.bounds, **(dict(record.bounds) if record else {})}
        schedule: DpSgdSchedule | None = None
        counts_dp = None
        if record is not None:
            counts_dp = DpRequest(
                {"n_obs": COUNTS_NOISE_MULTIPLIER}, federation.study, analysis, "counts"
            )
            if self.dp_sgd.sample_rate is not None:
                schedule = self._schedule(record, self.dp_sgd.sample_rate)
                preview_site_budgets(
                    federation, schedule.planned_event(), analysis, what="training"
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
        if record is not None and schedule is None:
            rate = default_sample_rate(self.local.batch_size, dict(agreement.counts.n_obs))
            schedule = self._schedule(record, rate)
            training_only = schedule.planned_event()  # counts are in the ledgers already
            preview_site_budgets(federation, training_only.events[1], analysis, what="training")
        spec = agreement.spec
        return _Run(
            federation=federation,
            analysis=analysis,
            agreement=agreement,
            schedule=schedule,
            scaling=feature_scaling(agreement.layout, spec.columns, bounds, federation.sites),
            client=client,
            secure=secure,
        )

    def _start(
        self,
        run: _Run,
        rng: np.random.Generator,
        initial_weights: list[np.ndarray] | None,
        init_seed: int | None,
    ) -> TrainingState:
        """The initial global model (drawn from ``init_seed``, by default a seed from ``rng``,
        or ``initial_weights`` checked against the network's shapes) and the empty
        round-to-round state."""
        drawn = int(rng.integers(2**31))  # drawn whatever the start: the rounds' draws follow
        if init_seed is not None and not (type(init_seed) is int and 0 <= init_seed < 2**63):
            raise StudyConfigurationError(f"init_seed must be an integer >= 0, got {init_seed!r}")
        init_seed = drawn if init_seed is None else init_seed
        torch.manual_seed(init_seed)
        network = build_model(self.model, len(run.columns), self.hyper)
        shapes = parameter_arrays(network)
        if initial_weights is not None:
            try:
                shapes = checked_arrays(list(initial_weights), network, "initial_weights")
            except ModelSpecError as error:
                raise StudyConfigurationError(str(error)) from None
        weights = flatten(shapes)
        sites = run.federation.sites
        return TrainingState(
            weights=weights,
            shapes=shapes,
            control=np.zeros_like(weights) if self.local.algorithm == "scaffold" else None,
            server=ServerOptimizer(self.plan.server_optimizer, self.plan.server_lr),
            clip=run.client.clip if run.client is not None else math.nan,
            noise_rng=run.federation.noise_rng() if run.client is not None else None,
            participation=dict.fromkeys(sites, 0),
            dp_steps=dict.fromkeys(sites, 0),
            init_seed=init_seed if initial_weights is None else None,
        )

    def _round(
        self,
        run: _Run,
        state: TrainingState,
        round_no: int,
        rng: np.random.Generator,
        base: Mapping[str, Any],
        path: PathRelay,
    ) -> float:
        """One round: sample sites, send them the global weights, combine their updates
        (securely, or in the clear with the aggregator or DP-FedAvg) and take the server
        step. Returns the round's training loss (``nan`` when it is not released)."""
        tick = time.perf_counter()
        federation = run.federation
        sampled = sample_sites(federation.sites, self.plan.sample_rate_sites, rng)
        if not sampled and run.client is None:
            state.skip(round_no)
            return math.nan
        n_obs = dict(run.agreement.counts.n_obs)
        weights = client_weights(n_obs, sampled, self.plan.sample_rate_sites) if sampled else {}
        args = self._round_args(base, run, state, round_no)
        part = federation if len(sampled) == len(federation.sites) else (
            federation.subset(sampled) if sampled else None
        )  # fmt: skip
        row: dict[str, Any] = {"round": round_no}
        if run.secure is not None:
            # an exact round of every site: each weighs its own update (contract.paths)
            self_weighted = path.enabled and part is federation
            args = secure_train_args(args, weights, n_sites=len(federation.sites),
                                     self_weighted=self_weighted)  # fmt: skip
            if self_weighted:
                point = state.point()
                state.last_args = dict(args)
                args = path.arguments(args, point, point)
            outcome, session = secure_round(
                part, args, weights, analysis=run.analysis, options=run.secure,
                loss_released=run.schedule is None,
            )  # fmt: skip
            if self_weighted:
                path.answered(point, point)
            state.sessions.append(session)
        else:
            outcome = self._clear_round(run, state, part, args, weights, row, path)
        state.advance(row, outcome, time.perf_counter() - tick)
        return outcome.loss

    def _round_args(
        self, base: Mapping[str, Any], run: _Run, state: TrainingState, round_no: int
    ) -> dict[str, Any]:
        """``deep.train``'s arguments in round ``round_no``: the fixed ones, the global
        weights, the batch-order seed (without DP-SGD), the round's DP request and
        SCAFFOLD's control variate."""
        args = {
            **base,
            "weights": unflatten(state.weights, state.shapes),
            "seed": None if run.schedule else round_seed(self.seed, round_no),
            "server_lr": self.plan.server_lr,
            "server_optimizer": self.plan.server_optimizer,
        }
        if run.schedule is not None:
            args["dp"] = DpRequest(
                {DP_GROUP: run.schedule.noise_multiplier},
                run.federation.study,
                run.analysis,
                f"DP-SGD round {round_no}",
            ).to_args()
        if state.control is not None:
            args["control"] = state.control
        return args

    def _clear_round(
        self,
        run: _Run,
        state: TrainingState,
        part: Federation | None,
        args: dict[str, Any],
        weights: Mapping[str, float],
        row: dict[str, Any],
        path: PathRelay,
    ) -> RoundOutcome:
        """A round whose updates the coordinator sees: combined by the aggregator with
        weights ``w_k``, or released by DP-FedAvg (clipped, charged, then noised). An exact
        round of every site relays the last round's signed replies (``path``)."""
        point = state.point()
        state.last_args = dict(args)
        if run.client is not None:
            args = {**args, CLIENT_LEVEL_KEY: True}
        elif path.enabled and part is run.federation:
            args = path.arguments(args, point, point)
        replies = {} if part is None else part.request(TRAIN_TASK, args, analysis=run.analysis)
        if path.enabled and part is run.federation:
            path.answered(point, point)
        contributed = tuple(replies)
        n_params = state.weights.size
        updates = received_updates(replies, n_params, self.plan.quantize_bits, row)
        client = run.client
        if client is not None:
            # charged before the noisy aggregate exists, let alone moves the model
            released = client.aggregate(
                run.federation, updates, state.clip, state.noise_rng,
                dimension=n_params, analysis=run.analysis, task=TRAIN_TASK,
                round_no=row["round"],
            )  # fmt: skip
            aggregate = released.update
            row["clip"] = state.clip
            if client.adaptive:
                row["unclipped_fraction"] = released.clipped_fraction
            state.clip = released.next_clip
        else:
            aggregate = self.aggregator(updates, [weights[s] for s in contributed])
        control_step = None
        if state.control is not None:
            n_sites = len(run.federation.sites)
            control_step = sum(replies[s]["control_update"] for s in contributed) / n_sites
        loss = math.nan
        if run.schedule is None and client is None:
            total = sum(weights[s] for s in contributed)
            loss = sum(weights[s] * replies[s]["train_loss"] for s in contributed) / total
        return RoundOutcome(
            contributed=contributed,
            aggregate=aggregate,
            control_step=control_step,
            loss=loss,
            public=replies,
            dp_steps={s: int(replies[s].get("dp_steps", 0)) for s in contributed},
        )

    def _account(
        self, run: _Run, record: RecordDP | None, state: TrainingState
    ) -> PrivacyAccount | None:
        """Each site's DP-SGD spending (by its participation) and the coordinator's
        DP-FedAvg spending; the secure-aggregation sessions' record beside them."""
        scopes = []
        if run.schedule is not None and record is not None:
            scopes += _site_scopes(
                run.federation, record, run.schedule, state.participation, state.last_public
            )
        if run.client is not None:
            scopes.append(
                coordinator_spending(
                    run.federation,
                    client_dp.planned_training(run.client, self.plan.rounds),
                    (run.client.noise_multiplier,),
                    self.plan.rounds,
                )
            )
        if not scopes:
            return None
        account = PrivacyAccount(tuple(scopes), self.plan.rounds, None)
        if run.secure is not None:
            n_sites = len(run.federation.sites)
            account = account.with_secure_aggregation(
                secure_record(run.secure, n_sites, state.sessions)
            )
        return account

    def evaluate(
        self,
        federation: Federation,
        weights: list[np.ndarray],
        *,
        spec_wire: dict | None = None,
        scaling: np.ndarray | None = None,
        analysis: str | None = None,
        path: dict | None = None,
    ) -> Evaluation:
        """Per-site and pooled performance of ``weights`` on ``federation``'s rows.

        Without ``spec_wire``/``scaling`` the design is agreed with these sites
        first (the same formula, levels and bounds). Sites that verify paths evaluate only
        the network a training of theirs ends at, shown by ``path`` (the training's last
        round, relayed: :meth:`fit` sends it); other weights are refused (rule ``path``).
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
        args = {"design": spec_wire, "scaling": scaling, "model": self.model,
                "hyper": dict(self.hyper), "weights": list(weights)}  # fmt: skip
        if path is not None:
            args[PATH_KEY] = path
        replies = federation.request(EVALUATE_TASK, args, analysis=analysis)
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
        if secure is not None and self.plan.quantize_bits is not None:
            raise StudyConfigurationError(
                "quantised updates cannot be summed by secure aggregation, which masks exact "
                "fixed-point values: set quantize_bits=None or drop secure_aggregation"
            )
        if client is not None:
            _check_client(self, client, federation)

    def _schedule(self, privacy: RecordDP, sample_rate: float) -> DpSgdSchedule:
        local = self.local
        steps = local.local_steps or steps_for_epochs(local.local_epochs, sample_rate)
        rounds = self.plan.rounds
        sigma = privacy.noise_multiplier or calibrate_noise(
            privacy.epsilon, privacy.delta, sample_rate, steps * rounds
        )
        return DpSgdSchedule(
            sample_rate=sample_rate,
            noise_multiplier=sigma,
            max_grad_norm=self.dp_sgd.max_grad_norm,
            local_steps=steps,
            rounds=rounds,
            delta=privacy.delta,
            engine=self.dp_sgd.engine,
        )

    def _base_args(self, run: _Run) -> dict[str, Any]:
        """``deep.train``'s arguments that stay the same in every round; a combination rule of
        the contract other than FedAvg's (:mod:`fedstats.contract.aggregation`) is named, so
        sites that verify paths re-derive each round's network with it."""
        rule = None if self.aggregator is weighted_sum else aggregation_wire(self.aggregator)
        return ({RULE_KEY: rule} if rule is not None else {}) | train_arguments(
            design=run.spec.to_wire(),
            scaling=run.scaling,
            model=self.model,
            hyper=self.hyper,
            local=self.local,
            quantize_bits=self.plan.quantize_bits,
            schedule=run.schedule,
            analysis=f"{run.federation.study}/{run.analysis}",
        )

    def _notes(self, run: _Run, account: PrivacyAccount | None) -> list[str]:
        schedule, client, plan = run.schedule, run.client, self.plan
        notes = [
            f"{self.local.algorithm} over {plan.rounds} rounds; {self.local.describe()}"
            + (f"; server optimiser {plan.server_optimizer} (lr {plan.server_lr})"
               if plan.server_optimizer else "")
        ]  # fmt: skip
        dropped = run.agreement.counts.dropped_note()
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
            notes.append(_client_note(client, len(run.federation.sites)))
        if plan.quantize_bits is not None:
            notes.append(
                f"the sites sent their updates stochastically rounded to {plan.quantize_bits} "
                "bits per entry (unbiased), bit-packed with one float64 scale"
            )
        if account is not None:
            notes += account.notes()
        elif run.secure is not None:
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
    if trainer.local.algorithm == "scaffold":
        raise StudyConfigurationError(
            "SCAFFOLD's control variates would leave the coordinator without client-level "
            "noise; use fedavg or fedprox with DP-FedAvg"
        )
    if not math.isclose(client.sample_rate, trainer.plan.sample_rate_sites, rel_tol=1e-12):
        raise StudyConfigurationError(
            f"DPFedAvg.sample_rate ({client.sample_rate:g}) is the site sampling its privacy "
            f"amplification assumes; the trainer samples sites at sample_rate_sites="
            f"{trainer.plan.sample_rate_sites:g}. Make them equal."
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
