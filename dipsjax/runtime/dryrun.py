"""``dipsjax run CONFIG --dry-run``: plan a job without starting it (any model size, no
hardware): parameter count, memory and wire bytes per role, the followers' layer
assignment, each learner partition's push plan, and the parameter server's site chosen
from a bandwidth matrix in the config.

Everything comes from the model's abstract parameters (shapes only, nothing allocated) and
the functions the runtime itself uses: :func:`~dipsjax.syncer.schedule.assign_layers`
(the followers' shards, balanced by bytes, Di-PS sec. 5),
:func:`~dipsjax.syncer.schedule.greedy_schedule` and
:func:`~dipsjax.syncer.schedule.transfer_time` (the many-to-many push plan and its
makespan, sec. 10), :func:`~dipsjax.syncer.schedule.place_ps` (the site with the most
bandwidth to the partitions that push most, sec. 10).

The config's optional ``placement`` (a dict): ``sites`` (N names), ``bandwidth_gbps``
(``[N][M]``: each site's bandwidth to each of the M learner partitions, Gbps) and
``throughput`` (M relative push rates; default: 1 over each learner's slowdown).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from dipsjax.sim.config import WIRE_BYTES, SimConfig

GB = 1e9


def _wire(n: int, codec: str, block: int = 64) -> int:
    """Bytes of ``n`` values on the wire in ``codec`` (integer codecs add a scale a block)."""
    scales = 4 * math.ceil(n / block) if codec in ("int8", "int4") else 0
    return math.ceil(WIRE_BYTES[codec] * n) + scales


def plan(sim: SimConfig, placement: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The job's plan as data (what :func:`format_plan` prints)."""
    from dipsjax import outer
    from dipsjax.learner.step import InnerStep, params_to_dict
    from dipsjax.model.plan import follower_memory, learner_memory
    from dipsjax.syncer.schedule import (
        assign_layers,
        follower_loads,
        greedy_schedule,
        place_ps,
        placement_scores,
        transfer_time,
    )
    from dipsjax.task import load_task

    abstract = params_to_dict(InnerStep(load_task(sim), mesh=None).abstract_params)
    sizes = [int(np.prod(x.shape)) for x in outer.flatten(abstract).values()]
    n = sum(sizes)
    followers = min(sim.followers, len(sizes))
    owner = assign_layers([4 * s for s in sizes], followers)  # as make_spec assigns them
    shard = [sum(s for s, k in zip(sizes, owner, strict=True) if k == f) for f in range(followers)]
    push = sum(_wire(s, sim.wire) for s in sizes)
    roles: dict[str, Any] = {
        "leader": {"memory_bytes": 0, "note": "control only: no tensors"},
        "learner": {
            # The one memory model (plan, --dry-run, the learner's log): the step's peak.
            "memory_bytes": sum(learner_memory(n).values()),
            "push_bytes": push,
            "pull_bytes": 4 * n,  # learners pull FP32
        },
        "followers": [
            {
                "follower": f,
                "tensors": sum(k == f for k in owner),
                "params": shard[f],
                "memory_bytes": sum(
                    follower_memory(
                        shard[f],
                        learners=sim.learners,
                        wire_bytes=WIRE_BYTES[sim.wire],
                        version_cache=sim.version_cache,
                    ).values()
                ),
                "in_bytes_per_round": sim.learners
                * sum(_wire(s, sim.wire) for s, k in zip(sizes, owner, strict=True) if k == f),
                "out_bytes_per_pull": 4 * shard[f],
            }
            for f in range(followers)
        ],
    }
    loads = follower_loads(owner, [4 * s for s in sizes], followers)
    schedule = greedy_schedule({0: list(range(len(sizes)))}, owner)
    out: dict[str, Any] = {
        "model": sim.model,
        "params": n,
        "tensors": len(sizes),
        "learners": sim.learners,
        "followers": followers,
        "wire": sim.wire,
        "tokens_per_push": sim.inner_steps
        * (load_task(sim).source.tokens_per_batch if sim.task else sim.batch_size * sim.seq_len),
        "roles": roles,
        "layer_owner": list(owner),
        "follower_fp32_bytes": list(loads),
        "push_plan_steps": len(schedule.steps),
    }
    if placement:
        sites = list(placement["sites"])
        b = np.asarray(placement["bandwidth_gbps"], np.float64)
        m = sim.learners
        if b.shape != (len(sites), m):
            raise ValueError(
                f"placement.bandwidth_gbps must be [{len(sites)} sites][{m} learners], got "
                f"shape {b.shape}"
            )
        speeds = sim.speeds or (1.0,) * m
        p = np.asarray(placement.get("throughput", [1.0 / s for s in speeds]), np.float64)
        site = place_ps(b, p)
        wire_sizes = [_wire(s, sim.wire) for s in sizes]
        push_s = [
            transfer_time(
                greedy_schedule({j: list(range(len(sizes)))}, owner),
                wire_sizes,
                lambda w, f, j=j: b[site, j] * GB / 8,
            )
            for j in range(m)
        ]
        out["placement"] = {
            "sites": sites,
            "scores": [float(x) for x in placement_scores(b, p)],
            "site": sites[site],
            "push_seconds": push_s,
            "pull_seconds": [4 * n / (b[site, j] * GB / 8) for j in range(m)],
        }
    return out


