"""The task API's contract (dipsjax.task): tasks named by import path from the current
folder, the task's inner optimizer or the config's, and clear errors for what a task gets
wrong."""

import dataclasses
import re
import textwrap

import jax
import numpy as np
import optax
import pytest
from flax import nnx

from dipsjax.learner import InnerStep
from dipsjax.sim.config import SimConfig
from dipsjax.task import Task, load_task

TASK = textwrap.dedent(
    """
    import numpy as np, optax
    from flax import nnx
    from dipsjax.task import Task

    class Source:
        num_chunks, batches_per_chunk, tokens_per_batch = 4, 2, 8
        def batch(self, chunk, index):
            rng = np.random.default_rng((chunk, index))
            return {"x": rng.standard_normal((8, 3)).astype(np.float32)}

    class Lin(nnx.Module):
        def __init__(self, rngs):
            self.w = nnx.Linear(3, 1, rngs=rngs)
        def __call__(self, x):
            return self.w(x)

    def loss(model, batch):
        return ((model(batch["x"]) - 1.0) ** 2).mean()

    def get_task(cfg, sgd=False, broken=None):
        if broken == "not_a_task":
            return "oops"
        data = Source
        if broken == "source":
            data = lambda: object()
        model = lambda rngs: Lin(rngs)
        if broken == "state":
            model = lambda rngs: nnx.Sequential(Lin(rngs), nnx.BatchNorm(1, rngs=rngs))
        val = [Source().batch(9, i) for i in range(2)]
        return Task(name="lin", model=model, loss=loss, data=data, eval_batches=val,
                    inner_optimizer=optax.sgd(0.1) if sgd else None)
    """
)


@pytest.fixture
def here(tmp_path, monkeypatch):
    (tmp_path / "lin_task.py").write_text(TASK)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_a_task_from_the_current_folder_with_its_own_or_the_config_s_inner_optimizer(here):
    cfg = SimConfig(task="lin_task:get_task", inner_weight_decay=0.1, inner_clip=None)
    task = load_task(cfg)
    assert task.source.num_chunks == 4 and task.tokens_in({"x": np.zeros((8, 3))}) == 8
    assert load_task(cfg) is task  # built once per process and config
    inner = InnerStep(task, cfg.inner_optimizer(), mesh=None)
    assert inner.optimizer == cfg.inner_optimizer() and inner.optimizer.weight_decay == 0.1
    params = inner.init_params(0)
    params, _, metrics = inner.step(
        params, inner.init_opt_state(params), inner.put_batch(task.source.batch(0, 0))
    )
    assert np.isfinite(float(metrics["loss"]))
    own = load_task(dataclasses.replace(cfg, task_args={"sgd": True}))
    assert isinstance(InnerStep(own, mesh=None).tx, optax.GradientTransformation)
    assert InnerStep(own, mesh=None).optimizer is own.inner_optimizer


@pytest.mark.parametrize(
    ("task", "args", "error", "match"),
    [
        ("no_such_module:get_task", {}, ValueError, "cannot import 'no_such_module'"),
        ("lin_task:nope", {}, ValueError, "has no 'nope'"),
        (
            "lin_task:get_task",
            {"broken": "not_a_task"},
            TypeError,
            "returned str, not a dipsjax Task",
        ),
        ("lin_task:get_task", {"broken": "source"}, TypeError, "is not a DataSource"),
        ("lin_task:get_task", {"broken": "state"}, ValueError, "state other than nnx.Param"),
    ],
)
def test_what_a_task_gets_wrong_is_named(here, task, args, error, match):
    with pytest.raises(error, match=match):
        t = load_task(SimConfig(task=task, task_args=args))
        t.source  # noqa: B018  (built on first use)
        InnerStep(t, mesh=None)


