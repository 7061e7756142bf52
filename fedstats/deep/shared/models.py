"""The model registry: architectures by name, the same code at every site and the coordinator.

Code cannot cross the silo boundary (the codec refuses callables), so a
request names its architecture and carries only plain hyperparameters; each
party builds the module from this registry, as a Flower ClientApp ships the
same model code to every SuperNode. A factory is called as
``factory(in_features, **hyper)`` and returns a ``torch.nn.Module`` mapping a
``(batch, in_features)`` float tensor to ``(batch, 1)`` scores: logits for
a binary outcome, log relative hazards for a time-to-event outcome.

Register your own architecture before building the federation, at every
site and at the coordinator::

    fedstats.deep.register_model("tiny", lambda in_features, width=8: nn.Sequential(...))
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import nn

from fedstats.errors import ModelSpecError

ModelFactory = Callable[..., nn.Module]
MAX_PARAMETERS = 5_000_000
"""Largest model a request may describe (a guard against requests that exhaust a site)."""

_REGISTRY: dict[str, ModelFactory] = {}


def register_model(name: str, factory: ModelFactory, *, replace: bool = False) -> None:
    """Register ``factory(in_features, **hyper) -> nn.Module`` under ``name``."""
    if not isinstance(name, str) or not name.strip():
        raise ModelSpecError(f"a model needs a non-empty name, got {name!r}")
    if not callable(factory):
        raise ModelSpecError(f"model {name!r}: the factory must be callable")
    if name in _REGISTRY and not replace:
        raise ModelSpecError(f"model {name!r} is registered already; pass replace=True")
    _REGISTRY[name] = factory


def registered_models() -> list[str]:
    """The names of the registered architectures."""
    return sorted(_REGISTRY)


def build_model(name: str, in_features: int, hyper: Mapping[str, Any]) -> nn.Module:
    """The module registered as ``name``, built with ``hyper``; typed errors for bad input.

    Its size is counted first without allocating it (:func:`count_parameters`), so a
    request for a network beyond ``MAX_PARAMETERS`` is refused before any memory is taken.
    """
    count_parameters(name, in_features, hyper)
    return _built(name, _REGISTRY[name], in_features, hyper)


def count_parameters(name: str, in_features: int, hyper: Mapping[str, Any]) -> int:
    """The parameters the module ``name`` has with ``hyper``, counted without allocating it.

    The factory runs on PyTorch's ``meta`` device, where tensors have shapes and no storage,
    so a request describing a 268M-parameter network costs milliseconds, not 1.4 GB; a
    count outside ``1..MAX_PARAMETERS`` raises :class:`~fedstats.errors.ModelSpecError`.
    """
    factory = _REGISTRY.get(name) if isinstance(name, str) else None
    if factory is None:
        raise ModelSpecError(
            f"no model {name!r} is registered (known: {registered_models()}); register it "
            "with fedstats.deep.register_model at every site and at the coordinator"
        )
    if not isinstance(hyper, Mapping) or not all(isinstance(k, str) for k in hyper):
        raise ModelSpecError(f"model {name!r}: hyperparameters must be a mapping of names")
    if type(in_features) is not int or in_features < 1:
        raise ModelSpecError(f"model {name!r}: in_features must be a positive integer")
    with torch.device("meta"):
        module = _built(name, factory, in_features, hyper)
    count = sum(p.numel() for p in module.parameters())
    if count == 0 or count > MAX_PARAMETERS:
        raise ModelSpecError(
            f"model {name!r} has {count} parameters; between 1 and {MAX_PARAMETERS} are allowed"
        )
    return count


def _built(
    name: str, factory: ModelFactory, in_features: int, hyper: Mapping[str, Any]
) -> nn.Module:
    try:
        module = factory(in_features, **dict(hyper))
    except (TypeError, ValueError, RuntimeError, NotImplementedError) as error:
        raise ModelSpecError(
            f"model {name!r} cannot be built with hyperparameters {dict(hyper)!r}: {error}"
        ) from None
    if not isinstance(module, nn.Module):
        raise ModelSpecError(f"model {name!r}: the factory returned {type(module).__name__}")
    if any(True for _ in module.buffers()):
        raise ModelSpecError(
            f"model {name!r} has buffers (e.g. batch-norm statistics), which per-patient "
            "gradient clipping cannot protect; use a model with parameters only (e.g. GroupNorm)"
        )
    return module


def _sizes(hidden: Any) -> list[int]:
    if isinstance(hidden, int) and not isinstance(hidden, bool):
        hidden = [hidden]
    if not (
        isinstance(hidden, Sequence)
        and all(type(h) is int and 1 <= h <= 4096 for h in hidden)
        and len(hidden) <= 16
    ):
        raise ValueError("hidden must list up to 16 layer widths between 1 and 4096")
    return list(hidden)


def _dropout(dropout: Any) -> float:
    if not (isinstance(dropout, int | float) and not isinstance(dropout, bool)):
        raise ValueError("dropout must be a number in [0, 1)")
    if not (math.isfinite(dropout) and 0 <= dropout < 1):
        raise ValueError("dropout must be in [0, 1)")
    return float(dropout)


def mlp(in_features: int, hidden: Sequence[int] = (32,), dropout: float = 0.0) -> nn.Module:
    """Multilayer perceptron: ``Linear -> ReLU (-> Dropout)`` per hidden layer, then one logit."""
    layers: list[nn.Module] = []
    width = in_features
    rate = _dropout(dropout)
    for size in _sizes(hidden):
        layers += [nn.Linear(width, size), nn.ReLU()]
        if rate > 0:
            layers.append(nn.Dropout(rate))
        width = size
    layers.append(nn.Linear(width, 1))
    return nn.Sequential(*layers)


def survival_mlp(
    in_features: int, hidden: Sequence[int] = (32,), dropout: float = 0.0
) -> nn.Module:
    """DeepSurv's network (Katzman et al., BMC Med Res Methodol 2018): an MLP whose output is
    the log relative hazard; the last layer has no bias, which the Cox partial likelihood
    cannot identify (the baseline hazard absorbs it)."""
    network = mlp(in_features, hidden, dropout)
    last = network[-1]
    network[-1] = nn.Linear(last.in_features, 1, bias=False)
    return network


def linear(in_features: int, bias: bool = True) -> nn.Module:
    """One linear layer: logistic regression (binary) or a linear Cox model (survival)."""
    if not isinstance(bias, bool):
        raise ValueError("bias must be true or false")
    return nn.Sequential(nn.Linear(in_features, 1, bias=bias))


register_model("mlp", mlp)
register_model("survival_mlp", survival_mlp)
register_model("linear", linear)
