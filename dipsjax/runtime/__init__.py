"""The runtime: leader, followers and learners as processes (DESIGN.md sec. 7).

* :mod:`~dipsjax.runtime.leader` -- asyncio gRPC control server around the sans-IO leader.
* :mod:`~dipsjax.runtime.follower` -- a shard, its outer state, a data-plane server.
* :mod:`~dipsjax.runtime.learner` -- one partition's JAX inner loop.
* ``dipsjax run`` (which starts them all) lives in :mod:`dipsjax.launch.run`.

Each role checkpoints and resumes; the launchers (local, SLURM, Kubernetes) are in
:mod:`dipsjax.launch`.
"""

import os as _os

# gRPC's core logs every refused TLS handshake at INFO, one line each and uncounted: a
# storm of them would flood a role's log (issue 18 item 7). Unless the user asks for more,
# only its errors are logged; the data plane counts and rate-limits its own refusals
# (dipsjax.transport.refusals). Set before any runtime module imports grpc.
_os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
