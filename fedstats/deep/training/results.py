"""What a federated deep-model fit returns: weights, history, evaluation, provenance, privacy."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import torch

from fedstats.contract.design import DesignSpec
from fedstats.deep.shared.models import build_model
from fedstats.deep.shared.weights import load_arrays
from fedstats.deep.training.privacy_plan import DpSgdSchedule
from fedstats.models.classifier_scores import Evaluation
from fedstats.models.privacy import PrivacyAccount
from fedstats.models.results import Provenance


@dataclass(frozen=True)
class DeepModelResults:
    """A trained federated network and how it was obtained.

    ``weights`` are the final parameters (float32 arrays in ``state_dict``
    order); :meth:`module` rebuilds the ``torch`` module from the registry.
    ``history`` has one row per round (sites that took part, weighted mean
    training loss — not released under record- or client-level DP — update
    norm, seconds; the bytes of the sites' updates as sent, ``update_bytes``,
    and as float32, ``update_bytes_unquantized``; under client-level DP the
    round's clip bound ``clip`` and, adapting it, the noisy fraction of
    updates within it, ``unclipped_fraction``). ``evaluation`` holds
    per-site and pooled metrics.
    """

    model: str
    hyper: dict[str, Any]
    columns: tuple[str, ...]
    scaling: np.ndarray
    weights: list[np.ndarray]
    algorithm: str
    history: pd.DataFrame
    evaluation: Evaluation | None
    provenance: Provenance
    privacy: PrivacyAccount | None
    notes: list[str] = field(default_factory=list)
    dp_schedule: DpSgdSchedule | None = None
    """Under record-level DP: sampling rate, noise multiplier, clipping norm, steps per round."""
    design: DesignSpec | None = None
    """The design the sites agreed on (formula, levels, columns): what builds the network's
    inputs from a record."""
    dp_steps: dict[str, int] | None = None
    """Under record-level DP (without secure aggregation): the DP-SGD steps each site's Opacus
    accountant counted over the fit, as the sites reported them."""

    def module(self) -> torch.nn.Module:
        """The trained network (inputs: the design columns scaled by the public bounds)."""
        network = build_model(self.model, len(self.columns), self.hyper)
        load_arrays(network, self.weights)
        network.eval()
        return network

    @property
    def state_dict(self) -> dict[str, torch.Tensor]:
        return self.module().state_dict()

    def summary(self) -> str:
        lines = [
            f"Federated {self.algorithm} training of {self.model!r} {self.hyper}",
            f"sites: {', '.join(self.provenance.sites)}; rounds: {self.provenance.rounds}; "
            f"messages: {self.provenance.messages}; reply bytes: {self.provenance.reply_bytes}",
        ]
        if self.evaluation is not None:
            lines += ["", self.evaluation.table.to_string(float_format=lambda v: f"{v:.4f}")]
        lines += ["", *self.notes]
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.summary()

    def _repr_html_(self) -> str:
        head = (
            f"<p><b>Federated {self.algorithm}</b> training of <code>{self.model}</code> "
            f"({self.provenance.rounds} rounds, sites {', '.join(self.provenance.sites)})</p>"
        )
        table = "" if self.evaluation is None else self.evaluation._repr_html_()
        notes = "".join(f"<li>{n}</li>" for n in self.notes)
        return f"{head}{table}<ul>{notes}</ul>"
