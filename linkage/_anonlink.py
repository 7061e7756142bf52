"""anonlink, imported where setuptools no longer ships ``pkg_resources``.

anonlink 0.15.3's ``__init__`` runs ``import pkg_resources`` only to read its own
version (``pkg_resources.get_distribution('anonlink').version``); setuptools removed
``pkg_resources`` in version 82. When it is absent, a stand-in answering exactly that
call from :mod:`importlib.metadata` is visible during anonlink's import only, then
removed, so nothing else sees it.
"""

from __future__ import annotations

import importlib.metadata
import sys
import types


def _import_anonlink() -> types.ModuleType:
    try:
        import anonlink
    except ModuleNotFoundError as error:
        if error.name != "pkg_resources":
            raise
    else:
        return anonlink
    stand_in = types.ModuleType("pkg_resources")
    stand_in.get_distribution = lambda name: types.SimpleNamespace(  # type: ignore[attr-defined]
        version=importlib.metadata.version(name)
    )
    sys.modules["pkg_resources"] = stand_in
    try:
        import anonlink
    finally:
        del sys.modules["pkg_resources"]
    return anonlink


anonlink = _import_anonlink()
blocking = anonlink.blocking
candidate_generation = anonlink.candidate_generation
similarities = anonlink.similarities
solving = anonlink.solving
