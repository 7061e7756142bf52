"""DpEvents as canonical JSON, and in plain English.

A ledger stores each charged mechanism as the JSON of its
:class:`dp_accounting.DpEvent`, so the accountant can recompute every figure
from the file alone (the events are the single source of truth, as in
dp_accounting's own ``PrivacyAccountant.ledger``).

The encoding uses an explicit table of the event classes of
``dp_accounting.dp_event`` and their fields, rather than
``DpEvent.to_named_tuple``/``from_named_tuple``: the latter import whatever
module a file names, and a ledger file is data, not code. The JSON is
canonical (sorted keys, no whitespace, ``repr`` floats), so equal events give
equal text and the text can be hashed; floats round-trip exactly, and
``event_from_json(event_to_json(e)) == e`` for every supported event (field
sequences come back as lists, their declared type).

Format: ``{"type": "GaussianDpEvent", "noise_multiplier": 1.1}``, nested events
as objects, ``ComposedDpEvent.events`` as an array.
"""

from __future__ import annotations

import functools
import json
import math
import numbers
from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from accounting.errors import MalformedEvent

if TYPE_CHECKING:
    import dp_accounting

# Field kinds: how a value is checked, encoded and decoded.
_NONNEG = "non-negative number"
_PROB = "probability in [0, 1]"
_REAL = "finite number"
_COUNT = "non-negative integer"
_EVENT = "event"
_EVENTS = "list of events"
_REALS = "list of finite numbers"
_COUNTS = "non-negative integer or list of them"


@functools.cache
def event_fields() -> Mapping[type[dp_accounting.DpEvent], tuple[tuple[str, str], ...]]:
    """Every event class this package can store, with its fields and their kinds (read-only).

    Built on first use: importing ``dp_accounting`` loads its PLD accountant
    and with it SciPy's signal and stats modules, which ``import accounting``
    does not need.
    """
    from dp_accounting import dp_event as _ev

    return MappingProxyType(
        {
            _ev.NoOpDpEvent: (),
            _ev.NonPrivateDpEvent: (),
            _ev.UnsupportedDpEvent: (),
            _ev.RandomizedResponseDpEvent: (("noise_parameter", _PROB), ("num_buckets", _COUNT)),
            _ev.GaussianDpEvent: (("noise_multiplier", _NONNEG),),
            _ev.LaplaceDpEvent: (("noise_multiplier", _NONNEG),),
            _ev.DiscreteLaplaceDpEvent: (("noise_parameter", _NONNEG), ("sensitivity", _COUNT)),
            _ev.SelfComposedDpEvent: (("event", _EVENT), ("count", _COUNT)),
            _ev.ComposedDpEvent: (("events", _EVENTS),),
            _ev.PoissonSampledDpEvent: (("sampling_probability", _PROB), ("event", _EVENT)),
            _ev.SampledWithReplacementDpEvent: (
                ("source_dataset_size", _COUNT),
                ("sample_size", _COUNT),
                ("event", _EVENT),
            ),
            _ev.SampledWithoutReplacementDpEvent: (
                ("source_dataset_size", _COUNT),
                ("sample_size", _COUNT),
                ("event", _EVENT),
            ),
            _ev.SingleEpochTreeAggregationDpEvent: (
                ("noise_multiplier", _NONNEG),
                ("step_counts", _COUNTS),
            ),
            _ev.RepeatAndSelectDpEvent: (("event", _EVENT), ("mean", _NONNEG), ("shape", _NONNEG)),
            _ev.MixtureOfGaussiansDpEvent: (
                ("standard_deviation", _NONNEG),
                ("sensitivities", _REALS),
                ("sampling_probs", _REALS),
            ),
            _ev.ZCDpEvent: (("rho", _NONNEG), ("xi", _NONNEG)),
            _ev.TruncatedSubsampledGaussianDpEvent: (
                ("dataset_size", _COUNT),
                ("sampling_probability", _PROB),
                ("truncated_batch_size", _COUNT),
                ("noise_multiplier", _NONNEG),
            ),
        }
    )


@functools.cache
def _by_name() -> dict[str, type[dp_accounting.DpEvent]]:
    return {cls.__name__: cls for cls in event_fields()}


_MAX_DEPTH = 64
_MAX_TEXT = 1_000_000


def _number(value: object, kind: str, where: str) -> int | float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise MalformedEvent(f"{where} must be a {kind}, got {value!r}")
    number: int | float = int(value) if isinstance(value, numbers.Integral) else float(value)
    if not math.isfinite(number):
        raise MalformedEvent(f"{where} must be a finite {kind}, got {value!r}")
    if kind == _NONNEG and number < 0:
        raise MalformedEvent(f"{where} must be a {kind}, got {value!r}")
    if kind == _PROB and not 0 <= number <= 1:
        raise MalformedEvent(f"{where} must be a {kind}, got {value!r}")
    return number


