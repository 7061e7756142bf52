"""Synthetic identifier tables with FEBRL-like typographical errors, for tests and benchmarks.

People are drawn with clkhash's frequency tables (``clkhash/data``: US census family
names, first names by sex), uniform birth dates from 1920 to 2009 and uniform 4-digit
postal codes. The second table holds a corrupted copy of every person of the first, in a
shuffled order; each copy gets 1 to ``max_errors`` corruptions in the manner of FEBRL's
generator (Christen 2005, "Probabilistic data generation for deduplication and data
linkage"): a character inserted, deleted, substituted or two neighbours swapped in a name
or the postal code, a value gone missing, day and month swapped or a day changed.
"""

from __future__ import annotations

import datetime as dt
from functools import cache

import numpy as np
import pandas as pd
from clkhash.randomnames import Distribution

_LETTERS = np.array(list("abcdefghijklmnopqrstuvwxyz"))
_FIRST_DAY = dt.date(1920, 1, 1).toordinal()
_LAST_DAY = dt.date(2009, 12, 31).toordinal()


@cache
def _table(resource: str) -> tuple[np.ndarray, np.ndarray]:
    """Values (lowercase, a-z only, non-empty) and their probabilities from a clkhash table."""
    distribution = Distribution(resource)
    counts = np.diff(np.asarray([0, *distribution.indices], dtype=float))
    names = ["".join(c for c in v.lower() if "a" <= c <= "z") for v in distribution.values]
    keep = np.array([bool(n) for n in names])
    values = np.array(names, dtype=object)[keep]
    weights = counts[keep]
    return values, weights / weights.sum()


def people(n: int, rng: np.random.Generator) -> pd.DataFrame:
    """``n`` people as an identifier table (no errors)."""
    sex = rng.choice(np.array(["female", "male"]), size=n)
    given = np.empty(n, dtype=object)
    for code, resource in (
        ("female", "data/female-first-names.csv"),
        ("male", "data/male-first-names.csv"),
    ):
        values, p = _table(resource)
        mask = sex == code
        given[mask] = rng.choice(values, size=int(mask.sum()), p=p)
    family_values, family_p = _table("data/last-names.csv")
    family = rng.choice(family_values, size=n, p=family_p)
    days = rng.integers(_FIRST_DAY, _LAST_DAY + 1, size=n)
    birth = [dt.date.fromordinal(int(d)).isoformat() for d in days]
    postal = [f"{int(c):04d}" for c in rng.integers(200, 10000, size=n)]
    return pd.DataFrame(
        {
            "given_name": given.astype(str),
            "family_name": family.astype(str),
            "birth_date": birth,
            "sex": sex,
            "postal_code": postal,
        }
    ).astype(object)


def corrupted_copy(
    frame: pd.DataFrame, rng: np.random.Generator, *, max_errors: int = 3
) -> pd.DataFrame:
    """A copy of ``frame`` with 1 to ``max_errors`` corruptions per row (same order)."""
    records = frame.to_dict("records")
    fields = ["given_name", "family_name", "birth_date", "postal_code", "sex"]
    weights = np.array([0.3, 0.3, 0.2, 0.15, 0.05])
    for record in records:
        for _ in range(int(rng.integers(1, max_errors + 1))):
            name = fields[int(rng.choice(len(fields), p=weights))]
            record[name] = _corrupt(name, record[name], rng)
    return pd.DataFrame.from_records(records, columns=list(frame.columns)).astype(object)


def linked_tables(
    n: int, *, seed: int, max_errors: int = 3
) -> tuple[pd.DataFrame, pd.DataFrame, list[tuple[int, int]]]:
    """Two identifier tables of ``n`` people each and their true matches.

    Returns
    -------
    first, second, truth
        ``second`` holds a corrupted copy of each person of ``first`` in a shuffled
        order; ``truth`` lists the (first position, second position) of every person.
    """
    rng = np.random.default_rng(seed)
    first = people(n, rng)
    copy = corrupted_copy(first, rng, max_errors=max_errors)
    order = rng.permutation(n)
    second = copy.iloc[order].reset_index(drop=True)
    truth = [(int(i), int(j)) for j, i in enumerate(order)]
    return first, second, truth


def _corrupt(name: str, value: str, rng: np.random.Generator) -> str:
    if not value or rng.random() < 0.15:
        return ""  # missing value
    if name == "sex":
        return "unknown"
    if name == "birth_date":
        return _corrupt_date(value, rng)
    alphabet = _LETTERS if name != "postal_code" else np.array(list("0123456789"))
    chars = list(value)
    position = int(rng.integers(len(chars)))
    kind = int(rng.integers(4))
    if kind == 0:
        chars.insert(position, str(rng.choice(alphabet)))
    elif kind == 1 and len(chars) > 1:
        del chars[position]
    elif kind == 2 and len(chars) > 1:
        other = min(position + 1, len(chars) - 1) if position < len(chars) - 1 else position - 1
        chars[position], chars[other] = chars[other], chars[position]
    else:
        chars[position] = str(rng.choice(alphabet))
    return "".join(chars)


def _corrupt_date(value: str, rng: np.random.Generator) -> str:
    date = dt.date.fromisoformat(value)
    if rng.random() < 0.5 and date.day <= 12 and date.day != date.month:
        return date.replace(month=date.day, day=date.month).isoformat()
    shifted = date + dt.timedelta(days=int(rng.choice([-3, -2, -1, 1, 2, 3])))
    return shifted.isoformat()
