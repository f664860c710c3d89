"""Planning functions of the syncer: layer sharding, push schedule, PS placement.

Pure Python (numpy only for :func:`place_ps`); no I/O, no clocks. The leader calls these to
decide *who sends what to whom*; the simulator calls the same functions.

* :func:`assign_layers` / :func:`follower_loads` -- which follower owns which layer
  (Di-PS sec. 5: "the model is cut by layers over several follower PS").
* :func:`greedy_schedule` -- the many-to-many push schedule of Di-PS sec. 10: conflict-free
  *communication steps* of ``(worker, layer, follower)`` transfers, built by the paper's
  greedy rule. :func:`schedule_lower_bound` and :func:`transfer_time` evaluate it;
  :func:`optimal_schedule` (König edge colouring, always ``lower bound`` steps) is the
  baseline the greedy heuristic is compared against.
* :func:`place_ps` -- where to put the parameter server (Di-PS sec. 10):
  ``i* = argmax_i B[i, :] · p``.

Conventions: layers are non-negative ``int`` indices in model order; followers are
``int`` indices ``0 .. F-1``; workers are any hashable ids, e.g. ``learner`` (one worker per
learner holding all layers) or ``(learner, stage)`` (pipeline-parallel workers of a learner).
Several learners pushing in the same round are simply more workers in one call.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

__all__ = [
    "Schedule",
    "Transfer",
    "assign_layers",
    "follower_loads",
    "greedy_schedule",
    "optimal_schedule",
    "place_ps",
    "placement_scores",
    "schedule_lower_bound",
    "transfer_time",
]


def _is_int(x: object) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def _check_layer_bytes(layer_bytes: Sequence[int]) -> list[int]:
    out = list(layer_bytes)
    for i, b in enumerate(out):
        if not _is_int(b) or b < 0:
            raise ValueError(f"layer_bytes[{i}] must be a non-negative int, got {b!r}")
    return [int(b) for b in out]


# --------------------------------------------------------------------------------------
# 1. Layer -> follower assignment (sec. 5)
# --------------------------------------------------------------------------------------


def assign_layers(layer_bytes: Sequence[int], num_followers: int) -> tuple[int, ...]:
    """Assign layers to followers, balanced by bytes (Di-PS sec. 5).

    Returns ``owner`` with ``owner[layer]`` the follower of each layer (model order).

    Rule: deterministic greedy *largest-layer-first* (LPT list scheduling). Layers are taken
    in order of decreasing size (equal sizes in model order) and each goes to the follower
    that is currently lightest, ties broken by fewest layers, then lowest index.

    Why greedy rather than a contiguous partition:

    * balance: the final loads satisfy ``max <= min + max(layer_bytes)`` (the follower that
      ends heaviest was the lightest when it received its last layer), and LPT is within
      4/3 of the optimal makespan;
    * spread: equal-size layers (the transformer blocks) are dealt round-robin, so
      consecutive layers -- which one pipeline stage holds -- land on *different* followers.
      A stage's push then fans out over many followers and the greedy schedule of sec. 10
      can keep many links busy at once; a contiguous partition would funnel a whole stage
      into one or two followers and serialise its transfers.

    The "fewest layers" tie-break makes every follower non-empty even with zero-byte layers:
    an empty follower has load 0 and count 0, so it is always first in line.

    Raises ``ValueError`` if ``num_followers < 1``, a size is negative or not an ``int``, or
    there are fewer layers than followers (some follower would own nothing).
    """
    sizes = _check_layer_bytes(layer_bytes)
    if not _is_int(num_followers) or num_followers < 1:
        raise ValueError(f"num_followers must be an int >= 1, got {num_followers!r}")
    if len(sizes) < num_followers:
        raise ValueError(
            f"layer_bytes has {len(sizes)} layers but num_followers={num_followers}: "
            "every follower needs at least one layer (need len(layer_bytes) >= num_followers)"
        )
    loads = [0] * num_followers
    counts = [0] * num_followers
    owner = [-1] * len(sizes)
    for layer in sorted(range(len(sizes)), key=lambda i: (-sizes[i], i)):
        f = min(range(num_followers), key=lambda j: (loads[j], counts[j], j))
        owner[layer] = f
        loads[f] += sizes[layer]
        counts[f] += 1
    return tuple(owner)


def follower_loads(
    assignment: Sequence[int], layer_bytes: Sequence[int], num_followers: int | None = None
) -> tuple[int, ...]:
    """Bytes owned by each follower under ``assignment`` (``assignment[layer] = follower``).

    ``num_followers`` defaults to ``max(assignment) + 1``; pass it to include trailing
    followers that own nothing.
    """
    sizes = _check_layer_bytes(layer_bytes)
    owners = list(assignment)
    if len(owners) != len(sizes):
        raise ValueError(
            f"assignment has {len(owners)} entries but layer_bytes has {len(sizes)}; "
            "they must have one entry per layer"
        )
    for i, f in enumerate(owners):
        if not _is_int(f) or f < 0:
            raise ValueError(f"assignment[{i}] must be a non-negative int, got {f!r}")
    n = max(owners, default=-1) + 1
    if num_followers is not None:
        if not _is_int(num_followers) or num_followers < n:
            raise ValueError(
                f"num_followers must be an int >= max(assignment) + 1 = {n}, got {num_followers!r}"
            )
        n = num_followers
    loads = [0] * n
    for f, b in zip(owners, sizes, strict=True):
        loads[f] += b
    return tuple(loads)


# --------------------------------------------------------------------------------------
# 2. Push schedule (sec. 10)
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Transfer:
    """``worker`` sends its copy of ``layer`` to ``follower`` (the layer's owner)."""

    worker: Hashable
    layer: int
    follower: int


@dataclass(frozen=True)
class Schedule:
    """A push schedule: ``steps[s]`` is a set of transfers that run in parallel in step ``s``.

    Within a step no worker sends twice and no follower receives twice (Di-PS sec. 10).
    ``lru_after`` lists every follower seen (in ``lru_order`` or as an owner), least
    recently used first, after this schedule: pass it as ``lru_order`` to the next
    :func:`greedy_schedule` so that LRU preference carries across schedules.
    """

    steps: tuple[tuple[Transfer, ...], ...]
    lru_after: tuple[int, ...] = ()

    @property
    def num_steps(self) -> int:
        return len(self.steps)

    def transfers(self) -> tuple[Transfer, ...]:
        """All transfers, step by step (in the order the greedy rule made them)."""
        return tuple(t for step in self.steps for t in step)

    def step_of(self) -> dict[tuple[Hashable, int], int]:
        """``{(worker, layer): step index}``."""
        return {(t.worker, t.layer): s for s, step in enumerate(self.steps) for t in step}


def _owner_lookup(layer_owner: Mapping[int, int] | Sequence[int]) -> Mapping[int, int]:
    if isinstance(layer_owner, Mapping):
        items = list(layer_owner.items())
    else:
        items = list(enumerate(layer_owner))
    owners: dict[int, int] = {}
    for layer, f in items:
        if not _is_int(layer) or layer < 0:
            raise ValueError(f"layer_owner: layer ids must be non-negative ints, got {layer!r}")
        if not _is_int(f) or f < 0:
            raise ValueError(
                f"layer_owner[{layer!r}] must be a non-negative int follower, got {f!r}"
            )
        owners[int(layer)] = int(f)
    return owners


def _check_worker_layers(
    worker_layers: Mapping[Hashable, Sequence[int]], owners: Mapping[int, int]
) -> dict[Hashable, tuple[int, ...]]:
    if not isinstance(worker_layers, Mapping):
        raise ValueError(
            f"worker_layers must be a Mapping worker -> layers, got {type(worker_layers).__name__}"
        )
    out: dict[Hashable, tuple[int, ...]] = {}
    for w, given in worker_layers.items():
        layers = tuple(given)
        if len(set(layers)) != len(layers):
            raise ValueError(f"worker_layers[{w!r}] lists a layer twice: {layers!r}")
        for layer in layers:
            if layer not in owners:
                raise ValueError(
                    f"worker_layers[{w!r}]: layer {layer!r} has no owner in layer_owner"
                )
        out[w] = layers
    return out


def schedule_lower_bound(
    worker_layers: Mapping[Hashable, Sequence[int]],
    layer_owner: Mapping[int, int] | Sequence[int],
) -> int:
    """Fewest steps any conflict-free schedule needs.

    ``max(max layers per worker, max transfers into one follower)``: a worker sends one layer
    per step and a follower receives one per step. (By König's edge-colouring theorem this
    bound is achievable by *some* schedule; the greedy rule reaches it in the balanced
    cases, not always.)
    """
    owners = _owner_lookup(layer_owner)
    wl = _check_worker_layers(worker_layers, owners)
    per_worker = max((len(ls) for ls in wl.values()), default=0)
    per_follower: dict[int, int] = {}
    for ls in wl.values():
        for layer in ls:
            per_follower[owners[layer]] = per_follower.get(owners[layer], 0) + 1
    return max(per_worker, max(per_follower.values(), default=0))


def greedy_schedule(
    worker_layers: Mapping[Hashable, Sequence[int]],
    layer_owner: Mapping[int, int] | Sequence[int],
    lru_order: Sequence[int] | None = None,
) -> Schedule:
    """Greedy many-to-many push schedule (Di-PS sec. 10).

    ``worker_layers[w]`` lists the layers worker ``w`` must push, in model order (a pipeline
    stage of a learner, or all layers for a one-worker learner; several learners pushing in
    the same round are just more workers). ``layer_owner`` maps each layer to the follower
    that holds it (a ``Mapping`` or a sequence indexed by layer, e.g. :func:`assign_layers`).
    ``lru_order`` optionally lists followers from least to most recently used before this
    schedule (e.g. ``previous.lru_after``); followers not in it count as never used.

    The paper's rule: "starting from the first worker, give its earliest not-yet-sent layer
    to the least recently used follower, then go through the other workers, until all
    layers are scheduled"; each step holds conflict-free worker-PS pairs. A layer can only
    go to its owner, so the choice of follower *is* the choice of layer. Our reading, step
    by step until every layer is sent:

    * all followers are free at the start of a step; visit workers in ``worker_layers``
      order (a worker with nothing left is skipped);
    * a worker's candidates are its unsent layers whose owner is still free in this step;
      it takes the candidate whose owner was *least recently used* (smallest last-used
      step), ties -- e.g. several never-used followers, or followers last used in the same
      step -- going to the *earliest* layer in the worker's list. The transfer occupies the
      worker and the follower for this step, and the follower's last-used step becomes this
      step;
    * a worker with no candidate idles in this step.

    Every step sends at least one layer (the first worker with work left sees all followers
    free), so the loop ends, and by construction each step is conflict-free and each
    (worker, layer) is sent exactly once, to its owner. Deterministic: depends only on the
    inputs' order. The LRU preference steers a worker away from followers that just
    received, spreading load so that other workers (and later steps) find them free.

    How good is it? Each step is a *maximal* matching of what is left (a worker idles only
    when all its remaining owners are busy), so a transfer ``(w, l)`` is done by step
    ``deg(w) + deg(owner(l)) - 1`` and ``num_steps <= 2·Δ - 1`` with ``Δ`` =
    :func:`schedule_lower_bound`. It reaches ``Δ`` when there is no contention (one worker,
    or workers with disjoint followers) and in the balanced "Latin" case: ``F`` workers,
    each with one layer on every follower, worker ``i`` listing its layers starting at
    follower ``π(i)`` and going round ``π`` (every step all followers are busy and tie, so
    each worker takes its next layer). It is *not* optimal in general, even with one layer
    per follower per worker: three workers all holding layers 0, 1, 2 on followers 0, 1, 2
    need 3 steps, greedy takes 4 (in step 1 worker 2 finds both its owners busy).
    :func:`optimal_schedule` always reaches ``Δ``; the paper's point for the greedy is that
    each arriving learner can be scheduled on its own, cheaply, without a global re-solve.

    Raises ``ValueError`` on a layer without owner, a repeated layer within a worker, or a
    malformed ``lru_order``.
    """
    owners = _owner_lookup(layer_owner)
    wl = _check_worker_layers(worker_layers, owners)

    # last_used[f]: step index of the follower's last receive; initial order from lru_order.
    seen = sorted({owners[layer] for ls in wl.values() for layer in ls})
    last_used: dict[int, int] = {}
    if lru_order is not None:
        lru = list(lru_order)
        if len(set(lru)) != len(lru):
            raise ValueError(f"lru_order lists a follower twice: {lru!r}")
        for pos, f in enumerate(lru):
            if not _is_int(f) or f < 0:
                raise ValueError(f"lru_order[{pos}] must be a non-negative int, got {f!r}")
            last_used[int(f)] = pos - len(lru) - 1  # all < 0, older first; -1 never reached
    never = -len(last_used) - 2  # followers never used: older than anything listed
    for f in seen:
        last_used.setdefault(f, never)

    remaining = {w: list(ls) for w, ls in wl.items()}
    steps: list[tuple[Transfer, ...]] = []
    step = 0
    while any(remaining.values()):
        busy: set[int] = set()
        made: list[Transfer] = []
        for w, left in remaining.items():
            best: tuple[int, int] | None = None  # (last_used, position in left)
            for pos, layer in enumerate(left):
                f = owners[layer]
                if f in busy:
                    continue
                key = (last_used[f], pos)
                if best is None or key < best:
                    best = key
            if best is None:
                continue
            layer = left.pop(best[1])
            f = owners[layer]
            busy.add(f)
            last_used[f] = step
            made.append(Transfer(w, layer, f))
        steps.append(tuple(made))
        step += 1

    lru_after = tuple(sorted(last_used, key=lambda f: (last_used[f], f)))
    return Schedule(steps=tuple(steps), lru_after=lru_after)


def optimal_schedule(
    worker_layers: Mapping[Hashable, Sequence[int]],
    layer_owner: Mapping[int, int] | Sequence[int],
) -> Schedule:
    """A schedule with exactly :func:`schedule_lower_bound` steps (fewest possible).

    Not the paper's rule: a baseline for :func:`greedy_schedule`, which is a heuristic (it
    builds one maximal matching per step and may need up to ``deg(w) + deg(f) - 1`` steps).
    Transfers form a bipartite multigraph workers x followers; a conflict-free step is a
    matching, so a schedule is a proper edge colouring, and by König's theorem ``Δ`` (the
    lower bound) colours suffice. Constructed edge by edge (in worker order, then layer
    order): take the smallest step ``a`` free at the worker and ``b`` free at the follower;
    if ``a`` is taken at the follower, swap ``a``/``b`` along the alternating path from the
    follower (it cannot reach the worker in a bipartite graph), then use ``a``.
    Deterministic. Steps list transfers in worker order; ``lru_after`` orders followers by
    their last step (ties by index). O(E·(Δ + V)).
    """
    owners = _owner_lookup(layer_owner)
    wl = _check_worker_layers(worker_layers, owners)
    delta = schedule_lower_bound(wl, owners)
    # Nodes: ("w", worker) and ("f", follower). at[node][colour] = edge index.
    edges: list[tuple[Hashable, int, int]] = []  # (worker, layer, follower)
    colour: list[int] = []
    at: dict[tuple[str, Hashable], dict[int, int]] = {}

    def other(e: int, node: tuple[str, Hashable]) -> tuple[str, Hashable]:
        w, _, f = edges[e]
        return ("f", f) if node == ("w", w) else ("w", w)

    for w, layers in wl.items():
        for layer in layers:
            f = owners[layer]
            u, v = ("w", w), ("f", f)
            cu, cv = at.setdefault(u, {}), at.setdefault(v, {})
            a = next(c for c in range(delta) if c not in cu)
            b = next(c for c in range(delta) if c not in cv)
            if a in cv:
                # Collect the a/b alternating path from v, then swap its colours.
                path: list[int] = []
                node, want = v, a
                while want in at[node]:
                    e = at[node][want]
                    path.append(e)
                    node = other(e, node)
                    want = b if want == a else a
                for e in path:
                    x, y = ("w", edges[e][0]), ("f", edges[e][2])
                    del at[x][colour[e]], at[y][colour[e]]
                for e in path:
                    colour[e] = b if colour[e] == a else a
                    x, y = ("w", edges[e][0]), ("f", edges[e][2])
                    at[x][colour[e]] = e
                    at[y][colour[e]] = e
            edges.append((w, layer, f))
            colour.append(a)
            cu[a] = cv[a] = len(edges) - 1

    steps: list[list[Transfer]] = [[] for _ in range(delta)]
    for (w, layer, f), c in zip(edges, colour, strict=True):
        steps[c].append(Transfer(w, layer, f))
    last_used: dict[int, int] = {}
    for s, step in enumerate(steps):
        for t in step:
            last_used[t.follower] = s
    lru_after = tuple(sorted(last_used, key=lambda f: (last_used[f], f)))
    return Schedule(steps=tuple(tuple(step) for step in steps), lru_after=lru_after)


def transfer_time(
    schedule: Schedule,
    layer_bytes: Sequence[int] | Mapping[int, int],
    bandwidth_fn: Callable[[Hashable, int], float],
    latency_fn: Callable[[Hashable, int], float] | None = None,
) -> float:
    """Makespan of ``schedule`` when steps run back to back (a barrier between steps).

    A transfer takes ``latency_fn(worker, follower) + layer_bytes[layer] /
    bandwidth_fn(worker, follower)`` seconds (bandwidth in bytes/s; latency 0 by default);
    a step lasts as long as its slowest transfer; the makespan is the sum over steps.
    An upper bound for an implementation that starts each transfer as soon as its two
    endpoints are free; a quick model for the simulator.
    """
    total = 0.0
    for s, step in enumerate(schedule.steps):
        slowest = 0.0
        for t in step:
            try:
                b = layer_bytes[t.layer]
            except (KeyError, IndexError):
                raise ValueError(f"layer_bytes has no entry for layer {t.layer}") from None
            if b < 0:
                raise ValueError(f"layer_bytes[{t.layer}] must be >= 0, got {b!r}")
            bw = float(bandwidth_fn(t.worker, t.follower))
            if not bw > 0 or math.isnan(bw):
                raise ValueError(
                    f"bandwidth_fn({t.worker!r}, {t.follower}) must be > 0, got {bw!r} (step {s})"
                )
            lat = 0.0 if latency_fn is None else float(latency_fn(t.worker, t.follower))
            if not lat >= 0:
                raise ValueError(
                    f"latency_fn({t.worker!r}, {t.follower}) must be >= 0, got {lat!r} (step {s})"
                )
            slowest = max(slowest, lat + b / bw)
        total += slowest
    return total


# --------------------------------------------------------------------------------------
# 3. PS placement (sec. 10)
# --------------------------------------------------------------------------------------


def placement_scores(bandwidth: npt.ArrayLike, throughput: npt.ArrayLike) -> np.ndarray:
    """``B @ p``: for each candidate PS site, bandwidth to every learner weighted by its
    throughput (submission frequency is taken proportional to throughput; Di-PS sec. 10).

    ``bandwidth`` is ``[N, M]`` (N candidate sites, M training partitions), ``throughput``
    is ``[M]``; both finite and non-negative, N, M >= 1.
    """
    b = np.asarray(bandwidth, dtype=np.float64)
    p = np.asarray(throughput, dtype=np.float64)
    if b.ndim != 2 or b.shape[0] < 1 or b.shape[1] < 1:
        raise ValueError(
            f"bandwidth must be a 2-D [N, M] array with N, M >= 1, got shape {b.shape}"
        )
    if p.shape != (b.shape[1],):
        raise ValueError(
            f"throughput must have shape ({b.shape[1]},) to match bandwidth {b.shape}, "
            f"got {p.shape}"
        )
    if not np.all(np.isfinite(b)) or np.any(b < 0):
        raise ValueError("bandwidth must be finite and non-negative")
    if not np.all(np.isfinite(p)) or np.any(p < 0):
        raise ValueError("throughput must be finite and non-negative")
    return b @ p


def place_ps(bandwidth: npt.ArrayLike, throughput: npt.ArrayLike) -> int:
    """PS placement of Di-PS sec. 10: ``i* = argmax_i (B[i, :] · p)``; ties -> lowest index.

    Not the single fastest link, but the site with the most bandwidth to the learners that
    push most often. See :func:`placement_scores` for shapes and validation.
    """
    return int(np.argmax(placement_scores(bandwidth, throughput)))
