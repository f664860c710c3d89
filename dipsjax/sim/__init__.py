"""Simulation: the virtual-clock training simulator and the chip-scale goodput model.

* :mod:`dipsjax.sim.goodput` -- Monte-Carlo and analytic goodput of elastic data parallelism
  versus Decoupled DiLoCo with ``M`` learners under per-chip interruptions (``dipsjax goodput``).
"""