def test_a_task_path_without_a_function_is_refused_by_the_config():
    with pytest.raises(
        ValueError, match=re.escape("SimConfig.task must be 'package.module:function'")
    ):
        SimConfig(task="mypkg.tasks")
    with pytest.raises(TypeError, match=re.escape("Task.model must be callable")):
        Task(name="x", model=None, loss=lambda m, b: 0.0, data=lambda: None)
    assert nnx  # (the module is imported by the tasks above)


def test_data_parallel_trains_a_task_with_dict_batches(here):
    """``method='dp'`` (one batch of every learner a step, concatenated leaf by leaf)
    counts what the task's batches count: 8 a batch here, not ``batch_size * seq_len``."""
    from dipsjax.sim.simulator import simulate

    cfg = SimConfig(
        method="dp", task="lin_task:get_task", learners=2, inner_steps=2, token_budget=64
    )
    res = simulate(cfg)
    assert res.tokens.consumed == res.tokens.applied == 64  # 4 steps of 2 batches of 8
    assert res.rounds == 4 and np.isfinite(res.final_loss)
    assert np.isnan(res.final_bpb)  # no bits per byte: not a language model


def test_task_arguments_are_scalars_or_lists():
    cfg = SimConfig(task_args={"hidden": 8, "sizes": [1, 2], "name": "x"})
    assert dict(cfg.task_args) == {"hidden": 8, "sizes": (1, 2), "name": "x"}
    with pytest.raises(ValueError, match="task argument of type dict"):
        SimConfig(task_args={"nested": {"a": 1}})


FIGURES_TASK = textwrap.dedent(
    """
    import jax.numpy as jnp
    import numpy as np
    from flax import nnx
    from dipsjax.task import Task

    class Source:
        num_chunks, batches_per_chunk, tokens_per_batch = 4, 2, 8
        def batch(self, chunk, index):
            rng = np.random.default_rng((chunk, index))
            return {"x": rng.standard_normal((8, 3)).astype(np.float32)}

    class Lin(nnx.Module):
        def __init__(self, rngs):
            self.w = nnx.Linear(3, 1, rngs=rngs)
        def __call__(self, x):
            return self.w(x)[:, 0]

    def loss(model, batch):
        return ((model(batch["x"]) - 1.0) ** 2).mean()

    def figures(model, batch, broken=None):
        pred = model(batch["x"])
        if broken in ("loss", "bpb"):
            return {broken: pred.mean()}
        if broken == "shape":
            return {"above": pred}
        return {"above": (pred > 0.0).mean(), "mae": jnp.abs(pred - 1.0).mean()}

    def get_task(cfg, broken=None):
        # Validation batches of 8, 3 and 5 examples, each counting its examples.
        rng = np.random.default_rng(7)
        val = [{"x": rng.standard_normal((n, 3)).astype(np.float32)} for n in (8, 3, 5)]
        return Task(name="lin", model=Lin, loss=loss, data=Source, eval_batches=val,
                    count=lambda b: len(b["x"]),
                    eval_metrics=lambda m, b: figures(m, b, broken))
    """
)


