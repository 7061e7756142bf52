"""Every test here trains or builds a torch network: without the deep extra each module is
skipped, with the reason, before it imports torch."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

DEEP_EXTRA = all(importlib.util.find_spec(name) is not None for name in ("torch", "opacus"))


class _NeedsDeepExtra(pytest.Module):
    def collect(self):  # type: ignore[override]
        pytest.skip(
            "needs the deep extra (torch, Opacus): pip install 'fedstats[deep]'",
            allow_module_level=True,
        )


def pytest_pycollect_makemodule(module_path: Path, parent: pytest.Collector):
    if DEEP_EXTRA:
        return None
    return _NeedsDeepExtra.from_parent(parent, path=module_path)
