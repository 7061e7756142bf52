"""Files that must survive a crash whole: content hashes and atomic, durable writes.

:func:`write_atomically` writes a temporary file beside the target, flushes
it to disk (``fsync``), renames it over the target (``os.replace``, atomic
on POSIX) and flushes the directory, so a reader sees the old file or the
new one, never a part, even after a power loss. Frames, run records, fit
results and status files are written this way.
"""

from __future__ import annotations

import hashlib
import json
import os
from os import PathLike
from pathlib import Path
from typing import Any


def file_sha256(path: str | PathLike[str]) -> str:
    """Hex SHA-256 of a file's bytes, read in blocks."""
    hasher = hashlib.sha256()
    with Path(path).open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            hasher.update(block)
    return hasher.hexdigest()


def write_atomically(path: Path, data: bytes, *, mode: int | None = None) -> None:
    """Replace ``path`` by ``data`` atomically and durably (module docstring); with ``mode``
    (e.g. ``0o600``: the owner's only) the file has that mode from its creation on, whatever
    the umask."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    if mode is None:
        temporary.write_bytes(data)
    else:
        descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
        os.fchmod(descriptor, mode)  # whatever the umask or an earlier file's mode
        with os.fdopen(descriptor, "wb") as handle:
            handle.write(data)
    replace_durably(temporary, path)


def write_json_atomically(path: Path, record: Any, *, default: Any = None) -> None:
    """:func:`write_atomically` of ``record`` as indented JSON with sorted keys (``default`` as
    for :func:`json.dumps`: by default a value JSON cannot hold is an error)."""
    text = json.dumps(record, indent=1, sort_keys=True, default=default)
    write_atomically(path, text.encode("utf-8"))


def replace_durably(temporary: Path, path: Path) -> None:
    """Flush ``temporary`` to disk, rename it over ``path``, flush the directory."""
    with temporary.open("rb+") as handle:
        os.fsync(handle.fileno())
    os.replace(temporary, path)
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)
