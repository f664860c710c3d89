"""Heterogeneity sweep (Di-PS sec. 13-14): 4 learners, speeds spread over 0..eta%.

Run: ``.venv/bin/dipsjax simulate sim_eta`` (``--arg ci`` for a short run).
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
    for eta in (10, 50, 100, 200):
        for method in ("sync_diloco", "dips", "naive_async"):
            runs.append(dict(label=f"{method}_eta{eta}", method=method, eta=eta))
    return common.experiment("sim_eta", runs, arg)
