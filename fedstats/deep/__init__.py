"""Federated deep models with record-level DP-SGD.

* :class:`FederatedTrainer` — FedAvg, FedProx or SCAFFOLD training of a
  registered ``torch`` network on the sites' agreed design, with FedAdam /
  FedYogi server steps, client sampling, secure aggregation and
  record-level DP-SGD at every site (Opacus, accounted by ``dp_accounting``),
  client-level DP-FedAvg at the coordinator (:class:`DPFedAvg`, fixed or
  adaptive clipping), robust aggregation and quantised updates.
* :func:`audit_with_control` — a one-run canary audit of the training
  (Steinke, Nasr & Jagielski, NeurIPS 2023) beside a non-private control.
* :func:`register_model` — the model registry shared by sites and coordinator.

Needs the ``deep`` extra: ``pip install 'fedstats[deep]'`` (torch and Opacus).
"""

try:
    import opacus  # noqa: F401
    import torch  # noqa: F401
except ModuleNotFoundError as missing:
    raise ModuleNotFoundError(
        f"fedstats.deep needs the 'deep' extra ({missing.name} is not installed): "
        "pip install 'fedstats[deep]'. Logistic, Cox and Kaplan-Meier models need no extra.",
        name=missing.name,
    ) from missing

from fedstats.deep.canary_audit import (
    AuditReport,
    CanaryRun,
    audit_training,
    audit_with_control,
    draw_canaries,
)
from fedstats.deep.shared.losses import binary_loss, cox_loss
from fedstats.deep.shared.models import build_model, register_model, registered_models
from fedstats.deep.training.aggregation import Aggregator, weighted_sum
from fedstats.deep.training.results import DeepModelResults
from fedstats.deep.training.trainer import FederatedTrainer
from fedstats.errors import ModelSpecError
from fedstats.models.classifier_scores import Evaluation
from fedstats.models.client_dp import DPFedAvg

__all__ = [
    "Aggregator",
    "AuditReport",
    "CanaryRun",
    "DPFedAvg",
    "DeepModelResults",
    "Evaluation",
    "FederatedTrainer",
    "ModelSpecError",
    "audit_training",
    "audit_with_control",
    "binary_loss",
    "build_model",
    "cox_loss",
    "draw_canaries",
    "register_model",
    "registered_models",
    "weighted_sum",
]
