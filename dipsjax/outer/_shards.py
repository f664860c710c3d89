"""Running an outer optimizer on shards of the model (the syncer's followers).

Each follower holds some layers of the global parameters and the outer state of those
layers. One outer round then takes three messages through the leader (Di-PS sec. 5, steps
5-6; DESIGN.md sec. 3):

1. every follower reports its partial per-learner squared norms
   (:func:`learner_sq_norms` of its shard); the leader sums them into ``G`` ([L]);
2. every follower merges its shard with the *same* accepted set (decided from ``G``) and
   reports the partial squared norm of its merged shard (:func:`shard_merged_sq_norm`); the
   leader sums them into the global ``merged_sq_norm``;
3. every follower runs the chain on its shard with both global statistics
   (``tx.update(shard, state, learner_sq_norms=G, merged_sq_norm=M, ...)``).

The result is exactly the corresponding sub-tree of the single-process update, with the
same accepted set and clip factor. :func:`sharded_update` runs the three steps in one
process; the runtime and the simulator perform them over the wire.

Parameter trees here are nested dicts (``Mapping``) of arrays; a path is the tuple of keys.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from dipsjax.outer._base import learner_sq_norms

Path = tuple[str, ...]


def flatten(tree: Mapping[str, Any], prefix: Path = ()) -> dict[Path, Any]:
    """``{path: leaf}`` of a nested dict, in key-insertion order."""
    flat: dict[Path, Any] = {}
    for key, value in tree.items():
        path = (*prefix, key)
        if isinstance(value, Mapping):
            flat.update(flatten(value, path))
        else:
            flat[path] = value
    return flat


def unflatten(flat: Mapping[Path, Any]) -> dict[str, Any]:
    """Inverse of :func:`flatten`."""
    tree: dict[str, Any] = {}
    for path, leaf in flat.items():
        node = tree
        for key in path[:-1]:
            node = node.setdefault(key, {})
        node[path[-1]] = leaf
    return tree


def split_tree(
    tree: Mapping[str, Any], shard_of: Callable[[Path], int], num_shards: int
) -> list[dict[str, Any]]:
    """Splits a nested dict into ``num_shards`` pruned nested dicts by ``shard_of(path)``."""
    parts: list[dict[Path, Any]] = [{} for _ in range(num_shards)]
    for path, leaf in flatten(tree).items():
        k = shard_of(path)
        if not 0 <= k < num_shards:
            raise ValueError(f"shard_of({path}) = {k}, outside 0..{num_shards - 1}")
        parts[k][path] = leaf
    return [unflatten(p) for p in parts]


def merge_trees(shards: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Union of disjoint pruned nested dicts (inverse of :func:`split_tree`)."""
    flat: dict[Path, Any] = {}
    for shard in shards:
        for path, leaf in flatten(shard).items():
            if path in flat:
                raise ValueError(f"path {path} appears in more than one shard")
            flat[path] = leaf
    return unflatten(flat)


def _leaves_by_path(tree: Any) -> dict[str, Any]:
    leaves, _ = jax.tree_util.tree_flatten_with_path(tree)
    return {jax.tree_util.keystr(p): leaf for p, leaf in leaves}


def _fill(template: Any, lookup: Callable[[str], Any]) -> Any:
    leaves, treedef = jax.tree_util.tree_flatten_with_path(template)
    return jax.tree_util.tree_unflatten(
        treedef, [lookup(jax.tree_util.keystr(p)) for p, _ in leaves]
    )


def split_state(
    tx: optax.GradientTransformation, state: Any, shard_params: Sequence[Mapping[str, Any]]
) -> list[Any]:
    """Cuts a global outer state into per-shard states matching ``tx.init(shard_params[k])``.

    Parameter-shaped leaves (e.g. the Nesterov momentum) are cut by path; global leaves
    (step counts, detector history, clip state) are replicated to every shard.
    """
    source = _leaves_by_path(state)
    out = []
    for params in shard_params:
        template = jax.eval_shape(tx.init, params)
        out.append(_fill(template, lambda key: source[key]))
    return out


def merge_states(
    tx: optax.GradientTransformation, shard_states: Sequence[Any], params: Mapping[str, Any]
) -> Any:
    """Reassembles a global outer state from per-shard states (inverse of :func:`split_state`).

    Replicated leaves are taken from the first shard that has them.
    """
    source: dict[str, Any] = {}
    for state in shard_states:
        for key, leaf in _leaves_by_path(state).items():
            source.setdefault(key, leaf)
    template = jax.eval_shape(tx.init, params)

    def lookup(key: str) -> Any:
        if key not in source:
            raise ValueError(f"no shard state holds the leaf {key}")
        return source[key]

    return _fill(template, lookup)


def shard_merged_sq_norm(
    tx: optax.GradientTransformation,
    deltas: Any,
    state: Any,
    *,
    learner_sq_norms: jax.Array,
    **extra_args: Any,
) -> jax.Array:
    """Partial squared norm of this shard's merged update (step 2 of the protocol).

    Runs the chain with the global ``learner_sq_norms`` and reads what its global-norm clip
    stage saw; under ``jax.jit`` the stages after the clip are dead code and are removed.
    Returns 0 for a chain without :func:`dipsjax.outer.clip_by_global_norm`.
    """
    _, new_state = tx.update(deltas, state, learner_sq_norms=learner_sq_norms, **extra_args)
    sq = optax.tree_utils.tree_get(new_state, "input_sq_norm")
    return jnp.zeros((), jnp.float32) if sq is None else sq


class RoundStatistics(NamedTuple):
    """The global statistics the leader assembled in one sharded round."""

    learner_sq_norms: jax.Array  # [L], G_j over all shards
    merged_sq_norm: jax.Array  # scalar, ||delta||^2 over all shards


def sharded_update(
    tx: optax.GradientTransformation,
    shard_deltas: Sequence[Any],
    shard_states: Sequence[Any],
    **extra_args: Any,
) -> tuple[list[Any], list[Any], RoundStatistics]:
    """The three-message shard protocol run in one process (reference implementation).

    Args:
      tx: the outer optimizer (e.g. :func:`dipsjax.outer.dips`).
      shard_deltas: per-shard stacked contribution sub-trees ``[L, ...]``.
      shard_states: per-shard outer states (see :func:`split_state`).
      **extra_args: per-learner metadata (``tokens``, ``steps``, ``mask``, ...).

    Returns:
      ``(updates per shard, new states per shard, RoundStatistics)``.
    """
    for k, d in enumerate(shard_deltas):
        if not jax.tree.leaves(d):
            raise ValueError(f"shard {k} holds no parameters; give every follower some layers")
    g = sum(learner_sq_norms(d) for d in shard_deltas)
    m = sum(
        shard_merged_sq_norm(tx, d, s, learner_sq_norms=g, **extra_args)
        for d, s in zip(shard_deltas, shard_states, strict=True)
    )
    outs = [
        tx.update(d, s, learner_sq_norms=g, merged_sq_norm=m, **extra_args)
        for d, s in zip(shard_deltas, shard_states, strict=True)
    ]
    return [u for u, _ in outs], [s for _, s in outs], RoundStatistics(g, jnp.asarray(m))
