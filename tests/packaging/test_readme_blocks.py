"""Every Python block of the README runs as printed, in order, in one namespace (a reader goes
through the README top to bottom in one notebook). The "Use your own data" block needs the
reader's CSV and is run on one by ``test_readme_own_data.py``."""

from __future__ import annotations

import re
import textwrap
import warnings
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[2] / "README.md"
OWN_DATA = "\n## Use your own data\n"


def readme_blocks() -> list[tuple[int, str]]:
    """``(line, code)`` of every ``python`` block before the "Use your own data" section."""
    text = README.read_text(encoding="utf-8").split(OWN_DATA, 1)[0]
    blocks = []
    for match in re.finditer(r"```python\n(.*?)```", text, flags=re.DOTALL):
        code = textwrap.dedent(match.group(1))  # a block inside a list item is indented
        blocks.append((text[: match.start()].count("\n") + 1, code))
    return blocks


@pytest.mark.xdist_group("readme")
def test_every_readme_python_block_runs_in_order(tmp_path, monkeypatch):
    pytest.importorskip("torch")  # the deep-model block needs the deep extra
    monkeypatch.chdir(tmp_path)  # ledgers and study folders the blocks write
    namespace: dict = {"__name__": "readme"}
    blocks = readme_blocks()
    assert len(blocks) >= 12
    for line, code in blocks:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # utility and convergence warnings are the point
            try:
                exec(compile(code, f"README.md:{line}", "exec"), namespace)
            except Exception as error:  # noqa: BLE001 - name the block that failed
                pytest.fail(f"README block at line {line} raised {type(error).__name__}: {error}")
