"""The runtime: leader, followers and learners as processes (DESIGN.md sec. 7).

* :mod:`~dipsjax.runtime.leader` -- asyncio gRPC control server around the sans-IO leader.
* :mod:`~dipsjax.runtime.follower` -- a shard, its outer state, a data-plane server.
* :mod:`~dipsjax.runtime.learner` -- one partition's JAX inner loop.
* :mod:`~dipsjax.runtime.run` -- ``dipsjax run``: starts them all on this machine.

Work in progress (issue 8): no checkpoints, resume, overlapping learners or benchmarks yet.
"""
