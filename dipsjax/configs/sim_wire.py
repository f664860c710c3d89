"""Wire codecs at equal timing: pseudo-gradients in BF16, int8 and int4 (eta = 100).

On a fast network (1000 Gbps everywhere) transfers take no time, so every codec runs the
same schedule and the loss difference is the quantization alone (on the default 10 Gbps
links int4's shorter pushes also change which learners share a round).

Run: ``.venv/bin/dipsjax simulate sim_wire`` (``--arg ci`` for a short run).
"""

from dipsjax.configs import _sim_common as common

FAST = dict(bandwidth_gbps=(1000.0,) * 4, follower_gbps=1000.0)


def get_config(arg=None):
    runs = []
    for method, extra in (("sync_diloco", {}), ("dips", {}), ("decoupled", {"quorum": 1})):
        for wire in ("bf16", "int8", "int4"):
            runs.append(
                dict(label=f"{method}_{wire}", method=method, eta=100, wire=wire, **FAST, **extra)
            )
    return common.experiment("sim_wire", runs, arg)
