"""Virtual-clock simulator: real JAX training of small models, simulated time.

Learners train a real model on the real corpus; how long things take comes from a model
(:mod:`dipsjax.sim.world`): per-learner speed, step noise, per-link bandwidth and latency on
the wire size of a *virtual* model, the followers' update time, failures and recoveries,
joins and leaves. The syncer is the real sans-IO core driven through an in-process
transport (:mod:`dipsjax.sim.cluster`) by the engine (:mod:`dipsjax.sim.engine`); each
method's parts come from the registry shared with the runtime (:mod:`dipsjax.syncer.methods`).
No algorithmic decision lives in ``sim/``.

Methods (same model, data, token budget):

* ``dp`` -- data parallel: one gradient all-reduce per step (:mod:`dipsjax.sim.dp`).
* ``sync_diloco`` -- quorum of all learners, plain mean, Nesterov: a barrier every ``H``.
* ``naive_async`` -- centralized: every push is applied alone on arrival, no penalty.
* ``async_diloco`` -- the Di-PS paper's decentralized baseline (:mod:`dipsjax.sim.decentralized`).
* ``dips`` -- Di-PS: dynamic grace, anomaly penalty, token weighting, clipping, pseudo-
  gradients against the server's current parameters.
* ``decoupled`` -- Decoupled DiLoCo: quorum ``K`` with slack-bounded grace, ``c_tok^2/c_steps``
  weights, RDA.

Deterministic for a seed. :func:`replay` recomputes the final parameters from the event tape.
"""

from __future__ import annotations

from collections.abc import Callable

from dipsjax.sim.config import METHODS, WIRE_BYTES, SimConfig, SimResult, TokenCount
from dipsjax.sim.replay import replay, tree_equal

__all__ = [
    "METHODS",
    "WIRE_BYTES",
    "SimConfig",
    "SimResult",
    "TokenCount",
    "replay",
    "simulate",
    "tree_equal",
]


def simulate(
    cfg: SimConfig,
    *,
    progress: Callable[[str], None] | None = None,
    restore_leader_at: tuple[float, ...] = (),
) -> SimResult:
    """Runs one experiment and returns its measurements, tape and final parameters.

    ``restore_leader_at``: virtual times at which the leader is replaced by one restored
    from its JSON snapshot (the run must not notice).
    """
    if cfg.method == "dp":
        from dipsjax.sim.dp import simulate_dp

        return simulate_dp(cfg, progress)
    if cfg.method == "async_diloco":
        from dipsjax.sim.decentralized import simulate_decentralized

        return simulate_decentralized(cfg, progress)
    from dipsjax.sim.engine import Engine

    return Engine(cfg, progress=progress, restore_leader_at=restore_leader_at).run()
