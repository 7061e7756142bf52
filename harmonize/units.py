"""UCUM unit conversion for the study's measurements.

Units are parsed as UCUM codes by ``ucumvert`` (a UCUM grammar on top of
``pint``), so any two commensurable UCUM units convert (``kPa`` to
``mm[Hg]``, ``g/L`` to ``mg/dL``, ``[lb_av]`` to ``kg``). Two kinds of
knowledge are kept as data in ``harmonize/data/units.toml``, not as code:

* spellings: non-UCUM forms seen in source systems (``mmHg``) and their
  UCUM codes;
* analytes: molar masses, to convert between mass and substance
  concentrations of one analyte (glucose ``mmol/L`` to ``mg/dL``), matched by
  the measurement's LOINC code or OMOP concept id.
"""

from __future__ import annotations

import functools
import tomllib
from collections.abc import Iterable
from dataclasses import dataclass
from importlib import resources

import numpy as np
import pint
from ucumvert import PintUcumRegistry

from harmonize.errors import UnitError


@dataclass(frozen=True)
class Analyte:
    name: str
    molar_mass: float  # g/mol
    loinc: frozenset[str]
    omop: frozenset[int]


@functools.cache
def _registry() -> PintUcumRegistry:
    return PintUcumRegistry()


@functools.cache
def _data() -> tuple[dict[str, str], tuple[Analyte, ...]]:
    text = resources.files("harmonize").joinpath("data/units.toml").read_text(encoding="utf-8")
    raw = tomllib.loads(text)
    analytes = tuple(
        Analyte(
            a["name"],
            float(a["molar_mass_g_per_mol"]),
            frozenset(a.get("loinc", [])),
            frozenset(int(i) for i in a.get("omop", [])),
        )
        for a in raw.get("analytes", [])
    )
    return dict(raw.get("spellings", {})), analytes


def ucum(unit: str) -> str:
    """The UCUM code for a unit as written in a source (known spellings translated)."""
    spellings, _ = _data()
    unit = unit.strip()
    return spellings.get(unit, unit)


@functools.cache
def _quantity(unit: str) -> pint.Quantity:
    try:
        quantity = _registry().from_ucum(ucum(unit))
    except Exception as error:
        raise UnitError(f"unknown unit {unit!r} (not a UCUM code)") from error
    if not isinstance(quantity, pint.Quantity):
        quantity = _registry().Quantity(1.0, quantity)
    return quantity


def is_known(unit: str) -> bool:
    try:
        _quantity(unit)
    except UnitError:
        return False
    return True


def analyte_for(codes: Iterable[str] = (), concept_ids: Iterable[int] = ()) -> Analyte | None:
    """The analyte a measurement's LOINC codes or OMOP concept ids identify, if listed."""
    _, analytes = _data()
    codes, ids = set(codes), set(concept_ids)
    for analyte in analytes:
        if analyte.loinc & codes or analyte.omop & ids:
            return analyte
    return None


@functools.cache
def factor(from_unit: str, to_unit: str, molar_mass: float | None = None) -> tuple[float, float]:
    """``(scale, offset)`` with ``value_to = value_from * scale + offset``.

    Mass and substance concentrations convert only with the analyte's molar
    mass (``molar_mass`` in g/mol).
    """
    source, target = _quantity(from_unit), _quantity(to_unit)
    registry = _registry()
    try:
        if source.dimensionality == target.dimensionality:
            zero = registry.Quantity(0.0, source.units).to(target.units).magnitude
            one = registry.Quantity(1.0, source.units).to(target.units).magnitude
            return float(one - zero), float(zero)
        if molar_mass is not None:
            mass = registry.Quantity(molar_mass, "gram / mole")
            unit_source = registry.Quantity(1.0, source.units)
            for converted in (unit_source * mass, unit_source / mass):
                if converted.dimensionality == target.dimensionality:
                    return float(converted.to(target.units).magnitude), 0.0
    except pint.errors.PintError as error:
        raise UnitError(f"cannot convert {from_unit!r} to {to_unit!r}: {error}") from None
    raise UnitError(
        f"cannot convert {from_unit!r} to {to_unit!r}"
        + ("" if molar_mass else " (a molar mass is needed and the analyte is not listed)")
    )


def convert(
    values: np.ndarray, from_unit: str, to_unit: str, molar_mass: float | None = None
) -> np.ndarray:
    """Convert ``values`` from one unit to another (see :func:`factor`)."""
    scale, offset = factor(from_unit, to_unit, molar_mass)
    return np.asarray(values, dtype=np.float64) * scale + offset
