"""Outer optimizers for DiLoCo-family training, as optax transformations.

Input to every transform is a *contribution batch*: a pytree of pseudo-gradients stacked on
a leading learner axis ``[L, ...]``, with per-learner metadata passed as keyword-only extra
args of fixed shape ``[L]``: ``tokens``, ``steps`` and ``mask`` (the learners present). A
round in which only some learners report therefore does not recompile.

Typical use (the Di-PS chain, equivalently :func:`dips`)::

    tx = optax.named_chain(
        ("reject", outer.reject_anomalies(alpha=0.02, beta=3.0)),
        ("merge", outer.token_weighted_mean()),
        ("clip", outer.clip_by_global_norm(1.0)),
        ("nesterov", optax.sgd(0.7, momentum=0.8, nesterov=True)),
    )
    state = tx.init(params)
    updates, state = tx.update(deltas, state, tokens=T, steps=S, mask=M)
    params = optax.apply_updates(params, updates)

Sharded use (followers holding some layers) is described in :mod:`dipsjax.outer._shards`.
"""

from dipsjax.outer._anomaly import (
    AnomalyDecision,
    AnomalyState,
    fold_history,
    init_anomaly_state,
    reject_anomalies,
    score_learners,
)
from dipsjax.outer._base import Contributions, learner_sq_norms, tree_sq_norm
from dipsjax.outer._clipping import GlobalClipState, clip_by_global_norm, clip_factor
from dipsjax.outer._codecs import (
    CODECS,
    DEFAULT_BLOCK,
    EMBEDDINGS,
    Encoded,
    decode,
    decode_tree,
    encode,
    encode_tree,
    error_bound,
    leaf_codecs,
    wire_bytes,
    wire_size,
)
from dipsjax.outer._feedback import (
    OUTCOMES,
    FeedbackState,
    Outcome,
    Pending,
    feedback_encode,
    feedback_init,
    feedback_settle,
    top_k,
)
from dipsjax.outer._merge import (
    decoupled_token_weights,
    default_plain_mean,
    learner_weights,
    mean,
    radial_directional_average,
    rda_merge,
    round_token_scale,
    token_weighted_mean,
    weighted_mean,
)
from dipsjax.outer._presets import decoupled_diloco, diloco, dips, nesterov
from dipsjax.outer._shards import (
    RoundStatistics,
    flatten,
    merge_states,
    merge_trees,
    shard_merged_sq_norm,
    sharded_update,
    split_state,
    split_tree,
    unflatten,
)

__all__ = [
    "CODECS",
    "DEFAULT_BLOCK",
    "EMBEDDINGS",
    "OUTCOMES",
    "AnomalyDecision",
    "AnomalyState",
    "Contributions",
    "Encoded",
    "FeedbackState",
    "GlobalClipState",
    "Outcome",
    "Pending",
    "RoundStatistics",
    "clip_by_global_norm",
    "clip_factor",
    "decode",
    "decode_tree",
    "decoupled_diloco",
    "decoupled_token_weights",
    "default_plain_mean",
    "diloco",
    "dips",
    "encode",
    "encode_tree",
    "error_bound",
    "feedback_encode",
    "feedback_init",
    "feedback_settle",
    "flatten",
    "fold_history",
    "init_anomaly_state",
    "leaf_codecs",
    "learner_sq_norms",
    "learner_weights",
    "mean",
    "merge_states",
    "merge_trees",
    "nesterov",
    "radial_directional_average",
    "rda_merge",
    "reject_anomalies",
    "round_token_scale",
    "score_learners",
    "shard_merged_sq_norm",
    "sharded_update",
    "split_state",
    "split_tree",
    "token_weighted_mean",
    "top_k",
    "tree_sq_norm",
    "unflatten",
    "weighted_mean",
    "wire_bytes",
    "wire_size",
]
