"""NDJSON files in blocks of whole lines, which worker processes survey, read and re-read.

A :class:`Block` is a byte range of a file that starts at the beginning of a
line and ends after a line break (or at the end of the file), with the
number of its first line (lines are counted from 1, blank ones included, as
the reader numbers them). :func:`split` cuts a file into blocks of about
:data:`BLOCK_BYTES` by seeking, without reading it; the first pass counts
each block's lines (:func:`survey_block`), which numbers the blocks that
follow. A worker opens the file and reads its block itself: only the
block's position travels to it, and only what it decided comes back. The
same functions read a small file in the main process, as one block,
streamed line by line.

* :func:`survey_block`: the block's lines and records (non-blank lines),
  its Medications (parsed, for the index of Medication codes) and,
  when asked, the :func:`~harmonize.fhir_json.line_key` of each Observation's
  and Encounter's id;
* :func:`read_block`: the decisions of :func:`~harmonize.fhir_decisions.decide_lines`
  and the rows of the records it deferred, as an Arrow table;
* :func:`validate_block`: the full decision for some of its lines (deferred
  records the analysis frame relies on), and whether the validated record
  gives the rows that stood for it.
"""

from __future__ import annotations

import re
from array import array
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from datetime import date
from pathlib import Path
from typing import Any

import pyarrow as pa

from harmonize.fhir_decisions import (
    Decision,
    DeferredRows,
    decide,
    decide_lines,
    malformed,
)
from harmonize.fhir_json import (
    PLAIN_TYPES,
    line_key,
    may_hold,
    parse_json,
    plain_key,
    plain_rows,
)
from harmonize.fhir_mapping import MEDICATION, Rows

__all__ = [
    "BLOCK_BYTES",
    "Block",
    "BlockRead",
    "BlockSurvey",
    "numbered_lines",
    "read_block",
    "renumber",
    "split",
    "survey_block",
    "validate_block",
    "whole",
]

BLOCK_BYTES = 1 << 20
"""Bytes per block (about 3,000 lines of a typical Observation export)."""
_MEDICATION_BYTES = b'"Medication"'
_PLAIN_LINE = re.compile(
    rb'\n\{"resourceType":"(' + "|".join(PLAIN_TYPES).encode() + rb')","id":"([^"\\\n]*)"'
)


@dataclass(frozen=True, slots=True)
class Block:
    """Bytes ``[start, end)`` of ``path``: whole lines, the first numbered ``first_line``."""

    path: Path
    start: int
    end: int
    first_line: int = 1


def whole(path: Path) -> Block:
    """The whole file as one block."""
    return Block(path, 0, path.stat().st_size)


def split(path: Path, size: int | None = None) -> list[Block]:
    """Blocks of about ``size`` bytes (:data:`BLOCK_BYTES`) covering ``path``, ending lines.

    The blocks are numbered as if each began at line 1; the first pass
    renumbers them (:func:`renumber`).
    """
    size = size or BLOCK_BYTES
    total = path.stat().st_size
    blocks: list[Block] = []
    with path.open("rb") as handle:
        start = 0
        while start < total:
            handle.seek(min(start + size, total))
            handle.readline()  # to the end of the line the cut falls in
            end = min(handle.tell(), total)
            blocks.append(Block(path, start, end))
            start = end
    return blocks


def renumber(blocks: list[Block], surveys: list[BlockSurvey]) -> list[Block]:
    """The blocks with their first lines' numbers, from the lines the survey counted in each."""
    numbered, first = [], 1
    for block, found in zip(blocks, surveys, strict=True):
        numbered.append(replace(block, first_line=first))
        first += found.lines
    return numbered


def numbered_lines(block: Block) -> Iterator[tuple[int, bytes]]:
    """The block's non-blank lines with their numbers, read one at a time."""
    for line_number, line in _lines(block):
        if line.strip():
            yield line_number, line


def _lines(block: Block) -> Iterator[tuple[int, bytes]]:
    with block.path.open("rb") as handle:
        handle.seek(block.start)
        position = block.start
        for line_number, line in enumerate(handle, start=block.first_line):
            if position >= block.end:
                return
            position += len(line)
            yield line_number, line


@dataclass
class BlockSurvey:
    """What the first pass found in one block (line numbers as if it began at line 1)."""

    lines: int = 0
    records: int = 0
    medications: list[tuple[int, dict[str, Any]]] = field(default_factory=list)
    keys: array = field(default_factory=lambda: array("q"))


