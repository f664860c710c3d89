"""Shared settings of the simulator experiments (imported by the sim_*.py configs).

``arg='ci'`` shrinks every experiment to a CI-sized run (tiny model, small token budget,
2048 validation tokens).
"""

import ml_collections

# 4 learners x H=16 steps x (8 x 64) tokens = 32768 tokens per full round.
BASE = dict(
    model="tiny",
    batch_size=8,
    seq_len=64,
    inner_steps=16,
    inner_lr=3e-3,
    token_budget=4 * 16 * 512 * 12,
    step_time=1.0,
    step_noise=0.05,
    virtual_params=1e9,
    wire="bf16",
    update_seconds=2.0,
)


def experiment(name, runs, arg=None, **base_overrides):
    cfg = ml_collections.ConfigDict()
    cfg.name = name
    base = {**BASE, **base_overrides}
    if arg == "ci":
        base["token_budget"] = 4 * 16 * 512 * 6
        base["eval_tokens"] = 2048  # the harness, not the figure (default: 32768)
    cfg.base = base
    cfg.runs = runs
    return cfg
