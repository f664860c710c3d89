"""Every notebook in colabs/ executes top to bottom (its cells assert their own results).

Notebooks run on their tiny settings: the kernel inherits ``DIPSJAX_NOTEBOOK_TINY=1`` and
writes what it produces under ``DIPSJAX_NOTEBOOK_OUT`` (a temporary folder). Notebooks with
an entry in ``CHECKS`` are then checked against what they wrote and displayed.

Each notebook is what its builder (colabs/_build_NAME.py) writes, byte for byte, and opens
with an "Open in Colab" badge and an install cell that does something on Colab only.
"""

import json
import math
import pathlib
import subprocess
import sys
import types

import nbformat
import pytest
from nbclient import NotebookClient

from dipsjax.sim import goodput as gp

ROOT = pathlib.Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "colabs").glob("*.ipynb"))


def _outputs(nb, kind):
    """Every output of the executed notebook carrying MIME type ``kind``."""
    return [
        o["data"][kind]
        for c in nb.cells
        if c.cell_type == "code"
        for o in c.get("outputs", [])
        if o.output_type in ("display_data", "execute_result") and kind in o.get("data", {})
    ]


def _check_heterogeneity(nb, out):
    out = out / "heterogeneity"
    res = json.loads((out / "results.json").read_text())
    assert res["tiny"]
    methods, etas = res["methods"], res["etas"]
    assert set(methods) == {"dp", "sync_diloco", "naive_async", "dips", "decoupled"}
    assert len(etas) >= 2
    runs = {(r["method"], r["eta"]): r for r in res["runs"]}
    assert set(runs) == {(m, e) for m in methods for e in etas}  # a result per (method, eta)
    targets = {"time_to_target": res["target"], "time_to_reference": res["reference"]}
    for (method, eta), r in runs.items():
        losses = [p["val_loss"] for p in r["curve"]]
        assert losses and all(math.isfinite(x) for x in losses), (method, eta)
        assert r["final_val_loss"] == losses[-1]
        assert 0.0 <= r["idle_fraction"] < 1.0 and r["tokens_per_second"] > 0
        # The time to a target is the curve's first crossing (or none if it never crosses).
        for key, target in targets.items():
            crossed = [p["t"] for p in r["curve"] if p["val_loss"] <= target]
            if r[key] is None:
                assert not crossed, (method, eta, key)
            else:
                assert crossed and r[key] <= crossed[0] + 1e-9, (method, eta, key)
        # The table is what the simulator measured (run_experiment's metrics.json).
        metrics = json.loads((out / f"eta{eta}" / "metrics.json").read_text())["runs"][method]
        assert metrics["final_val_loss"] == r["final_val_loss"]
        assert metrics["tokens_per_second"] == r["tokens_per_second"]
    lo, hi = min(etas), max(etas)
    # Barriers wait for the slowest learner: the synchronous methods lose throughput as eta
    # grows; Di-PS keeps the fast learners busy.
    for method in ("dp", "sync_diloco"):
        assert runs[method, hi]["tokens_per_second"] < runs[method, lo]["tokens_per_second"]
    assert runs["dips", hi]["tokens_per_second"] > runs["sync_diloco", hi]["tokens_per_second"]
    assert runs["dips", hi]["idle_fraction"] < runs["sync_diloco", hi]["idle_fraction"]
    # The figures: written and shown; the table: a row per (method, eta).
    for name in ("loss_vs_time.png", "loss_vs_tokens.png", "vs_eta.png"):
        assert (out / name).stat().st_size > 10_000, name
    assert len(_outputs(nb, "image/png")) >= 3
    table = next(md for md in _outputs(nb, "text/markdown") if md.startswith("Target loss"))
    for method in methods:
        for eta in etas:
            assert f"| {eta} | {method} |" in table


def _check_goodput(nb, out):
    out = out / "goodput"
    res = json.loads((out / "goodput.json").read_text())
    assert res["days"] < 30  # the tiny horizon
    assert res["chips"] == [150_000, 1_200_000, 2_400_000]
    # The notebook's table is the library's, computed here directly.
    direct = gp.sweep(res["chips"], res["methods"], horizon_days=res["days"], seed=res["seed"])
    closed = gp.sweep(res["chips"], res["methods"], use_analytic=True)
    for label in res["methods"]:
        for n in res["chips"]:
            assert res["percent"][label][str(n)] == pytest.approx(direct[label][n], abs=1e-9)
            assert res["analytic_percent"][label][str(n)] == pytest.approx(
                closed[label][n], abs=1e-9
            )
    pct = res["percent"]
    assert abs(pct["elastic_dp"]["1200000"] - 58) <= 3  # the paper's anchors
    assert abs(pct["decoupled_m8"]["1200000"] - 88) <= 3
    # The curves: goodput falls with chips and with the failure rate, rises with M.
    curves = res["curves"]
    for label in res["methods"]:
        by_chips = curves["chips"][label]["percent"]
        by_rate = curves["failure_rate"][label]["percent"]
        assert by_chips[0] > by_chips[-1] and by_rate[0] > by_rate[-1], label
    for n, c in curves["partitions"].items():
        assert c["learners"] == sorted(c["learners"])
        assert c["percent"][-1] > c["percent"][0], n
        assert c["percent"][-1] > pct["elastic_dp"][n], n
    for name in ("chips", "failure_rate", "partitions"):
        assert (out / f"goodput_vs_{name}.png").stat().st_size > 10_000, name
    assert len(_outputs(nb, "image/png")) >= 3
    table = next(md for md in _outputs(nb, "text/markdown") if md.startswith("Goodput"))
    for n in res["chips"]:
        assert f"| {gp.format_count(n)} |" in table


