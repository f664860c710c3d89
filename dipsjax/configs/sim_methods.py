"""The methods on the same model, data and token budget (eta = 100, 4 learners), plus the
ablations the papers run: Decoupled DiLoCo K=1 with and without grace vs K=M, RDA vs mean,
wire precision; the Di-PS paper's decentralized Async DiLoCo beside the centralized naive
variant; and our extension (partial-round token scaling, off by default) as its own row.

Run: ``.venv/bin/dipsjax simulate sim_methods`` (``--arg ci`` for a short run).
"""

from dipsjax.configs import _sim_common as common


def get_config(arg=None):
    runs = [
        dict(label="dp", method="dp", eta=100),
        dict(label="sync_diloco", method="sync_diloco", eta=100),
        dict(label="naive_async", method="naive_async", eta=100),
        dict(label="async_diloco_decentral", method="async_diloco", eta=100),
        dict(label="dips", method="dips", eta=100),
        dict(label="dips_no_grace", method="dips", eta=100, grace="none"),
        dict(label="dips_int4_wire", method="dips", eta=100, wire="int4"),
        dict(label="decoupled_k1_grace", method="decoupled", eta=100, quorum=1),
        dict(label="decoupled_k1_nograce", method="decoupled", eta=100, quorum=1, grace="none"),
        dict(label="decoupled_k4", method="decoupled", eta=100, quorum=4),
        dict(label="decoupled_k1_mean", method="decoupled", eta=100, quorum=1, rda=False),
        dict(label="decoupled_k1_int4", method="decoupled", eta=100, quorum=1, wire="int4"),
        dict(
            label="decoupled_k1_tokscale_ext",
            method="decoupled",
            eta=100,
            quorum=1,
            round_token_scale=True,
        ),
    ]
    return common.experiment("sim_methods", runs, arg)
