"""Communication ablation (Di-PS sec. 15): 16 learners, the slowest link at 10 / 5 / 1 Gbps
and the rest at 10 Gbps; total outer communication time of Di-PS (point-to-point pushes and
pulls through the followers) against the decentralized Async DiLoCo baseline (every learner
sends its pseudo-gradient to every other learner). Paper: Di-PS 1.06-4.69x less.

Run: ``.venv/bin/dipsjax simulate sim_comm`` (``--arg ci``: 4 learners).
"""

from dipsjax.configs import _sim_common as common


def get_config(arg=None):
    m = 4 if arg == "ci" else 16
    runs = []
    for gbps in (10.0, 5.0, 1.0):
        for method in ("dips", "async_diloco"):
            runs.append(
                dict(
                    label=f"{method}_{gbps:g}gbps",
                    method=method,
                    learners=m,
                    eta=10,
                    bandwidth_gbps=(gbps,) + (10.0,) * (m - 1),
                    token_budget=m * 16 * 512 * 3,
                )
            )
    return common.experiment("sim_comm", runs, None, eval_every=8)
