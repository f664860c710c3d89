"""dipsjax: asynchronous, heterogeneous, fault-tolerant DiLoCo-family pre-training in JAX.

Packages, top to bottom of the layering in DESIGN.md:

* :mod:`dipsjax.sim` -- virtual-clock simulator of the five methods; goodput model.
* :mod:`dipsjax.syncer` -- sans-IO leader/follower protocol core, typed messages, grace
  policies, schedule, placement, event tape, token ledger, method registry.
* :mod:`dipsjax.learner`, :mod:`dipsjax.data` -- the inner loop on a partition mesh; corpus,
  chunks, chunk ledger, batch streams.
* :mod:`dipsjax.outer`, :mod:`dipsjax.model` -- outer optimizers as optax transformations
  (Di-PS, Decoupled DiLoCo, DiLoCo) with wire codecs; the NNX decoder and its configs.
* :mod:`dipsjax.configs` -- the shipped run and experiment configs (``dipsjax run NAME``).
* :mod:`dipsjax.rules` -- the round's decision rules (anomaly score, weights, clip factor)
  written once over an array module: NumPy in the leader, ``jax.numpy`` in the transforms.
"""

__version__ = "0.1.0"