def _integer(value: object, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0:
        raise MalformedEvent(f"{where} must be a {_COUNT}, got {value!r}")
    return int(value)


def _convert(value: object, kind: str, where: str, event: Callable[[object, str], Any]) -> object:
    """Check one field value of ``kind``; nested events go through ``event``."""
    if kind in (_NONNEG, _PROB, _REAL):
        return _number(value, kind, where)
    if kind == _COUNT:
        return _integer(value, where)
    if kind == _EVENT:
        return event(value, where)
    if kind in (_EVENTS, _REALS) or (kind == _COUNTS and not isinstance(value, numbers.Integral)):
        if isinstance(value, str | bytes | dict) or not isinstance(value, Sequence):
            raise MalformedEvent(f"{where} must be a {kind}, got {value!r}")
        if kind == _EVENTS:
            return [event(item, f"{where}[{i}]") for i, item in enumerate(value)]
        if kind == _REALS:
            return [_number(item, _REAL, f"{where}[{i}]") for i, item in enumerate(value)]
        return [_integer(item, f"{where}[{i}]") for i, item in enumerate(value)]
    return _integer(value, where)  # _COUNTS given as one integer


def _to_tree(event: object, where: str = "event", depth: int = 0) -> dict[str, Any]:
    if depth > _MAX_DEPTH:
        raise MalformedEvent(f"{where}: events nested deeper than {_MAX_DEPTH} levels")
    fields = event_fields().get(type(event))
    if fields is None:
        raise MalformedEvent(
            f"{where}: {type(event).__name__} is not a dp_accounting event this ledger can "
            f"store; supported: {', '.join(sorted(_by_name()))}"
        )
    tree: dict[str, Any] = {"type": type(event).__name__}
    for name, kind in fields:
        tree[name] = _convert(
            getattr(event, name),
            kind,
            f"{where}.{name}",
            lambda value, at: _to_tree(value, at, depth + 1),
        )
    return tree


def _from_tree(tree: object, where: str = "event", depth: int = 0) -> dp_accounting.DpEvent:
    if depth > _MAX_DEPTH:
        raise MalformedEvent(f"{where}: events nested deeper than {_MAX_DEPTH} levels")
    if not isinstance(tree, dict):
        raise MalformedEvent(f"{where} must be a JSON object with a 'type', got {tree!r:.80}")
    import attr

    name = tree.get("type")
    cls = _by_name().get(name) if isinstance(name, str) else None
    if cls is None:
        raise MalformedEvent(
            f"{where}: unknown event type {name!r:.80}; supported: {', '.join(sorted(_by_name()))}"
        )
    fields = dict(event_fields()[cls])
    extra = set(tree) - set(fields) - {"type"}
    if extra:
        raise MalformedEvent(f"{where}: {name} has no field(s) {', '.join(sorted(extra))}")
    defaults = {a.name for a in attr.fields(cls) if a.default is not attr.NOTHING}
    missing = set(fields) - set(tree) - defaults
    if missing:
        raise MalformedEvent(f"{where}: {name} lacks field(s) {', '.join(sorted(missing))}")
    values = {
        field: _convert(
            tree[field],
            kind,
            f"{where}.{field}",
            lambda value, at: _from_tree(value, at, depth + 1),
        )
        for field, kind in fields.items()
        if field in tree
    }
    return cls(**values)


def _canonical(tree: object) -> str:
    return json.dumps(tree, sort_keys=True, separators=(",", ":"), allow_nan=False)


def event_to_json(event: dp_accounting.DpEvent) -> str:
    """Canonical JSON of ``event`` (sorted keys, no whitespace, exact floats).

    Raises
    ------
    MalformedEvent
        If ``event`` is not one of the classes in :func:`event_fields`, or a field
        is out of range (negative noise, probability outside [0, 1], non-finite).
    """
    return _canonical(_to_tree(event))


def _refuse_constant(name: str) -> float:
    raise MalformedEvent(f"event JSON holds {name}, which is not a valid parameter")


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):
        raise MalformedEvent("event JSON repeats a key in one object")
    return out


def event_from_json(text: str | bytes) -> dp_accounting.DpEvent:
    """The DpEvent encoded by :func:`event_to_json`.

    Raises
    ------
    MalformedEvent
        For text that is not JSON, not an event object, names an unknown event
        type or field, repeats a key, or holds out-of-range or non-finite values.
    """
    if isinstance(text, bytes | bytearray):
        try:
            text = bytes(text).decode("utf-8")
        except UnicodeDecodeError as error:
            raise MalformedEvent(f"event JSON is not UTF-8: {error}") from None
    if not isinstance(text, str):
        raise MalformedEvent(f"event JSON must be text, got {type(text).__name__}")
    if len(text) > _MAX_TEXT:
        raise MalformedEvent(f"event JSON is longer than {_MAX_TEXT} characters")
    try:
        tree = json.loads(text, parse_constant=_refuse_constant, object_pairs_hook=_no_duplicates)
    except (json.JSONDecodeError, RecursionError) as error:
        raise MalformedEvent(f"event JSON cannot be parsed: {error}") from None
    return _from_tree(tree)


# ---------------------------------------------------------------------------
# Plain English


