"""Every notebook in notebooks/ runs top to bottom, and is committed without outputs.

Notebooks are executed by a Jupyter kernel in a separate process. So that the
kernel imports this checkout's packages and versions, the tests install a
``python3`` kernel spec whose command is this interpreter (``sys.executable``)
in a temporary folder and put that folder first on ``JUPYTER_PATH``; a
``python3`` kernel installed elsewhere (user or system) cannot take its place.
"""

from __future__ import annotations

import sys
from pathlib import Path

import nbformat
import pytest
from ipykernel.kernelspec import write_kernel_spec
from jupyter_client.kernelspec import KernelSpecManager
from nbclient import NotebookClient

NOTEBOOKS_DIR = Path(__file__).resolve().parents[2] / "notebooks"
NOTEBOOKS = sorted(NOTEBOOKS_DIR.glob("*.ipynb"))
DEEP_NOTEBOOKS = {"04_deep_model.ipynb"}
"""Notebooks that train torch networks: they need the deep extra."""
RUNNABLE = [
    pytest.param(path, marks=pytest.mark.deep) if path.name in DEEP_NOTEBOOKS else path
    for path in NOTEBOOKS
]
KERNEL_NAME = "python3"
TIMEOUT = 600


@pytest.fixture
def project_kernel(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A ``python3`` kernel that runs this interpreter; returns the kernel name."""
    jupyter_dir = tmp_path / "jupyter"
    write_kernel_spec(path=jupyter_dir / "kernels" / KERNEL_NAME)
    monkeypatch.setenv("JUPYTER_PATH", str(jupyter_dir))
    # Headless figures, whatever backend the calling shell may have set.
    monkeypatch.setenv("MPLBACKEND", "module://matplotlib_inline.backend_inline")
    spec = KernelSpecManager().get_kernel_spec(KERNEL_NAME)
    assert spec.argv[0] == sys.executable, spec.argv
    return KERNEL_NAME


def _execute(nb: nbformat.NotebookNode, kernel_name: str) -> nbformat.NotebookNode:
    client = NotebookClient(
        nb,
        timeout=TIMEOUT,
        kernel_name=kernel_name,
        resources={"metadata": {"path": str(NOTEBOOKS_DIR)}},
    )
    return client.execute()


def _stream_text(cell: nbformat.NotebookNode) -> str:
    return "".join(o.get("text", "") for o in cell.outputs if o.output_type == "stream")


def test_kernel_runs_this_interpreter(project_kernel: str) -> None:
    nb = nbformat.v4.new_notebook(
        cells=[nbformat.v4.new_code_cell("import sys\nprint(sys.executable)\nprint(sys.prefix)")]
    )
    executed = _execute(nb, project_kernel)
    assert _stream_text(executed.cells[0]).splitlines() == [sys.executable, sys.prefix]


@pytest.mark.parametrize("path", RUNNABLE, ids=lambda p: p.name)
def test_notebook_executes(path: Path, project_kernel: str) -> None:
    nb = nbformat.read(path, as_version=4)
    executed = _execute(nb, project_kernel)  # raises CellExecutionError naming the failing cell
    # Progress bars are widgets (ipywidgets, the test extra), not a warning that they cannot be.
    noisy = [i for i, cell in enumerate(executed.cells) if "IProgress not found" in _outputs(cell)]
    assert not noisy, f"{path.name}: cells {noisy} warn that ipywidgets is missing"


def _outputs(cell: nbformat.NotebookNode) -> str:
    """Every stream and rich text a cell printed (warnings arrive on stderr)."""
    texts = [o.get("text", "") for o in cell.get("outputs", [])]
    texts += [str(o.get("data", {}).get("text/plain", "")) for o in cell.get("outputs", [])]
    return "".join(texts)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_committed_without_outputs(path: Path) -> None:
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    dirty = [
        index
        for index, cell in enumerate(nb.cells)
        if cell.cell_type == "code" and (cell.outputs or cell.execution_count is not None)
    ]
    assert not dirty, f"{path.name}: code cells {dirty} have outputs or execution counts"
