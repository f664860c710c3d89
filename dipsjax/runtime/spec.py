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
from pathlib import Path
from typing import Any

from dipsjax.sim.config import SimConfig


@dataclasses.dataclass(frozen=True)
class RunSpec:
    """One run's processes and where they are.

    Attributes:
      sim: the experiment (method, model, data, outer settings; ``speeds`` are per-learner
        slowdown factors: a learner with speed 2 takes twice its measured step time).
      leader: ``host:port`` of the leader's gRPC control server.
      followers: ``host:port`` of each follower's data plane.
      token: the job's credential (never logged).
      run_dir: where every role writes its logs, tape and checkpoints.
      layer_owner: follower of each tensor (flattened parameter order).
      num_chunks: chunks of the training corpus (the leader's chunk ledger).
      heartbeat_interval: seconds between heartbeats (eviction after 3 missed).
      apply_delay: fault injection, for tests: seconds each follower waits before it
        applies an outer step (a slow update); 0 in real runs.
      compute_in_turns: followers on one host take turns at their outer-step computations
        (norms, merge, apply; a file lock in ``run_dir``), so that only one holds their
        temporaries at a time: what lets the 1B-parameter round fit in 24 GB
        (``round_1b.py``); off by default.
      checkpoints: followers checkpoint after every outer step and save their shard at the
        end, learners every round (off only for benchmarks, e.g. ``round_1b.py``, and to
        measure what checkpointing costs in ``system.py``).
    """

    sim: SimConfig
    leader: str
    followers: tuple[str, ...]
    token: str
    run_dir: str
    layer_owner: tuple[int, ...]
    num_chunks: int
    heartbeat_interval: float = 2.0
    apply_delay: float = 0.0
    compute_in_turns: bool = False
    checkpoints: bool = True

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> RunSpec:
        d = dict(d)
        sim = dict(d["sim"])
        for key in ("speeds", "bandwidth_gbps", "failures", "joins", "leaves"):
            sim[key] = tuple(tuple(x) if isinstance(x, list) else x for x in sim[key])
        d["sim"] = SimConfig(**sim)
        d["followers"] = tuple(d["followers"])
        d["layer_owner"] = tuple(d["layer_owner"])
        return cls(**d)

    def write(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_json(), indent=1))

    @classmethod
    def read(cls, path: str | Path) -> RunSpec:
        return cls.from_json(json.loads(Path(path).read_text()))


def write_cpu_seconds(path: str | Path) -> None:
    """This process's CPU seconds (user + system, all threads) as ``{"cpu_seconds": x}``:
    where the CPU went in a run (``benchmarks/system.py`` reads them)."""
    import resource

    use = resource.getrusage(resource.RUSAGE_SELF)
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps({"cpu_seconds": use.ru_utime + use.ru_stime}))


def address(host_port: str) -> tuple[str, int]:
    host, _, port = host_port.rpartition(":")
    return host, int(port)
