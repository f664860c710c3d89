"""The learner: one partition's sharded inner loop (AdamW steps) and its contributions."""

from dipsjax.learner.mesh import (
    BATCH_AXES,
    MESH_AXES,
    batch_sharding,
    make_partition_mesh,
    mesh_shape,
    replicated,
    shardings_for,
    split_devices,
)
from dipsjax.learner.round import (
    REFERENCES,
    Contribution,
    EvalResult,
    Learner,
    evaluate,
    pseudo_gradient,
)
from dipsjax.learner.step import (
    InnerOptimizerConfig,
    InnerStep,
    bits_per_byte,
    cross_entropy,
    make_inner_optimizer,
    params_from_dict,
    params_to_dict,
    tokens_in,
)

__all__ = [
    "BATCH_AXES",
    "MESH_AXES",
    "REFERENCES",
    "Contribution",
    "EvalResult",
    "InnerOptimizerConfig",
    "InnerStep",
    "Learner",
    "batch_sharding",
    "bits_per_byte",
    "cross_entropy",
    "evaluate",
    "make_inner_optimizer",
    "make_partition_mesh",
    "mesh_shape",
    "params_from_dict",
    "params_to_dict",
    "pseudo_gradient",
    "replicated",
    "shardings_for",
    "split_devices",
    "tokens_in",
]
