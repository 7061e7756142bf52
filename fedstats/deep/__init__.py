"""Federated deep models with record-level DP-SGD.

* :class:`FederatedTrainer` — FedAvg, FedProx or SCAFFOLD training of a
  registered ``torch`` network on the sites' agreed design, with FedAdam /
  FedYogi server steps, client sampling, secure aggregation and
  record-level DP-SGD at every site (Opacus, accounted by ``dp_accounting``).
* :func:`register_model` — the model registry shared by sites and coordinator.
"""

from fedstats.deep.aggregation import Aggregator, ClientPrivacy, weighted_sum
from fedstats.deep.evaluation import Evaluation
from fedstats.deep.losses import binary_loss, cox_loss
from fedstats.deep.models import ModelSpecError, build_model, register_model, registered_models
from fedstats.deep.results import DeepModelResults
from fedstats.deep.trainer import FederatedTrainer

__all__ = [
    "Aggregator",
    "ClientPrivacy",
    "DeepModelResults",
    "Evaluation",
    "FederatedTrainer",
    "ModelSpecError",
    "binary_loss",
    "build_model",
    "cox_loss",
    "register_model",
    "registered_models",
    "weighted_sum",
]
