"""The runtime: leader, followers and learners as processes (DESIGN.md sec. 7).

* :mod:`~dipsjax.runtime.leader` -- asyncio gRPC control server around the sans-IO leader.
* :mod:`~dipsjax.runtime.follower` -- a shard, its outer state, a data-plane server.
* :mod:`~dipsjax.runtime.learner` -- one partition's JAX inner loop.
* ``dipsjax run`` (which starts them all) lives in :mod:`dipsjax.launch.run`.

Each role checkpoints and resumes; the launchers (local, SLURM, Kubernetes) are in
:mod:`dipsjax.launch`.
"""