def survey_block(block: Block, keys: bool) -> BlockSurvey:
    """Count the block's lines and records; collect its Medications and, if asked, id keys.

    Only lines holding the text ``"Medication"`` are parsed for the index
    (and some others for their keys, see :func:`~harmonize.fhir_json.line_key`);
    a line that is not JSON is left to the reader. A block of plain lines
    only is surveyed whole (:func:`_survey_plain_block`).
    """
    if keys and (plain := _survey_plain_block(block)) is not None:
        return plain
    return _survey_lines(block, keys)


def _survey_lines(block: Block, keys: bool) -> BlockSurvey:
    """:func:`survey_block`, line by line."""
    found = BlockSurvey()
    for line_number, line in _lines(block):
        found.lines += 1
        if not line.strip():
            continue
        found.records += 1
        if keys and (key := line_key(line)) is not None:
            found.keys.append(key)
            continue
        if not may_hold(_MEDICATION_BYTES, line):
            continue
        try:
            resource = parse_json(line)
        except (ValueError, RecursionError):
            continue  # the reader rejects it
        if isinstance(resource, dict) and resource.get("resourceType") == MEDICATION:
            found.medications.append((line_number, resource))
    return found


def _survey_plain_block(block: Block) -> BlockSurvey | None:
    """The survey of a block every line of which begins ``{"resourceType":"<type>","id":"``
    for a :data:`~harmonize.fhir_json.PLAIN_TYPES` type, else None.

    Most blocks of a Bulk Data export are such. The block is read whole and
    searched with one regular expression, not line by line: when each line
    begins so, holds no other ``"id"`` or ``"resourceType"`` and the block no
    escape, every line is a record (none is blank), none is a Medication,
    and the id written after the prefix is the resource's, as
    :func:`~harmonize.fhir_json.line_key` reads it.
    """
    if block.end - block.start > 4 * BLOCK_BYTES:
        return None
    with block.path.open("rb") as handle:
        handle.seek(block.start)
        data = handle.read(block.end - block.start)
    if not data.endswith(b"\n") or b"\\" in data:
        return None
    lines = data.count(b"\n")
    found = _PLAIN_LINE.findall(b"\n" + data)
    if not (len(found) == lines == data.count(b'"id"') == data.count(b'"resourceType"')):
        return None
    keys = array("q", (plain_key(kind, record_id) for kind, record_id in found))
    return BlockSurvey(lines=lines, records=lines, keys=keys)


@dataclass
class BlockRead:
    """A block's decisions (records read and validated) and the rows of its deferred records."""

    decisions: list[tuple[int, Decision]]
    deferred: pa.Table | None
    deferred_records: Counter[str]


def read_block(
    block: Block, source: str, today: date, repeated: frozenset[int] | None
) -> BlockRead:
    """Decide every line of the block (in a worker process); see ``decide_lines``."""
    sink = DeferredRows()
    decisions = list(decide_lines(numbered_lines(block), source, today, repeated, sink))
    if not len(sink):
        return BlockRead(decisions, None, Counter())
    table, records = sink.take()
    return BlockRead(decisions, table, records)


def validate_block(
    block: Block, lines: list[int], source: str, today: date
) -> tuple[list[int], list[tuple[int, Decision]]]:
    """Validate the records on ``lines`` of the block in full.

    Returns the lines whose record validates to exactly the rows it stood
    for while it was not validated (those rows stand), and the decision of
    every other one (to be carried out instead).
    """
    wanted = set(lines)
    same: list[int] = []
    other: list[tuple[int, Decision]] = []
    for line_number, line in numbered_lines(block):
        if line_number not in wanted:
            continue
        wanted.discard(line_number)
        record_ref = f"{source}:line {line_number}"
        try:
            resource = parse_json(line)
        except (ValueError, RecursionError) as error:
            other.append((line_number, malformed(error)))
        else:
            decision = decide(resource, record_ref, today)
            outcome = decision.outcome
            if (
                isinstance(outcome, Rows)
                and outcome.subject is None
                and not outcome.persons
                and isinstance(resource, dict)
                and outcome.rows == plain_rows(resource, record_ref, today)
            ):
                same.append(line_number)
            else:
                other.append((line_number, decision))
        if not wanted:
            break
    return same, other
