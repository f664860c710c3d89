"""dipsjax: asynchronous, heterogeneous, fault-tolerant DiLoCo-family pre-training in JAX.

The public API is small:

* :mod:`dipsjax.outer` -- outer optimizers (Di-PS, Decoupled DiLoCo, DiLoCo) as optax
  transformations over a batch of learner contributions, plus wire codecs.
"""

__version__ = "0.1.0"