def _check_local_cluster(nb, out):
    """The job the notebook started ran to its budget, its books balance, every role wrote
    TensorBoard scalars, and no process of it is left."""
    from dipsjax.runtime.tbread import run_scalars

    (run,) = [p for p in (out / "local_cluster").iterdir() if p.is_dir()]
    summary = json.loads((run / "summary.json").read_text())
    books = summary["leader_tokens"]
    assert books["reported"] >= 4 * 16 * 512 * 4  # quickstart --arg ci: its budget
    assert summary["tokens"] == books["applied"] + books["rejected"]
    tb = run_scalars(run)
    assert {"leader", "follower0", "follower1", "eval"} | {f"learner{j}" for j in range(4)} <= set(
        tb
    )
    assert (run / "timeline.png").stat().st_size > 10_000
    for pid in json.loads((run / "pids.json").read_text()).values():
        stat = pathlib.Path(f"/proc/{pid}/stat")
        assert not stat.exists() or stat.read_text().rsplit(")", 1)[1].split()[0] == "Z", pid


def _check_own_task(nb, out):
    """The user's task trained across a job to its budget, its validation loss fell, the
    export holds the model's parameters, and both figures were shown."""
    work = out / "own_task"
    summary = json.loads((work / "run" / "summary.json").read_text())
    spec = json.loads((work / "run" / "spec.json").read_text())
    assert spec["sim"]["task"] == "my_task:get_task"
    books = summary["leader_tokens"]
    assert books["reported"] >= spec["sim"]["token_budget"] == 2 * 8 * 32 * 6
    curve = [p["val_loss"] for p in summary["curve"]]
    assert curve[-1] < 0.5 * curve[0], curve
    meta = json.loads((work / "export" / "meta.json").read_text())
    assert meta["version"] == summary["curve"][-1]["version"]
    assert (work / "export" / "params.safetensors").stat().st_size > 0
    assert len(_outputs(nb, "image/png")) >= 2


CHECKS = {
    "heterogeneity.ipynb": _check_heterogeneity,
    "goodput.ipynb": _check_goodput,
    "local_cluster.ipynb": _check_local_cluster,
    "own_task.ipynb": _check_own_task,
}

#: The notebooks that read a text corpus: on Colab their install cell fetches it (pip only).
CORPUS_NOTEBOOKS = {"event_tape", "heterogeneity", "local_cluster"}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_executes(path, tmp_path, monkeypatch):
    monkeypatch.setenv("DIPSJAX_NOTEBOOK_TINY", "1")
    monkeypatch.setenv("DIPSJAX_NOTEBOOK_OUT", str(tmp_path))
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
    if path.name in CHECKS:
        CHECKS[path.name](nb, tmp_path)


def test_notebooks_exist():
    names = {p.name for p in NOTEBOOKS}
    assert {"outer_transforms.ipynb", "event_tape.ipynb", "heterogeneity.ipynb"} <= names
    assert {"goodput.ipynb", "local_cluster.ipynb", "own_task.ipynb"} <= names
    # Each notebook is written by its builder (colabs/_build_NAME.py).
    for p in NOTEBOOKS:
        assert (ROOT / "colabs" / f"_build_{p.stem}.py").is_file(), p.name


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_is_what_its_builder_writes(path, tmp_path):
    out = tmp_path / path.name
    subprocess.run(
        [sys.executable, str(ROOT / "colabs" / f"_build_{path.stem}.py"), str(out)],
        cwd=ROOT,
        check=True,
    )
    assert out.read_bytes() == path.read_bytes(), f"run python colabs/_build_{path.stem}.py"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_opens_in_colab_and_installs_there_only(path, monkeypatch):
    """The badge opens this notebook of the main branch in Colab; the install cell runs
    ``pip install`` of dipsjax (and the pip-only fetch of the corpus it reads) when
    ``google.colab`` is imported, and nothing elsewhere."""
    nb = nbformat.read(path, as_version=4)
    first, install = nb.cells[0], nb.cells[1]
    url = f"https://colab.research.google.com/github/dipsjax/dipsjax/blob/main/colabs/{path.name}"
    assert first.cell_type == "markdown"
    assert first.source.startswith(
        f"[![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)]({url})"
    )
    assert install.cell_type == "code" and '"google.colab" in sys.modules' in install.source
    calls = []
    monkeypatch.setattr(subprocess, "run", lambda cmd, **kw: calls.append(cmd[1:]))
    monkeypatch.delitem(sys.modules, "google.colab", raising=False)
    exec(install.source, {})
    assert calls == []  # not on Colab: nothing
    monkeypatch.setitem(sys.modules, "google.colab", types.ModuleType("google.colab"))
    exec(install.source, {})
    fetch = [["-m", "dipsjax.data.fetch", "shakespeare"]] if path.stem in CORPUS_NOTEBOOKS else []
    assert calls == [
        ["-m", "pip", "install", "-q", "dipsjax[run] @ git+https://github.com/dipsjax/dipsjax"],
        *fetch,
    ]
