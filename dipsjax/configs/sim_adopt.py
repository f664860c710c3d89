"""Learners that never wait (``overlap=True``, as Decoupled DiLoCo's): adopting a new global
version by replacing the parameters, against adding the global change since the version the
learner started from (``adopt='delta'``), at eta = 100.

Run: ``.venv/bin/dipsjax simulate sim_adopt`` (``--arg ci`` for a short run).
"""

from dipsjax.configs import _sim_common as common


def get_config(arg=None):
    runs = []
    for label, method, extra in (
        ("decoupled_k4", "decoupled", {"quorum": 4}),
        ("decoupled_k1", "decoupled", {"quorum": 1}),
        ("dips", "dips", {}),
    ):
        runs.append(dict(label=f"{label}_wait", method=method, eta=100, **extra))
        for adopt in ("replace", "delta"):
            runs.append(
                dict(
                    label=f"{label}_overlap_{adopt}",
                    method=method,
                    eta=100,
                    overlap=True,
                    adopt=adopt,
                    **extra,
                )
            )
    return common.experiment("sim_adopt", runs, arg)
