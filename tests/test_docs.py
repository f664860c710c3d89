"""The documentation: the site builds with ``mkdocs build --strict``, the README's links
lead somewhere, and the code the pages show runs.

``--strict`` turns every warning into an error: a broken link or anchor between pages, a
page left out of the nav, an API reference (``::: dipsjax.task``) that does not resolve,
or a docstring griffe cannot read.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]

PAGES = (
    "index.md",
    "getting-started.md",
    "task.md",
    "own-loop.md",
    "methods.md",
    "running.md",
    "faults.md",
    "security.md",
    "benchmarks.md",
    "simulator.md",
)
API = {
    "api/outer.md": "dipsjax.outer",
    "api/task.md": "dipsjax.task",
    "api/learner.md": "dipsjax.learner",
    "api/sim.md": "dipsjax.sim",
    "api/messages.md": "dipsjax.syncer.messages",
}
# [text](target) links, not images; the target ends at whitespace or ')'.
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")


def _html(site: Path, page: str) -> Path:
    """Where mkdocs writes ``page`` (directory URLs: ``a/b.md`` -> ``a/b/index.html``)."""
    stem = page.removesuffix(".md")
    return site / ("index.html" if stem == "index" else f"{stem}/index.html")


def _code_block(text: str, first_line: str) -> str:
    """The fenced Python block of ``text`` whose first line is ``first_line``."""
    for block in re.findall(r"```python\n(.*?)```", text, flags=re.DOTALL):
        if block.startswith(first_line):
            return block
    raise AssertionError(f"no ```python block starting with {first_line!r}")


def test_site_builds_strict(tmp_path):
    site = tmp_path / "site"
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", "mkdocs.yml", "-d", site],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    for page in PAGES:
        assert _html(site, page).is_file(), f"{page} was not built"
    for page, module in API.items():
        html = _html(site, page).read_text(encoding="utf-8")
        # mkdocstrings renders the module with its full path as the heading's anchor.
        assert f'id="{module}"' in html, f"{page}: {module} was not rendered"
    task = _html(site, "api/task.md").read_text(encoding="utf-8")
    for name in ("dipsjax.task.Task", "dipsjax.task.DataSource", "dipsjax.task.load_task"):
        assert f'id="{name}"' in task, f"{name} missing from the API reference"


@pytest.mark.parametrize("doc", ["README.md", *(f"docs/{p}" for p in PAGES)])
def test_relative_links_exist(doc):
    """Every relative link of the README (as GitHub renders it) and of the pages points at
    a file of the repository; mkdocs checks the pages' anchors, this the files."""
    path = ROOT / doc
    missing = []
    for target in LINK.findall(path.read_text(encoding="utf-8")):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue  # http(s):, mailto:, or an anchor on the same page
        file = target.split("#", 1)[0]
        if not (path.parent / file).exists():
            missing.append(target)
    assert not missing, f"{doc} links to missing files: {missing}"


def test_readme_links_every_page():
    readme = ROOT / "README.md"
    linked = {t.split("#", 1)[0] for t in LINK.findall(readme.read_text(encoding="utf-8"))}
    for page in (*PAGES, *API):
        assert f"docs/{page}" in linked, f"the README does not link docs/{page}"


def test_readme_example_runs():
    """The README's example: the Di-PS outer optimizer in one's own loop converges."""
    code = _code_block((ROOT / "README.md").read_text(encoding="utf-8"), "import jax\n")
    code = code.replace("print(params[", "final = (params[")
    scope: dict = {}
    exec(compile(code, "README.md", "exec"), scope)
    np.testing.assert_allclose(np.asarray(scope["final"]), [0.0, 1.0, 2.0, 3.0], atol=0.3)


def test_task_example_runs(tmp_path, monkeypatch):
    """The task page's example builds through ``load_task`` from its config line and trains."""
    code = _code_block((ROOT / "docs" / "task.md").read_text(encoding="utf-8"), "# mypkg/tasks.py")
    pkg = tmp_path / "mypkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "tasks.py").write_text(code)
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in [m for m in sys.modules if m == "mypkg" or m.startswith("mypkg.")]:
        monkeypatch.delitem(sys.modules, name)

    import optax
    from flax import nnx

    from dipsjax.sim.config import SimConfig
    from dipsjax.task import DataSource, Task, check_source, load_task

    cfg = SimConfig(task="mypkg.tasks:get_task", task_args={"hidden": 32})
    task = load_task(cfg)
    assert isinstance(task, Task)
    src = task.source
    assert isinstance(src, DataSource)
    check_source(src, task.name)
    assert src.tokens_per_batch == cfg.batch_size
    first, again = src.batch(3, 5), src.batch(3, 5)
    assert first.keys() == again.keys()
    assert all(np.array_equal(first[k], again[k]) for k in first), "batch() must be deterministic"
    assert task.tokens_in(first) == cfg.batch_size

    model = task.model(nnx.Rngs(cfg.seed))
    opt = nnx.Optimizer(model, optax.adamw(cfg.inner_lr), wrt=nnx.Param)

    @nnx.jit
    def step(model, opt, batch):
        value, grads = nnx.value_and_grad(task.loss)(model, batch)
        opt.update(model, grads)
        return value

    before = sum(float(task.loss(model, b)) for b in task.validation)
    for i in range(64):
        step(model, opt, src.batch(i // src.batches_per_chunk, i % src.batches_per_chunk))
    after = sum(float(task.loss(model, b)) for b in task.validation)
    assert after < before, (before, after)
    right = [float(task.eval_metrics(model, b)["accuracy"]) for b in task.validation]
    assert sum(right) / len(right) >= 0.75, right  # four classes: chance is 1/4
    assert task.extra_metrics(after) == {}  # no metrics given: not a language model
