"""What a ledger's recorded DpEvents say about the mechanism that ran.

A recorded event is the accountant's description of a release
(:mod:`accounting.events`). :func:`event_facts` walks its JSON tree and
lists the Gaussian noise multipliers it contains (each repeated by the
counts of enclosing ``SelfComposedDpEvent``\\ s) and any subsampling
(``PoissonSampledDpEvent`` with probability ``q``; sampling without
replacement with ``n / N``). A report sets these beside the noise
multipliers a fit says it used, so implemented and accounted mechanisms can
be compared.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class EventFacts:
    """Gaussian multipliers and sampling found in one recorded event."""

    noise_multipliers: tuple[float, ...]
    sampling: tuple[str, ...]
    other: tuple[str, ...]

    @property
    def sampling_text(self) -> str:
        if not self.sampling:
            return "none (every patient's data enters the release)"
        return "; ".join(self.sampling)


def event_facts(event_json: str) -> EventFacts:
    """The :class:`EventFacts` of one event's canonical JSON (as a ledger stores it)."""
    multipliers: list[float] = []
    sampling: list[str] = []
    other: list[str] = []
    _walk(json.loads(event_json), 1, multipliers, sampling, other)
    return EventFacts(tuple(multipliers), tuple(sampling), tuple(other))


def _walk(
    tree: dict[str, Any],
    times: int,
    multipliers: list[float],
    sampling: list[str],
    other: list[str],
) -> None:
    kind = tree.get("type")
    if kind == "GaussianDpEvent":
        multipliers.extend([float(tree["noise_multiplier"])] * times)
    elif kind == "ComposedDpEvent":
        for event in tree["events"]:
            _walk(event, times, multipliers, sampling, other)
    elif kind == "SelfComposedDpEvent":
        _walk(tree["event"], times * int(tree["count"]), multipliers, sampling, other)
    elif kind == "PoissonSampledDpEvent":
        sampling.append(f"Poisson sampling, q = {float(tree['sampling_probability']):.4g}")
        _walk(tree["event"], times, multipliers, sampling, other)
    elif kind in ("SampledWithoutReplacementDpEvent", "SampledWithReplacementDpEvent"):
        how = "without" if kind.startswith("SampledWithout") else "with"
        sampling.append(
            f"sampling {how} replacement, {tree['sample_size']} of {tree['source_dataset_size']}"
        )
        _walk(tree["event"], times, multipliers, sampling, other)
    else:
        other.append(str(kind))
