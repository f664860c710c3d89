"""Inner-step sweep (Di-PS appendix): H = 8, 16, 32, 64 with Di-PS at eta = 100.

Run: ``.venv/bin/dipsjax simulate sim_h_sweep``.
"""

from dipsjax.configs import _sim_common as common


def get_config(arg=None):
    runs = [
        dict(label=f"dips_H{h}", method="dips", eta=100, inner_steps=h) for h in (8, 16, 32, 64)
    ]
    return common.experiment("sim_h_sweep", runs, arg)
