"""Heterogeneity sweep (Di-PS sec. 13-14): 4 learners, speeds spread over 0..eta%.

Run: ``.venv/bin/dipsjax simulate sim_eta`` (``--arg ci`` for a short run).
"""

from dipsjax.configs import _sim_common as common


def get_config(arg=None):
    runs = []
    for eta in (10, 50, 100, 200):
        for method in ("sync_diloco", "dips", "naive_async"):
            runs.append(dict(label=f"{method}_eta{eta}", method=method, eta=eta))
    return common.experiment("sim_eta", runs, arg)
