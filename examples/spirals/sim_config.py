"""``dipsjax simulate sim_config.py``: the spirals task (spirals.py) in the simulator, Di-PS
against synchronous DiLoCo with learners of different speeds."""

import ml_collections


def get_config(arg=None):
    cfg = ml_collections.ConfigDict()
    cfg.name = "spirals_sim"
    cfg.base = dict(
        task="spirals:get_task",
        learners=2,
        followers=1,
        batch_size=32,
        inner_steps=8,
        inner_lr=1e-2,
        token_budget=2 * 8 * 32 * (6 if arg == "ci" else 40),
        eta=50,
        eval_every=2,
    )
    cfg.runs = [dict(label="dips", method="dips")]
    if arg != "ci":
        cfg.runs.append(dict(label="sync_diloco", method="sync_diloco"))
    return cfg
