"""The learner's compute thread casts a pseudo-gradient sent as it is (``wire="bf16"``) to
BF16 where it was computed: the bytes the data plane then frames equal the host's encoding
of the FP32 pseudo-gradient, bit for bit."""

import jax
import ml_dtypes
import numpy as np

from dipsjax.learner import InnerOptimizerConfig, Learner, make_partition_mesh
from dipsjax.model.configs import get_config
from dipsjax.runtime.partition import Compute, Partition
from dipsjax.transport import dataplane as dp


def tiny_learner() -> Learner:
    """The tiny model's learner on one device, its buffers not donated (a round's start is
    kept to take it again)."""
    return Learner(
        get_config("tiny"),
        InnerOptimizerConfig(learning_rate=1e-2, weight_decay=0.0),
        mesh=make_partition_mesh(),
        learner_id=0,
        seed=0,
        donate=False,
    )


def test_a_bf16_wire_leaves_the_device_as_the_host_would_encode_it():
    compute = Compute(tiny_learner(), "start", Partition(), ml_dtypes.bfloat16)
    batches = [np.random.default_rng(i).integers(0, 256, (8, 17), np.int32) for i in range(2)]
    compute.call("warm_up", batches[0], 2)  # compiles the cast too; puts the learner back
    start = compute.call("params")
    _, bf16 = compute.call("round", batches, 2, None)
    compute.call("take", start, 0, True, None)  # the same round again, sent in FP32
    compute.wire_dtype = None
    _, fp32 = compute.call("round", batches, 2, None)
    leaves = jax.tree.leaves(fp32)
    assert len(leaves) == len(jax.tree.leaves(bf16)) > 3
    assert {x.dtype for x in leaves} == {np.dtype(np.float32)}
    assert {x.dtype for x in jax.tree.leaves(bf16)} == {np.dtype(ml_dtypes.bfloat16)}
    assert all(isinstance(x, np.ndarray) for x in jax.tree.leaves(bf16))  # on the host
    for x, y in zip(leaves, jax.tree.leaves(bf16), strict=True):
        assert np.abs(x).max() > 0
        host, _, shape = dp.encode_tensor(x, "bf16")
        sent, _, same = dp.encode_tensor(y, "bf16")
        assert shape == same and bytes(host) == bytes(sent)


def test_the_cast_rounds_every_float32_as_the_host_encoding_does():
    # Zeros, infinities, subnormals, the largest finite values, rounding ties and random bit
    # patterns (NaN payloads are left out: neither side specifies them).
    from dipsjax.runtime.partition import _cast

    rng = np.random.default_rng(5)
    special = [0.0, -0.0, np.inf, -np.inf, 1e-40, -1e-45, 3.4e38, -3.4e38]
    ties = [1 + 2**-8, 1 + 3 * 2**-8, -(1 + 2**-8), 2**-126 * (1 + 2**-8)]
    bits = rng.integers(0, 2**32, 100_000, dtype=np.uint64).astype(np.uint32).view(np.float32)
    x = np.concatenate([np.array(special + ties, np.float32), bits])
    x = x[~np.isnan(x)]
    y = np.asarray(_cast({"x": x}, ml_dtypes.bfloat16)["x"])
    host, _, _ = dp.encode_tensor(x, "bf16")
    assert y.dtype == ml_dtypes.bfloat16 and y.tobytes() == bytes(host)
