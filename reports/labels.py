"""Plain labels for the recorded fields a report shows, and values written out in words.

The study directory records facts under the names the code gives them
(``noise_multiplier[gradient]``, ``max_level_density``, ``i2_untruncated``);
a privacy officer reads the report. :data:`FIELD_LABELS` is the single
mapping from a recorded field name to the label the report prints, used for
every setting, ledger parameter, disclosure threshold and diagnostic column.
A field ``name[part]`` (one per released group) or ``name (group)`` (one per
curve group) is labelled from its parts. :func:`field_label` never returns a
raw field name: an unmapped one is written with spaces, and the tests list
every field a study records to check that each has its own label.

:func:`value_text` writes a recorded value without Python syntax: bounds as
``age 18–110``, lists joined by commas, ``True``/``False`` as yes/no.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from reports.formatting import format_number

TREATMENT_TERM = re.compile(r"(?:C\()?([A-Za-z_][\w.]*)\)?\[T\.([^\]]+)\]")
"""A formula's treatment-coded level: ``C(sex)[T.male]`` or ``sex[T.male]``."""


def term_label(term: str) -> str:
    """A coefficient's name as a reader says it: ``C(sex)[T.male]`` → ``sex: male`` (against
    the reference level), ``age:C(sex)[T.male]`` → ``age × sex: male``; other names as they are."""
    return " × ".join(TREATMENT_TERM.sub(r"\1: \2", part) for part in str(term).split(":"))


def terms_in_text(text: str) -> str:
    """``text`` with every treatment-coded term written as :func:`term_label` writes it."""
    return TREATMENT_TERM.sub(r"\1: \2", str(text))


FIELD_LABELS: Mapping[str, str] = {
    # privacy options of a fit (configuration.json "privacy")
    "kind": "kind of privacy",
    "epsilon": "target ε",
    "delta": "δ",
    "rounds": "noisy Newton rounds",
    "noise_multiplier": "noise multiplier",
    "site_noise_multiplier": "noise multiplier of each site's share",
    "bounds": "public bounds of the numeric columns",
    "row_norm": "bound B on each patient's scaled design row (L2 norm)",
    "gradient_clip": "clipping bound on each site's score (L2 norm)",
    "hessian_clip": "clipping bound on each site's information matrix (Frobenius norm)",
    "secure_aggregation": "secure aggregation",
    # secure aggregation facts
    "fraction_bits": "fixed-point fraction bits",
    "protocol": "protocol",
    "sites": "sites",
    "threshold": "threshold (sites that must take part)",
    "sessions": "sessions",
    "dropouts": "sites that dropped out",
    "secure_aggregation_roster": "secure-aggregation roster",
    "secure_aggregation_threshold": "secure-aggregation threshold",
    # released groups, as in noise_multiplier[gradient]
    "gradient": "score",
    "hessian": "information matrix",
    "n_obs": "patient count",
    "deaths": "deaths",
    "censored": "censorings",
    # disclosure control (configuration.json "disclosure")
    "k_cell": "smallest cell (patients)",
    "min_count": "smallest count a site releases",
    "max_levels": "most levels of a categorical term",
    "max_level_density": "largest share of levels to patients",
    "max_parameter_ratio": "largest ratio of parameters to patients",
    "max_rounds_per_analysis": "most rounds of one analysis",
    "max_analyses_per_study": "most analyses per study",
    "max_guard_entries": "most row sets and columns the differencing guard remembers",
    "require_privacy": "differential privacy required for every release",
    "set by": "set by",
    "seen by the coordinator": "seen by the coordinator",
    # heterogeneity diagnostics (fedstats.models.heterogeneity)
    "index": "term",
    "estimate_fe": "fixed-effect estimate",
    "se_fe": "fixed-effect standard error",
    "q": "Cochran's Q",
    "df": "degrees of freedom",
    "p_value": "p-value",
    "i2": "I²",
    "tau2": "τ²",
    "i2_untruncated": "I² before truncation at 0",
    "tau2_untruncated": "τ² before truncation at 0",
    # survival tables (one column per field and group)
    "time": "time",
    "survival": "survival",
    "lower": "lower limit",
    "upper": "upper limit",
    "at_risk": "at risk",
    "events": "events",
}

VALUE_LABELS: Mapping[str, str] = {
    "RecordDP": "record-level differential privacy",
    "ClientDP": "client-level differential privacy",
    "pinned": "pinned by each site",
}

UNSET_MEANS: Mapping[str, str] = {
    "noise_multiplier": "calibrated from ε and δ by the RDP accountant",
    "row_norm": "the default, the square root of the number of formula terms",
}
"""What a privacy option left unset (``null``) means; any other unset option is omitted."""

_PART = re.compile(r"^(?P<base>[^\[\]]+)\[(?P<part>[^\[\]]+)\]$")
_GROUP = re.compile(r"^(?P<base>\S+) \((?P<group>.+)\)$")


def field_label(field: str) -> str:
    """The label of a recorded field name (``noise_multiplier[gradient]`` → ``noise multiplier
    (score)``; ``at_risk (all)`` → ``at risk (all)``)."""
    if field in FIELD_LABELS:
        return FIELD_LABELS[field]
    if match := _PART.match(field):
        return f"{field_label(match['base'])} ({field_label(match['part'])})"
    if match := _GROUP.match(field):
        return f"{field_label(match['base'])} ({match['group']})"
    return field.replace("_", " ")


def is_labelled(field: str) -> bool:
    """Whether ``field`` (or each of its parts) has its own entry in :data:`FIELD_LABELS`."""
    if field in FIELD_LABELS:
        return True
    if match := _PART.match(field):
        return is_labelled(match["base"]) and is_labelled(match["part"])
    if match := _GROUP.match(field):
        return is_labelled(match["base"])
    return False


def bounds_text(bounds: Mapping[str, Any]) -> str:
    """``{"age": [18, 110], "statin": [0, 1]}`` → ``age 18–110, statin 0–1``."""
    return ", ".join(
        f"{name} {format_number(low)}–{format_number(high)}" for name, (low, high) in bounds.items()
    )


def value_text(value: Any) -> str:
    """A recorded value in words: numbers to 4 significant digits, no brackets or quotes."""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int | float):
        return format_number(value)
    if isinstance(value, str):
        return VALUE_LABELS.get(value, value)
    if value is None:
        return "not set"
    if isinstance(value, Mapping):
        return "; ".join(f"{field_label(str(k))} {value_text(v)}" for k, v in value.items())
    if isinstance(value, list | tuple):
        return ", ".join(value_text(v) for v in value) if value else "none"
    return str(value)


def settings(options: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
    """A fit's privacy options as ``(label, value in words)``, in name order.

    Bounds are written as ranges; secure aggregation as its facts; an unset
    option is explained (:data:`UNSET_MEANS`) or omitted.
    """
    rows = []
    for name in sorted(options):
        value = options[name]
        if value is None:
            if name in UNSET_MEANS:
                rows.append((field_label(name), UNSET_MEANS[name]))
            continue
        if name == "bounds" and isinstance(value, Mapping):
            rows.append((field_label(name), bounds_text(value) or "none"))
        else:
            rows.append((field_label(name), value_text(value)))
    return tuple(rows)
