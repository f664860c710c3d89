"""``dipsjax run run_config.py``: the spirals task (spirals.py) across a local job: a leader,
one follower and two learners of different speeds, Di-PS, the followers' outer step the
task's own (``outer="sgd"``: momentum SGD in place of the papers' Nesterov)."""

import ml_collections


def get_config(arg=None):
    cfg = ml_collections.ConfigDict()
    cfg.name = "spirals"
    cfg.sim = dict(
        method="dips",
        task="spirals:get_task",
        task_args={"hidden": 32, "outer": "sgd"},
        learners=2,
        followers=1,
        batch_size=32,
        inner_steps=8,
        inner_lr=1e-2,
        token_budget=2 * 8 * 32 * (6 if arg == "ci" else 40),
        speeds=(1.0, 1.5),
        eval_every=2,
        seed=0,
    )
    cfg.heartbeat_interval = 1.0
    cfg.launch = dict(learner=dict(cpus=1))
    return cfg
