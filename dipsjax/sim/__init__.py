"""Simulation: the virtual-clock training simulator and the chip-scale goodput model.

* :mod:`dipsjax.sim.simulator` -- real training of small models on a virtual clock, driving
  the syncer core (:mod:`dipsjax.syncer`); the methods; replay from the event tape. Its
  parts: :mod:`~dipsjax.sim.config` (config and result), :mod:`~dipsjax.sim.world` (model,
  data, timing), :mod:`~dipsjax.sim.cluster` (the in-process transport, ``LocalCluster``),
  :mod:`~dipsjax.sim.engine` (the learners), :mod:`~dipsjax.sim.dp` (data parallel),
  :mod:`~dipsjax.sim.decentralized` (decentralized Async DiLoCo), :mod:`~dipsjax.sim.replay`.
* :mod:`dipsjax.sim.experiments` -- ``dipsjax simulate CONFIG``: sweeps, metrics, plots.
* :mod:`dipsjax.sim.goodput` -- Monte-Carlo and analytic goodput of elastic data parallelism
  versus Decoupled DiLoCo with ``M`` learners under per-chip interruptions (``dipsjax goodput``).

Import the submodules directly (``from dipsjax.sim.simulator import SimConfig, simulate``):
the goodput model needs only numpy and stays light.
"""