def test_a_task_s_own_figures_are_count_weighted_means_beside_the_loss(tmp_path, monkeypatch):
    """``Task.eval_metrics``: computed with the loss (under jit) on every validation batch
    and averaged weighted by ``count(batch)``, as the loss is; checked against the same
    figures computed batch by batch on the model itself, in NumPy."""
    from dipsjax.export import put_params
    from dipsjax.sim.world import World, figures_text

    (tmp_path / "figures_task.py").write_text(FIGURES_TASK)
    monkeypatch.chdir(tmp_path)
    cfg = SimConfig(task="figures_task:get_task", learners=1, seed=3)
    world = World(cfg)
    params = jax.tree.map(lambda x: np.asarray(x) * 0.5, world.init_params)
    got = world.evaluate(params)
    model = put_params(world.task.model(nnx.Rngs(0)), params)
    preds = [np.asarray(model(b["x"]), np.float64) for b in world.task.validation]
    n = np.array([len(p) for p in preds], np.float64)
    assert got.count == 16 and list(n) == [8, 3, 5]
    want = {
        "loss": [np.mean((p - 1.0) ** 2) for p in preds],
        "above": [np.mean(p > 0.0) for p in preds],
        "mae": [np.mean(np.abs(p - 1.0)) for p in preds],
    }
    want = {k: float(np.sum(np.array(v) * n) / n.sum()) for k, v in want.items()}
    # the unweighted mean of the batches' figures differs: the weights matter here
    assert abs(np.mean([np.mean(p > 0.0) for p in preds]) - want["above"]) > 0.01
    assert got.loss == pytest.approx(want["loss"], rel=1e-5)
    assert got.metrics.keys() == {"above", "mae"}
    assert got.metrics["above"] == pytest.approx(want["above"], rel=1e-6)
    assert got.metrics["mae"] == pytest.approx(want["mae"], rel=1e-5)
    point = got.point()
    assert list(point) == ["val_loss", "val_bpb", "val_above", "val_mae"]
    assert np.isnan(point["val_bpb"]) and point["val_above"] == got.metrics["above"]
    assert figures_text(point) == (
        f"val_loss={got.loss:.4f} val_above={point['val_above']:.4f} val_mae={point['val_mae']:.4f}"
    )


@pytest.mark.parametrize(
    ("broken", "match"),
    [
        ("loss", r"eval_metrics names \['loss'\] clash"),
        ("bpb", r"eval_metrics names \['bpb'\] clash"),
        ("shape", "'above' must be a scalar"),
    ],
)
def test_what_a_task_s_own_figures_get_wrong_is_named(tmp_path, monkeypatch, broken, match):
    from dipsjax.sim.world import World

    (tmp_path / "figures_task.py").write_text(FIGURES_TASK)
    monkeypatch.chdir(tmp_path)
    world = World(SimConfig(task="figures_task:get_task", task_args={"broken": broken}))
    with pytest.raises(ValueError, match=match):
        world.evaluate(world.init_params)
    with pytest.raises(TypeError, match=re.escape("Task.eval_metrics must be callable or None")):
        Task(
            name="x",
            model=lambda r: None,
            loss=lambda m, b: 0.0,
            data=lambda: None,
            eval_metrics="accuracy",
        )


def test_the_config_s_adam_betas_and_epsilon_reach_the_inner_optimizer():
    """``inner_b1`` / ``inner_b2`` / ``inner_eps``: the learners' AdamW takes the config's,
    step for step the same as optax's own ``adamw`` with them (no clip, no decay)."""
    from dipsjax.learner.step import make_inner_optimizer

    cfg = SimConfig(inner_b1=0.8, inner_b2=0.99, inner_eps=1e-6, inner_clip=None)
    ours = make_inner_optimizer(cfg.inner_optimizer())
    theirs = optax.adamw(cfg.inner_lr, b1=0.8, b2=0.99, eps=1e-6, weight_decay=0.0)
    default = make_inner_optimizer(SimConfig(inner_clip=None).inner_optimizer())
    params = {"w": np.ones((3, 2), np.float32)}
    grads = [{"w": np.full((3, 2), g, np.float32)} for g in (0.5, -2.0, 1e-4)]
    outs = []
    for tx in (ours, theirs, default):
        p, state = params, tx.init(params)
        for g in grads:
            u, state = tx.update(g, state, p)
            p = optax.apply_updates(p, u)
        outs.append(np.asarray(p["w"]))
    np.testing.assert_allclose(outs[0], outs[1], rtol=1e-6)
    assert not np.allclose(outs[0], outs[2], rtol=1e-4)  # the defaults (0.9, 0.95) differ


@pytest.mark.parametrize(
    ("field", "value"), [("inner_b2", 1.0), ("inner_b1", -0.1), ("inner_eps", 0.0)]
)
def test_bad_adam_settings_are_refused_with_the_field_named(field, value):
    with pytest.raises(ValueError, match=f"{field.removeprefix('inner_')} must be"):
        SimConfig(**{field: value})
