"""What every notebook builder (colabs/_build_NAME.py) shares: the "Open in Colab" badge,
the install cell, and writing the notebook.

``write(name, cells)`` puts the badge at the top of the first (markdown) cell, the install
cell right after it, gives the cells fixed ids (``c00``, ``c01``...) and formats the file
with ruff, so running a builder again gives the committed file byte for byte
(tests/test_notebooks.py checks it). A builder writes ``colabs/NAME.ipynb``, or the path
given as its first argument::

    python colabs/_build_local_cluster.py            # from the repository root
"""

from __future__ import annotations

import pathlib
import subprocess
import sys

import nbformat as nbf

ROOT = pathlib.Path(__file__).resolve().parents[1]
OWNER = "dipsjax"
"""The GitHub owner of the repository (a placeholder until the repository is public)."""
REPO = f"https://github.com/{OWNER}/dipsjax"
PIP_SPEC = f"dipsjax[run] @ git+{REPO}"
"""What the install cell gives ``pip install`` on Colab: the package with its ``run`` extra
(the runtime, the simulator's experiments and plots, the corpus fetch)."""
BADGE_IMAGE = "https://colab.research.google.com/assets/colab-badge.svg"


def colab_url(name: str) -> str:
    """The notebook ``colabs/NAME.ipynb`` of the main branch, opened in Colab."""
    return f"https://colab.research.google.com/github/{OWNER}/dipsjax/blob/main/colabs/{name}.ipynb"


def badge(name: str) -> str:
    return f"[![Open In Colab]({BADGE_IMAGE})]({colab_url(name)})"


def install_cell(corpora: tuple[str, ...] = ()) -> str:
    """The cell that, on Colab only, installs dipsjax with pip and fetches ``corpora``
    (``python -m dipsjax.data.fetch``; pip only); elsewhere it does nothing."""
    lines = (
        [
            "# On Colab: install dipsjax and its runtime extra with pip, and fetch the texts this",
            "# notebook reads (pip alone). Elsewhere (a clone, the test suite) this does nothing.",
        ]
        if corpora
        else [
            "# On Colab: install dipsjax and its runtime extra with pip. Elsewhere (a clone of the",
            "# repository, the test suite) this cell does nothing.",
        ]
    ) + [
        "import sys",
        "",
        'if "google.colab" in sys.modules:',
        "    import subprocess",
        "",
        f'    spec = "{PIP_SPEC}"  # or the path of a clone',
        '    subprocess.run([sys.executable, "-m", "pip", "install", "-q", spec], check=True)',
    ]
    if corpora:
        names = ", ".join(f'"{c}"' for c in corpora)
        lines.append(
            f'    subprocess.run([sys.executable, "-m", "dipsjax.data.fetch", {names}], check=True)'
        )
    return "\n".join(lines)


def notebook(name: str, cells: list[tuple[str, str]], corpora: tuple[str, ...] = ()):
    """The notebook of ``cells`` (``("md" | "code", source)`` pairs, a markdown cell first)
    with the badge and the install cell."""
    (kind, first), *rest = cells
    assert kind == "md", "a notebook starts with its markdown title"
    cells = [("md", badge(name) + "\n\n" + first), ("code", install_cell(corpora)), *rest]
    nb = nbf.v4.new_notebook()
    nb.metadata["kernelspec"] = {
        "name": "python3",
        "display_name": "Python 3",
        "language": "python",
    }
    nb.metadata["colab"] = {"provenance": []}
    nb.cells = [
        nbf.v4.new_markdown_cell(src) if kind == "md" else nbf.v4.new_code_cell(src)
        for kind, src in cells
    ]
    for i, cell in enumerate(nb.cells):
        cell["id"] = f"c{i:02d}"
    return nb


def write(name: str, cells: list[tuple[str, str]], corpora: tuple[str, ...] = ()) -> pathlib.Path:
    """Writes ``colabs/NAME.ipynb`` (or ``sys.argv[1]``), ruff-formatted; returns its path."""
    path = pathlib.Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "colabs" / f"{name}.ipynb"
    nbf.write(notebook(name, cells, corpora), path)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "ruff",
            "format",
            "-q",
            "--config",
            str(ROOT / "pyproject.toml"),
            str(path),
        ],
        check=True,
    )
    return path