def _gb(x: float) -> str:
    return f"{x / GB:,.3f} GB" if x < 10 * GB else f"{x / GB:,.0f} GB"


def format_plan(p: dict[str, Any]) -> str:
    lines = [
        f"model {p['model']}: {p['params']:,} parameters in {p['tensors']} tensors; "
        f"{p['learners']} learners, {p['followers']} followers, wire {p['wire']}, "
        f"{p['tokens_per_push']:,} tokens a push",
        "",
        "role          memory        per round",
        f"leader        {'-':>12}  control only (no tensors)",
    ]
    lr = p["roles"]["learner"]
    lines.append(
        f"learner (x{p['learners']})  {_gb(lr['memory_bytes']):>12}  push "
        f"{_gb(lr['push_bytes'])}, pull {_gb(lr['pull_bytes'])}"
    )
    for f in p["roles"]["followers"]:
        lines.append(
            f"follower {f['follower']:<4} {_gb(f['memory_bytes']):>12}  {f['tensors']} tensors, "
            f"{f['params']:,} params; in {_gb(f['in_bytes_per_round'])} (all learners), "
            f"out {_gb(f['out_bytes_per_pull'])} a pull"
        )
    loads = p["follower_fp32_bytes"]
    lines += [
        "",
        f"layer assignment (FP32 bytes a follower): {', '.join(_gb(x) for x in loads)} "
        f"(max/mean {max(loads) / (sum(loads) / len(loads)):.3f})",
        f"push plan: {p['push_plan_steps']} steps (greedy many-to-many schedule, Di-PS sec. 10)",
    ]
    pl = p.get("placement")
    if pl:
        scores = ", ".join(f"{s} {x:,.1f}" for s, x in zip(pl["sites"], pl["scores"], strict=True))
        lines += [
            f"placement: the parameter server at {pl['site']} (B @ p: {scores})",
            "  push seconds a learner: " + ", ".join(f"{x:,.1f}" for x in pl["push_seconds"]),
            "  pull seconds a learner: " + ", ".join(f"{x:,.1f}" for x in pl["pull_seconds"]),
        ]
    lines.append(
        "memory: learner = FP32 weights + AdamW m, v + the round's reference + gradients + "
        "the step's outputs beside its inputs (32 B a parameter, dipsjax.model.plan."
        "learner_memory); follower = FP32 shard + outer state + version cache + staged pushes"
    )
    return "\n".join(lines)