def _num(value: float) -> str:
    if isinstance(value, numbers.Integral):
        return f"{int(value):,}"
    text = f"{float(value):.6g}"
    return text.replace("e-0", "e-").replace("e+0", "e+")


def _times(count: int) -> str:
    return "once" if count == 1 else f"{count:,} times"


def _grouped(events: Sequence[dp_accounting.DpEvent]) -> list[tuple[dp_accounting.DpEvent, int]]:
    groups: list[tuple[dp_accounting.DpEvent, int]] = []
    for event in events:
        if groups and groups[-1][0] == event:
            groups[-1] = (event, groups[-1][1] + 1)
        else:
            groups.append((event, 1))
    return groups


def _inner(event: dp_accounting.DpEvent) -> str:
    """Describe a sub-event, in parentheses if it is itself a list of mechanisms."""
    from dp_accounting import dp_event as _ev

    text = describe_event(event)
    composite = isinstance(event, _ev.ComposedDpEvent) and len(_grouped(event.events)) > 1
    return f"({text})" if composite else text


def describe_event(event: dp_accounting.DpEvent) -> str:
    """Plain English for reports.

    E.g. ``SelfComposedDpEvent(PoissonSampledDpEvent(0.01, GaussianDpEvent(1.1)), 10000)``
    is "Gaussian mechanism (noise multiplier 1.1), Poisson-sampled at rate 0.01,
    composed 10,000 times".
    """
    from dp_accounting import dp_event as _ev

    e = event
    if isinstance(e, _ev.NoOpDpEvent):
        return "no-op (no privacy cost)"
    if isinstance(e, _ev.NonPrivateDpEvent):
        return "non-private release (unbounded privacy cost)"
    if isinstance(e, _ev.UnsupportedDpEvent):
        return "a mechanism without a differential-privacy analysis"
    if isinstance(e, _ev.GaussianDpEvent):
        return f"Gaussian mechanism (noise multiplier {_num(e.noise_multiplier)})"
    if isinstance(e, _ev.LaplaceDpEvent):
        return f"Laplace mechanism (noise multiplier {_num(e.noise_multiplier)})"
    if isinstance(e, _ev.DiscreteLaplaceDpEvent):
        return (
            f"discrete Laplace mechanism (noise parameter {_num(e.noise_parameter)}, "
            f"sensitivity {_num(e.sensitivity)})"
        )
    if isinstance(e, _ev.RandomizedResponseDpEvent):
        return (
            f"randomized response over {_num(e.num_buckets)} buckets "
            f"(noise parameter {_num(e.noise_parameter)})"
        )
    if isinstance(e, _ev.SelfComposedDpEvent):
        return f"{_inner(e.event)}, composed {_times(e.count)}"
    if isinstance(e, _ev.ComposedDpEvent):
        groups = _grouped(e.events)
        if not groups:
            return "no-op (empty composition)"
        parts = [
            describe_event(item) if n == 1 else f"{_inner(item)}, composed {_times(n)}"
            for item, n in groups
        ]
        if len(parts) == 1:
            return parts[0]
        return f"composition of {len(e.events):,} mechanisms: " + "; ".join(parts)
    if isinstance(e, _ev.PoissonSampledDpEvent):
        return f"{_inner(e.event)}, Poisson-sampled at rate {_num(e.sampling_probability)}"
    if isinstance(e, _ev.SampledWithReplacementDpEvent | _ev.SampledWithoutReplacementDpEvent):
        how = "with" if isinstance(e, _ev.SampledWithReplacementDpEvent) else "without"
        return (
            f"{_inner(e.event)}, on fixed-size batches of {_num(e.sample_size)} of "
            f"{_num(e.source_dataset_size)} records sampled {how} replacement"
        )
    if isinstance(e, _ev.SingleEpochTreeAggregationDpEvent):
        steps = e.step_counts
        steps_text = _num(steps) if isinstance(steps, int) else ", ".join(map(_num, steps))
        return (
            f"single-epoch tree aggregation (noise multiplier {_num(e.noise_multiplier)}, "
            f"steps {steps_text})"
        )
    if isinstance(e, _ev.RepeatAndSelectDpEvent):
        return (
            f"best of a random number of runs (mean {_num(e.mean)}, shape {_num(e.shape)}) "
            f"of {_inner(e.event)}"
        )
    if isinstance(e, _ev.MixtureOfGaussiansDpEvent):
        return (
            f"mixture-of-Gaussians mechanism (standard deviation {_num(e.standard_deviation)}, "
            f"{len(e.sensitivities)} sensitivities)"
        )
    if isinstance(e, _ev.ZCDpEvent):
        return f"zero-concentrated DP mechanism (rho {_num(e.rho)}, xi {_num(e.xi)})"
    if isinstance(e, _ev.TruncatedSubsampledGaussianDpEvent):
        return (
            f"Gaussian mechanism (noise multiplier {_num(e.noise_multiplier)}), Poisson-sampled "
            f"at rate {_num(e.sampling_probability)} from {_num(e.dataset_size)} records and "
            f"truncated to batches of at most {_num(e.truncated_batch_size)}"
        )
    return f"{type(e).__name__} (not described)"
