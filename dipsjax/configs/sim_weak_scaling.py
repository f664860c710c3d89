"""Weak scaling 1..16 learners (Di-PS sec. 13): the first 8 identical, then slower ones;
learner 0 on a 1 Gbps link, the rest on 10 Gbps. Efficiency = aggregate tokens/s over the
sum of every learner's standalone tokens/s (no outer communication).

Run: ``.venv/bin/dipsjax simulate sim_weak_scaling``.
"""

from dipsjax.configs import _sim_common as common


def speeds(m):
    """Step-time factors: 8 identical learners, then each next one 25% slower."""
    return tuple(1.0 if j < 8 else 1.0 + 0.25 * (j - 7) for j in range(m))


def get_config(arg=None):
    runs = []
    for m in (1, 2, 4, 8, 12, 16):
        for method in ("sync_diloco", "dips"):
            runs.append(
                dict(
                    label=f"{method}_m{m}",
                    method=method,
                    learners=m,
                    speeds=speeds(m),
                    bandwidth_gbps=(1.0,) + (10.0,) * (m - 1),
                    token_budget=m * 16 * 512 * 6,
                )
            )
    return common.experiment("sim_weak_scaling", runs, arg)
