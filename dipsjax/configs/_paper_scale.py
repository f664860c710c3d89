"""Shared settings of the paper-scale configs (``paper_1b``, ``paper_14b``, ``paper_100b``).

16 learner partitions of three speeds over three candidate sites for the parameter server.
These configs are for planning without hardware: ``dipsjax run paper_100b --dry-run``
prints the plan; running them needs the accelerators the plan names.
"""

import ml_collections

# Slowdowns of the 16 partitions: 8 fast, 4 at 1.5x, 4 at 2x (heterogeneous hardware).
SPEEDS = (1.0,) * 8 + (1.5,) * 4 + (2.0,) * 4
SITES = ("cluster-a", "cluster-b", "cluster-c")


def bandwidth_gbps():
    """[3 sites][16 partitions]: partitions 0-7 sit near cluster-a (25 Gbps, 10 to the
    others), 8-11 near cluster-b, 12-15 near cluster-c; cluster-c has the fastest single
    link (100 Gbps to partition 12) but not the most bandwidth to the frequent pushers."""
    rows = []
    for site in range(3):
        near = {0: range(0, 8), 1: range(8, 12), 2: range(12, 16)}[site]
        rows.append([25.0 if j in near else 10.0 for j in range(16)])
    rows[2][12] = 100.0
    return rows


def config(name, model, followers, seq_len=2048, batch_size=256, inner_steps=100):
    cfg = ml_collections.ConfigDict()
    cfg.name = name
    cfg.sim = dict(
        method="dips",
        learners=16,
        followers=followers,
        model=model,
        batch_size=batch_size,
        seq_len=seq_len,
        inner_steps=inner_steps,
        speeds=SPEEDS,
        wire="bf16",
    )
    cfg.placement = dict(sites=SITES, bandwidth_gbps=bandwidth_gbps())
    return cfg
