"""Training losses: binary cross-entropy with logits and the Cox partial likelihood.

* Binary outcome: ``l_i = -[y_i log sigmoid(f_i) + (1 - y_i) log(1 - sigmoid(f_i))]``
  (``torch.nn.functional.binary_cross_entropy_with_logits``), separable over
  patients, so per-patient gradient clipping bounds one patient's influence.
* Time-to-event: the negative Cox log partial likelihood with Breslow's
  handling of ties, over the patients of a batch,

  ``L = -(1 / d) sum_{i: event} [ f_i - log sum_{j: t_j >= t_i} exp(f_j) ]``,

  ``d`` the number of events; a network's output ``f`` replaces the linear
  predictor (Faraggi & Simon, Stat Med 1995; DeepSurv, Katzman et al., BMC
  Med Res Methodol 2018). The risk sets couple patients, so the loss is not a
  sum of per-patient terms and DP-SGD's per-patient clipping does not bound
  a patient's influence: survival models train without record-level DP.
"""

from __future__ import annotations

import torch
from torch.nn import functional as F

BINARY = "binary"
SURVIVAL = "survival"


def binary_loss(scores: torch.Tensor, y: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    """Binary cross-entropy of logits ``scores`` (shape ``(n,)``) against 0/1 ``y``."""
    return F.binary_cross_entropy_with_logits(scores, y, reduction=reduction)


def cox_loss(scores: torch.Tensor, time: torch.Tensor, event: torch.Tensor) -> torch.Tensor:
    """Negative Breslow log partial likelihood per event (0 when the batch has no event).

    Patients are sorted by decreasing time; ``logcumsumexp`` then gives each
    one ``log sum_{j before} exp(f_j)``, and every member of a group of tied
    times takes the group's last value, so its risk set holds all ``t_j >= t_i``.
    """
    order = torch.argsort(time, descending=True, stable=True)
    f, t, e = scores[order], time[order], event[order]
    running = torch.logcumsumexp(f, dim=0)
    _, counts = torch.unique_consecutive(t, return_counts=True)
    ends = torch.cumsum(counts, dim=0) - 1
    log_risk = torch.repeat_interleave(running[ends], counts)
    events = e.sum()
    total = -(e * (f - log_risk)).sum()
    return total / torch.clamp(events, min=1.0)
