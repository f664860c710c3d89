"""The anomaly penalty as the paper states it against our defaults (eta = 100 and 200).

Ours: warm-up (3 accepted norms, first norms averaged with step max(alpha, 1/n)), a floor of
1 on max(recent E) (a floor of sigma is an extension, off). Paper: neither (``warmup=0,
min_max_score=None, min_sigma_ratio=0``).

Run: ``.venv/bin/dipsjax simulate sim_anomaly`` (``--arg ci`` for a short run).
"""

from dipsjax.configs import _sim_common as common

PAPER = dict(warmup=0, min_max_score=None, min_sigma_ratio=0.0)


def get_config(arg=None):
    runs = []
    for eta in (100, 200):
        runs.append(dict(label=f"dips_ours_eta{eta}", method="dips", eta=eta))
        runs.append(dict(label=f"dips_paper_eta{eta}", method="dips", eta=eta, **PAPER))
    return common.experiment("sim_anomaly", runs, arg)
