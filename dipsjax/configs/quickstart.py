"""The main job: ``dipsjax run`` (this config by default).

A leader, 2 followers and 4 learners of different speeds (slowdown factors 1, 1.3, 1.6, 2)
train the tiny model on the Austen corpus with Di-PS for a few minutes on one machine.

Run: ``.venv/bin/dipsjax run`` (``--method sync_diloco`` for another method, ``--arg ci``
for a short run).
"""

import ml_collections


def get_config(arg=None):
    cfg = ml_collections.ConfigDict()
    cfg.name = "quickstart"
    cfg.sim = dict(
        method="dips",
        learners=4,
        followers=2,
        model="tiny",
        corpus="austen",
        batch_size=8,
        seq_len=64,
        chunk_len=4096,
        inner_steps=16,
        inner_lr=3e-3,
        outer_lr=0.7,
        outer_momentum=0.8,
        token_budget=4 * 16 * 512 * (4 if arg == "ci" else 24),
        eval_tokens=2048 if arg == "ci" else 32768,  # ci: the harness, not the figure
        speeds=(1.0, 1.3, 1.6, 2.0),
        wire="bf16",
        seed=0,
    )
    cfg.heartbeat_interval = 2.0
    # How the jobs run (dipsjax.launch.Requirements fields; executors' settings): override
    # with e.g. --set launch.learner.cpu_devices=2 or --set launch.slurm.partition=gpu.
    cfg.launch = dict(
        learner=dict(cpus=1),
        slurm=dict(time="00:30:00"),
        kubernetes=dict(image="dipsjax:latest"),
    )
    return cfg
