"""What every process of a run is told: the experiment, the addresses, the credential.

A :class:`RunSpec` is written to ``RUN_DIR/spec.json`` by the launcher and read by the
leader, the followers and the learners. The experiment itself is a
:class:`~dipsjax.sim.config.SimConfig` (model, data, method, outer settings, per-learner
slowdowns in ``speeds``), so that a run can be replayed through the simulator's
:func:`~dipsjax.sim.replay.replay` and compared with a simulation of the same settings.
No JAX here: the leader process reads this too.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import ssl
from pathlib import Path
from typing import Any

from dipsjax.runtime.credentials import Credentials
from dipsjax.runtime.credentials import load as load_credentials
from dipsjax.sim.config import SimConfig


@dataclasses.dataclass(frozen=True)
class RunSpec:
    """One run's processes and where they are.

    Attributes:
      sim: the experiment (method, model, data, outer settings; ``speeds`` are per-learner
        slowdown factors: a learner with speed 2 takes twice its measured step time).
      leader: ``host:port`` of the leader's gRPC control server.
      followers: ``host:port`` of each follower's data plane.
      credentials: the directory of the run's credentials (job token, TLS certificates:
        :mod:`dipsjax.runtime.credentials`); only this path is in ``spec.json``.
      tls: both planes use TLS with the job's certificates (mutual: clients show theirs
        too); the job token is checked on every control-plane call either way. Off only to
        measure what TLS costs (``benchmarks/dataplane.py``).
      fingerprint: the model's layout (``client.model_fingerprint``); the leader refuses a
        learner that joins with another (empty: not checked).
      run_dir: where every role writes its logs, tape and checkpoints.
      layer_owner: follower of each tensor (flattened parameter order).
      num_chunks: chunks of the task's training data (the leader's chunk ledger).
      batches_per_chunk, step_tokens: batches of one chunk, and what one batch counts in
        the books, from the task's data source (0: the language model's, from ``sim``).
      heartbeat_interval: seconds between heartbeats of learners and followers; the leader
        counts one silent for ``3 * heartbeat_interval`` as lost (the runtime's leader uses
        this, not ``sim.heartbeat_interval``, which is the simulator's).
      max_restarts: the launcher restarts a process that dies (a learner as a new
        incarnation, a follower from its newest checkpoint, the leader from its snapshot)
        up to this many times per role name; 0 turns self-healing off (a death ends the run).
      restart_backoff: seconds before a role's first restart, doubled for each later one
        (at most 8 s), as Kubernetes backs off restarting a crashed container.
      push_pause: fault injection, for tests: seconds a learner pauses in each push once its
        first follower holds its shards and before the others get theirs (so a kill lands
        mid-push); 0 in real runs.
      answer_pause: fault injection, for tests: seconds a learner pauses between the
        leader's answer to its push request and writing that answer down (so a kill lands
        on a push the leader booked and its learner knows not of); 0 in real runs.
      link_rates: fault injection, for tests: ``(learner, bytes/s)`` pairs; each of that
        learner's data-plane connections (one per follower) carries at most this many
        bytes a second each way while it joins (its first pull: a slow stale upsize);
        afterwards they are not throttled.
      link_cuts: fault injection, for tests: ``(learner, seconds)`` pairs; in the second
        push of that learner's first incarnation, its link to the last follower of the
        plan is cut 64 KiB into the transfer (the connection severed mid-frame), and no
        connection to that follower goes through for ``seconds`` (a cut link).
      transfer_patience: seconds a learner keeps trying a push or pull that fails (a
        follower restarting, a cut link). Past it, a push to a follower the leader still
        hears from is given up: the link is down, so the learner exits with code 69 and
        the launcher starts a new incarnation (the leader drops the push it could not
        finish, and the round goes on without it).
      apply_delay: fault injection, for tests: seconds each follower waits before it
        applies an outer step (a slow update); 0 in real runs.
      compute_in_turns: followers on one host take turns at their outer-step computations
        (norms, merge, apply; a file lock in ``run_dir``), so that only one holds their
        temporaries at a time: what lets the 1B-parameter round fit in 24 GB
        (``round_1b.py``); off by default.
      move_followers: a follower the launcher restarts serves its data plane on a new port
        (``--port 0``), as a replacement on another host would (and the old port may be
        taken by then); it announces the address when it joins, and learners look it up
        through the leader. Off: the same port.
      bind: the interface the leader's and followers' servers listen on: empty for the host
        of their own address (one machine), ``0.0.0.0`` on a cluster, where the address is
        a name (a Kubernetes pod's DNS name, a SLURM node) that may not resolve yet when the
        server starts.
      checkpoints: followers checkpoint after every outer step and save their shard at the
        end, learners every round (off only for benchmarks, e.g. ``round_1b.py``, and to
        measure what checkpointing costs in ``system.py``).
      peer_rpc_cap: calls the leader serves at once from one host (a ``Watch`` stream
        counts while it is open); the server serves at most 4 times as many in all. 0:
        sized from the job (:func:`dipsjax.runtime.leader.rpc_caps`).
      dataplane_max_connections, dataplane_max_per_address: each follower's data-plane
        server holds at most this many connections at once, and this many from one peer
        address (at most ``dataplane_max_connections``); one more is refused (``cap``).
      dataplane_first_frame_timeout: seconds a new data-plane connection has for its TLS
        handshake and first frame (else closed: ``first_frame``).
      dataplane_idle_timeout: seconds an authenticated data-plane connection may stay silent
        before it is closed (``idle``). The four are
        :class:`~dipsjax.transport.dataplane.DataPlaneServer`'s limits
        (:meth:`dataplane_limits`), set from the run config's fields of the same names.
      standby: ``host:port`` of a standby leader (empty: none, the default). It follows the
        active leader's lease, snapshots and tape in the run folder and takes over, on this
        address, once the lease lapses; learners and followers try both addresses
        (:mod:`dipsjax.runtime.lease`). The run config's ``standby_leader: true`` sets it.
      leader_lease: with a standby, seconds without a renewal of the active leader's lease
        before the standby takes over (the leader renews it 4 times as often).
      no_restart: fault injection, for tests: process names (``leader``, ``follower1``...)
        the launcher never restarts, as if their host were gone.
    """

    sim: SimConfig
    leader: str
    followers: tuple[str, ...]
    credentials: str
    run_dir: str
    layer_owner: tuple[int, ...]
    num_chunks: int
    heartbeat_interval: float = 1.0
    max_restarts: int = 3
    restart_backoff: float = 0.5
    apply_delay: float = 0.0
    push_pause: float = 0.0
    answer_pause: float = 0.0
    link_rates: tuple[tuple[int, float], ...] = ()
    link_cuts: tuple[tuple[int, float], ...] = ()
    transfer_patience: float = 60.0
    compute_in_turns: bool = False
    move_followers: bool = True
    checkpoints: bool = True
    bind: str = ""
    tls: bool = True
    fingerprint: str = ""
    batches_per_chunk: int = 0
    step_tokens: int = 0
    peer_rpc_cap: int = 0
    dataplane_max_connections: int = 256
    dataplane_max_per_address: int = 64
    dataplane_first_frame_timeout: float = 5.0
    dataplane_idle_timeout: float = 60.0
    standby: str = ""
    leader_lease: float = 3.0
    no_restart: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        def hostport(a: str) -> bool:
            host, _, port = a.rpartition(":")
            return bool(host) and port.isdigit() and 0 < int(port) < 65536

        def count(x: Any) -> bool:
            return isinstance(x, int) and not isinstance(x, bool) and x >= 1

        def seconds(x: Any) -> bool:
            return isinstance(x, (int, float)) and not isinstance(x, bool) and 0 < x < math.inf

        n = len(self.followers)
        checks = [
            (hostport(self.leader) or not self.leader, "leader", "'host:port'"),
            (n >= 1 or not self.leader, "followers", "at least one 'host:port'"),
            (
                not self.standby or (hostport(self.standby) and self.standby != self.leader),
                "standby",
                "'host:port', not the leader's (or empty: no standby)",
            ),
            (seconds(self.leader_lease), "leader_lease", "finite and > 0 seconds"),
            (all(hostport(a) for a in self.followers), "followers", "'host:port' each"),
            (
                all(isinstance(k, int) and 0 <= k < max(n, 1) for k in self.layer_owner),
                "layer_owner",
                f"a follower index in [0, {n}) per tensor",
            ),
            (self.num_chunks >= 0, "num_chunks", ">= 0"),
            (self.batches_per_chunk >= 0, "batches_per_chunk", ">= 0"),
            (self.step_tokens >= 0, "step_tokens", ">= 0"),
            (self.heartbeat_interval > 0, "heartbeat_interval", "> 0 seconds"),
            (self.max_restarts >= 0, "max_restarts", ">= 0"),
            (self.restart_backoff >= 0, "restart_backoff", ">= 0 seconds"),
            (self.apply_delay >= 0, "apply_delay", ">= 0 seconds"),
            (self.push_pause >= 0, "push_pause", ">= 0 seconds"),
            (self.answer_pause >= 0, "answer_pause", ">= 0 seconds"),
            (
                all(len(x) == 2 and x[1] > 0 for x in self.link_rates),
                "link_rates",
                "(learner, bytes/s > 0) pairs",
            ),
            (
                all(len(x) == 2 and x[1] > 0 for x in self.link_cuts),
                "link_cuts",
                "(learner, seconds > 0) pairs",
            ),
            (self.transfer_patience > 0, "transfer_patience", "> 0 seconds"),
            (self.peer_rpc_cap >= 0, "peer_rpc_cap", ">= 0 (0: sized from the job)"),
            (count(self.dataplane_max_connections), "dataplane_max_connections", "an int >= 1"),
            (
                count(self.dataplane_max_per_address)
                and count(self.dataplane_max_connections)
                and self.dataplane_max_per_address <= self.dataplane_max_connections,
                "dataplane_max_per_address",
                f"an int in [1, dataplane_max_connections = {self.dataplane_max_connections!r}]",
            ),
            (
                seconds(self.dataplane_first_frame_timeout),
                "dataplane_first_frame_timeout",
                "finite and > 0 seconds",
            ),
            (
                seconds(self.dataplane_idle_timeout),
                "dataplane_idle_timeout",
                "finite and > 0 seconds",
            ),
        ]
        for ok, name, allowed in checks:
            if not ok:
                raise ValueError(f"RunSpec.{name} must be {allowed}, got {getattr(self, name)!r}")
        if any(s < 1 for s in self.sim.speeds):
            # A learner process is slowed by sleeping ``speed - 1`` times its measured
            # step time (a speed below 1 made that sleep negative: ValueError mid-round).
            raise ValueError(
                "RunSpec.sim.speeds must be >= 1 each in `dipsjax run` (a learner process is "
                "slowed down by sleeping; it cannot be sped up; the simulator takes any "
                f"speed > 0), got {self.sim.speeds!r}"
            )

    @property
    def secrets(self) -> Credentials:
        """The run's credentials, read from ``credentials`` (once per process)."""
        if not self.credentials:
            raise ValueError("RunSpec.credentials: no credentials directory given")
        return load_credentials(self.credentials)

    @property
    def token(self) -> str:
        """The job token every control-plane call carries."""
        return self.secrets.token

    def grpc_channel(self, address: str) -> Any:
        """A gRPC channel to ``address``: TLS with the job's certificates, or plain."""
        import grpc

        if self.tls:
            return grpc.secure_channel(address, self.secrets.grpc_channel())
        return grpc.insecure_channel(address)

    def ssl_server(self) -> ssl.SSLContext | None:
        """The data-plane server's TLS context (``None`` without TLS)."""
        return self.secrets.ssl_server() if self.tls else None

    def ssl_client(self) -> ssl.SSLContext | None:
        """The data-plane client's TLS context (``None`` without TLS)."""
        return self.secrets.ssl_client() if self.tls else None

    def dataplane_limits(self) -> dict[str, Any]:
        """The keyword arguments of each follower's
        :class:`~dipsjax.transport.dataplane.DataPlaneServer` that bound its connections."""
        return {
            "max_connections": self.dataplane_max_connections,
            "max_per_address": self.dataplane_max_per_address,
            "first_frame_timeout": self.dataplane_first_frame_timeout,
            "idle_timeout": self.dataplane_idle_timeout,
        }

    @property
    def chunk_batches(self) -> int:
        """Batches of one chunk of the task's data (the ledger's unit)."""
        return self.batches_per_chunk or self.sim.batches_per_chunk

    @property
    def batch_tokens(self) -> int:
        """What one inner step's batch counts in the books (the task's ``tokens_per_batch``)."""
        return self.step_tokens or self.sim.batch_size * self.sim.seq_len

    def method_settings(self) -> Any:
        """The method's settings for this run: the experiment's, with the runtime's
        heartbeat interval (the leader counts a peer lost after 3 silent intervals)."""
        settings = self.sim.method_settings(self.layer_owner, len(self.followers))
        return dataclasses.replace(settings, heartbeat_interval=self.heartbeat_interval)

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> RunSpec:
        d = dict(d)
        if "token" in d and "credentials" not in d:
            raise ValueError(
                "spec.json: written before runs had credentials (a 'token' field); start "
                "the run again, or add 'credentials' (a `dipsjax credentials DIR` folder)"
            )
        sim = dict(d["sim"])
        for key in ("speeds", "bandwidth_gbps", "failures", "joins", "leaves"):
            sim[key] = tuple(tuple(x) if isinstance(x, list) else x for x in sim[key])
        d["sim"] = SimConfig(**sim)
        d["followers"] = tuple(d["followers"])
        d["layer_owner"] = tuple(d["layer_owner"])
        d["link_rates"] = tuple(tuple(x) for x in d.get("link_rates", ()))
        d["link_cuts"] = tuple(tuple(x) for x in d.get("link_cuts", ()))
        d["no_restart"] = tuple(d.get("no_restart", ()))
        return cls(**d)

    @property
    def leaders(self) -> tuple[str, ...]:
        """The control plane's addresses, tried in turn: the leader's, then the standby's."""
        return (self.leader, self.standby) if self.standby else (self.leader,)

    def write(self, path: str | Path) -> None:
        write_json(path, self.to_json(), indent=1)

    @classmethod
    def read(cls, path: str | Path) -> RunSpec:
        return cls.from_json(json.loads(Path(path).read_text()))


# Exit code of a learner the leader refused to let join (EX_CONFIG: another model
# fingerprint): the launcher does not restart it, as the same process would be refused again.
REFUSED_EXIT = 78


def write_json(path: str | Path, doc: Any, **dumps: Any) -> None:
    """Write ``doc`` as JSON to ``path`` whole: through a temporary file and ``os.replace``,
    so a process that reads it while it is written (the launcher, ``dipsjax status``, a test)
    sees the old file or the new one, never an empty or half one, and a process killed
    mid-write leaves the old one."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(doc, **dumps))
    os.replace(tmp, path)


def write_json_at(dir_fd: int, name: str, doc: Any, **dumps: Any) -> None:
    """:func:`write_json` into the folder open as ``dir_fd``, whatever its path is now (a
    folder moved meanwhile gets the file where it is: what a deposed leader still writes
    lands in its own moved folder, :func:`dipsjax.runtime.lease.takeover`)."""
    tmp = name + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666, dir_fd=dir_fd)
    with os.fdopen(fd, "w") as fh:
        fh.write(json.dumps(doc, **dumps))
    os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)


def write_cpu_seconds(path: str | Path) -> None:
    """This process's CPU seconds (user + system, all threads) as ``{"cpu_seconds": x}``:
    where the CPU went in a run (``benchmarks/system.py`` reads them)."""
    import resource

    use = resource.getrusage(resource.RUSAGE_SELF)
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    write_json(path, {"cpu_seconds": use.ru_utime + use.ru_stime})


def address(host_port: str) -> tuple[str, int]:
    host, _, port = host_port.rpartition(":")
    return host, int(port)
