"""A site's identifier table for record linkage: kept beside its frame, never sent.

A site of a vertical study harmonises under a specification with a ``[linkage]`` table;
``harmonize`` then gives the identifier table of the frame's patients
(``Harmonized.identifiers``: normalised given and family name, birth date, sex, postal
code; one row per frame patient, same index). The batch job keeps it at
``workdir/current/identifiers.parquet`` (:data:`CURRENT_IDENTIFIERS`), written like the
frame (a temporary file in the same folder, flushed, renamed over the old one) and readable
by the site's own user only (file mode 0600). A site serving a ready frame names its table
in ``[data] identifiers``.

The site's silo is built with the table and the ``[linkage]`` table of the site's own copy
of the specification (:func:`site_linking`); the silo encodes it only under that schema
(:mod:`fedstats.site.handlers.record_linkage`). The table never leaves the site: no run
record, journal line, log line or report holds a value of it (only its path and counts).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from fedstats.errors import ConfigError, StudyConfigurationError
from fedstats.jobs.site_config import SiteConfig
from fedstats.site.identifiers import site_identifiers
from linkage.schema import IDENTIFIER_COLUMNS
from studyfiles.durable import write_atomically

CURRENT_IDENTIFIERS = Path("current") / "identifiers.parquet"
"""Where ``fedstats site run`` keeps the harmonised identifier table, under the workdir."""
FILE_MODE = 0o600


def linkage_table(config: SiteConfig) -> Mapping[str, Any] | None:
    """The ``[linkage]`` table of the site's specification (``[data] spec``), or ``None``.

    Raises
    ------
    ConfigError
        The specification cannot be read (naming ``data.spec``).
    """
    from harmonize.errors import SpecError
    from harmonize.spec import load_spec

    spec = config.data.spec
    if spec is None:
        return None
    try:
        return load_spec(spec).linkage
    except (SpecError, OSError) as error:
        raise ConfigError(f"site {config.name!r}: field 'data.spec': {error}") from None


def identifiers_path(config: SiteConfig) -> Path | None:
    """The identifier table this site links on, or ``None`` when it takes part in no linkage."""
    if config.data.frame is not None:
        return config.data.identifiers
    if linkage_table(config) is None:
        return None
    return config.workdir / CURRENT_IDENTIFIERS


def write_identifiers(table: pd.DataFrame, path: Path) -> None:
    """Write ``table`` to ``path`` atomically, readable and writable by the site's user only."""
    folder = path.parent
    folder.mkdir(parents=True, exist_ok=True)
    for leftover in folder.glob(f".{path.name}.*.tmp"):  # a crashed run's half table
        leftover.unlink(missing_ok=True)
    write_atomically(path, table.to_parquet(), mode=FILE_MODE)


def read_identifiers(path: Path, *, site: str, field: str) -> pd.DataFrame:
    """The identifier table at ``path``: Parquet, the identifier columns, text values.

    Raises
    ------
    ConfigError
        Naming the site, ``field`` and the file: no file, not Parquet, a column missing or
        extra, or a value that is not text (missing is ``""``).
    """
    where = f"site {site!r}: field {field!r}: {path}"
    if not path.is_file():
        raise ConfigError(
            f"{where} does not exist; give the site's identifier table (Parquet, indexed as "
            "the frame), or harmonise the sources under the study specification again"
        )
    try:
        table = pd.read_parquet(path)
    except (OSError, ValueError, ImportError) as error:  # pyarrow: ArrowInvalid is a ValueError
        raise ConfigError(
            f"{where} is not a readable Parquet file ({type(error).__name__}); write the "
            "identifier table with pandas.DataFrame.to_parquet"
        ) from None
    columns = [str(c) for c in table.columns]
    if sorted(columns) != sorted(IDENTIFIER_COLUMNS):
        raise ConfigError(
            f"{where} has columns {columns}; an identifier table has exactly "
            f"{list(IDENTIFIER_COLUMNS)}"
        )
    for column in IDENTIFIER_COLUMNS:
        values = table[column]
        bad = ~values.map(lambda v: isinstance(v, str))
        if bad.any():
            row = int(bad.to_numpy().argmax())
            raise ConfigError(
                f"{where}: column {column!r}, row {row}: not text (a missing value is the empty "
                'string "")'
            )
    return table[list(IDENTIFIER_COLUMNS)]


def site_linking(
    config: SiteConfig, frame: pd.DataFrame
) -> tuple[pd.DataFrame | None, Mapping[str, Any] | None]:
    """The identifier table and ``[linkage]`` table the site's silo is built with.

    ``(None, None)`` for a site that takes part in no linkage. The table is checked against
    the frame and the schema here, so a bad table stops the batch job before it serves.

    Raises
    ------
    ConfigError
        A bad identifier table or specification (naming the field and the file), or
        ``[data] identifiers`` beside a specification without a ``[linkage]`` table.
    """
    path = identifiers_path(config)
    if path is None:
        return None, None
    field = "data.identifiers" if config.data.frame is not None else "data.spec"
    table = linkage_table(config)
    if table is None:
        raise ConfigError(
            f"site {config.name!r}: field 'data.identifiers': the specification "
            f"{config.data.spec} has no [linkage] table to encode {path} under"
        )
    identifiers = read_identifiers(path, site=config.name, field=field)
    try:
        site_identifiers(config.name, frame, identifiers, table)
    except StudyConfigurationError as error:
        raise ConfigError(f"field {field!r}: {path}: {error}") from None
    return identifiers, table
