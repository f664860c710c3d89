"""Simulation: the virtual-clock training simulator and the chip-scale goodput model.

* :mod:`dipsjax.sim.simulator` -- real training of small models on a virtual clock, driving
  the syncer core (:mod:`dipsjax.syncer`); the five methods; replay from the event tape.
* :mod:`dipsjax.sim.experiments` -- ``dipsjax simulate CONFIG``: sweeps, metrics, plots.
* :mod:`dipsjax.sim.goodput` -- Monte-Carlo and analytic goodput of elastic data parallelism
  versus Decoupled DiLoCo with ``M`` learners under per-chip interruptions (``dipsjax goodput``).

Import the submodules directly (``from dipsjax.sim.simulator import SimConfig, simulate``):
the goodput model needs only numpy and stays light.
"""
