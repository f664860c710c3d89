"""Every notebook in colabs/ executes top to bottom (its cells assert their own results)."""

import pathlib

import nbformat
import pytest
from nbclient import NotebookClient

ROOT = pathlib.Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "colabs").glob("*.ipynb"))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_executes(path):
    nb = nbformat.read(path, as_version=4)
    NotebookClient(
        nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(ROOT)}}
    ).execute()
    errors = [
        o
        for c in nb.cells
        if c.cell_type == "code"
        for o in c.get("outputs", [])
        if o.output_type == "error"
    ]
    assert not errors


def test_notebooks_exist():
    assert any(p.name == "outer_transforms.ipynb" for p in NOTEBOOKS)
