"""Reading a job's TOML configuration into a validated model, or a typed error.

Used by ``fedstats site run`` (``site.toml``) and ``fedstats study run``
(``study.toml``): a missing file, invalid TOML, an unknown key or a wrong
value becomes :class:`ConfigError`, whose message names the file, the field
path and what to do, never a traceback.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Annotated, Any, TypeVar

from pydantic import AfterValidator, BaseModel, ConfigDict, ValidationError, ValidationInfo

from fedstats.errors import ConfigError
from studyfiles.names import name_problem

Model = TypeVar("Model", bound=BaseModel)

STRICT = ConfigDict(extra="forbid", strict=True, frozen=True)
"""Every section of a job configuration: unknown keys refused, no type coercion, immutable."""


def _safe_name(value: str) -> str:
    problem = name_problem(value)
    if problem is not None:
        raise ValueError(problem)
    return value


Name = Annotated[str, AfterValidator(_safe_name)]
"""A site, study or fit name: 1-100 letters, digits, ``_ . -``, starting with a letter or digit
and not ending with a dot (:mod:`studyfiles.names`), so never ``.``, ``..`` or a path: safe as a
file or folder name."""


def resolve_path(value: object, info: ValidationInfo) -> object:
    """A path field's value, relative to the configuration file's folder when not absolute.

    For ``field_validator(..., mode="before")``: the folder is the ``base``
    in the validation context (:func:`load_toml_model` sets it); anything
    that is not a string or path is left for the field's own validation; a path holding a NUL
    character is refused.
    """
    if not isinstance(value, str | Path):
        return value
    if "\x00" in str(value):  # no file system takes it: a typed error naming the field
        raise ValueError("a path cannot contain a NUL character")
    path = Path(value)
    base = (info.context or {}).get("base")
    return path if path.is_absolute() or base is None else Path(base) / path


def read_toml_file(path: Path, error: type[Exception], *, what: str, hint: str) -> dict[str, Any]:
    """``path`` parsed as TOML, or ``error`` naming ``what``, the file and the problem.

    ``hint`` tells the reader which configuration field names the file (shown
    when it cannot be read). For files that are data, not configuration models
    (a roster, an enrolment list), each with its own typed error.
    """
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as problem:
        raise error(
            f"{what} {path}: cannot be read ({problem.strerror or problem}); {hint}"
        ) from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as problem:
        raise error(f"{what} {path}: not valid TOML ({problem})") from None


def load_toml_model(path: str | Path, model: type[Model], *, what: str) -> Model:
    """Read ``path`` as TOML and validate it as ``model``; paths in it stay relative to the file.

    ``what`` names the kind of file in messages (e.g. ``"site configuration"``).
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{path}: {what} not found; give the path of an existing file") from None
    except (OSError, UnicodeDecodeError) as error:
        raise ConfigError(f"{path}: cannot read the {what} ({error})") from None
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise ConfigError(f"{path}: not valid TOML ({error}); fix the syntax") from None
    try:
        return model.model_validate(raw, context={"base": path.resolve().parent})
    except ValidationError as error:
        problems = []
        for item in error.errors():
            field = ".".join(str(part) for part in item["loc"]) or "(top level)"
            problems.append(f"field {field!r}: {item['msg']}")
        raise ConfigError(
            f"{path}: invalid {what}: " + "; ".join(problems) + ". Fix these fields and run again."
        ) from None
