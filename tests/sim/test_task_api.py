"""The task API's contract (dipsjax.task): tasks named by import path from the current
folder, the task's inner optimizer or the config's, and clear errors for what a task gets
wrong."""

import dataclasses
import re
import textwrap

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
