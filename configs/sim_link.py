"""One slow link (Di-PS sec. 13): learner 0's link at 10 / 5 / 1 Gbps, the others at 10.

Run: ``.venv/bin/dipsjax simulate sim_link``.
"""

import importlib.util
import pathlib

_spec = importlib.util.spec_from_file_location(
    "sim_common", pathlib.Path(__file__).with_name("_sim_common.py")
)
common = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(common)


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
