"""One slow link (Di-PS sec. 13): learner 0's link at 10 / 5 / 1 Gbps, the others at 10.

Run: ``.venv/bin/dipsjax simulate sim_link``.
"""

from dipsjax.configs import _sim_common as common


def get_config(arg=None):
    runs = []
    for gbps in (10.0, 5.0, 1.0):
        for method in ("sync_diloco", "dips", "decoupled"):
            runs.append(
                dict(
                    label=f"{method}_{gbps:g}gbps",
                    method=method,
                    eta=10,
                    bandwidth_gbps=(gbps, 10.0, 10.0, 10.0),
                )
            )
    return common.experiment("sim_link", runs, arg)
