"""Model weights as they cross the silo boundary: float32 arrays in ``state_dict`` order.

A request carries one array per parameter tensor; a site's update is one
flat float32 vector (the parameters' differences, concatenated in the same
order), whose length depends only on the architecture, never on the number
of patients. The coordinator combines flat vectors, so aggregators and
privacy hooks see plain ``numpy`` arrays.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import nn

from fedstats.errors import ModelSpecError


def parameter_arrays(model: nn.Module) -> list[np.ndarray]:
    """The model's parameters as float32 arrays, in ``state_dict`` order."""
    return [t.detach().cpu().numpy().astype(np.float32).copy() for t in _parameters(model)]


def parameter_count(arrays: Sequence[np.ndarray]) -> int:
    return int(sum(a.size for a in arrays))


def flatten(arrays: Sequence[np.ndarray]) -> np.ndarray:
    """The arrays concatenated into one float32 vector."""
    if not arrays:
        return np.zeros(0, dtype=np.float32)
    return np.concatenate([np.asarray(a, dtype=np.float32).ravel() for a in arrays])


def unflatten(vector: np.ndarray, like: Sequence[np.ndarray]) -> list[np.ndarray]:
    """Split a flat vector into arrays of the shapes of ``like``."""
    out, at = [], 0
    for array in like:
        out.append(np.asarray(vector[at : at + array.size], dtype=np.float32).reshape(array.shape))
        at += array.size
    if at != len(vector):
        raise ModelSpecError(f"a vector of {len(vector)} values does not fit {at} parameters")
    return out


def checked_arrays(value: object, model: nn.Module, who: str) -> list[np.ndarray]:
    """``value`` as float32 arrays matching the model's parameter shapes, all finite."""
    expected = [tuple(t.shape) for t in _parameters(model)]
    if not (isinstance(value, list) and len(value) == len(expected)):
        raise ModelSpecError(
            f"{who}: 'weights' must list {len(expected)} arrays (one per parameter tensor)"
        )
    arrays = []
    for i, (array, shape) in enumerate(zip(value, expected, strict=True)):
        if not (isinstance(array, np.ndarray) and array.shape == shape and array.dtype.kind == "f"):
            raise ModelSpecError(f"{who}: weights[{i}] must be a float array of shape {shape}")
        if not np.isfinite(array).all():
            raise ModelSpecError(f"{who}: weights[{i}] has non-finite values")
        arrays.append(array.astype(np.float32))
    return arrays


def load_arrays(model: nn.Module, arrays: Sequence[np.ndarray]) -> None:
    """Copy ``arrays`` into the model's parameters (shapes already checked)."""
    with torch.no_grad():
        for param, array in zip(_parameters(model), arrays, strict=True):
            param.copy_(torch.from_numpy(np.asarray(array, dtype=np.float32)))


def _parameters(model: nn.Module) -> list[torch.Tensor]:
    """Parameters in ``state_dict`` order (a registry model has no buffers)."""
    named = dict(model.named_parameters())
    return [named[key] for key in model.state_dict() if key in named]
