"""Wire codecs: documented error bounds, sizes, shapes, jit."""

import hypothesis.extra.numpy as hnp
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from dipsjax import outer

arrays = hnp.arrays(
    np.float32,
    hnp.array_shapes(min_dims=1, max_dims=3, max_side=20),
    elements=st.floats(-1e4, 1e4, width=32),
)


@given(
    x=arrays,
    codec=st.sampled_from(["fp32", "bf16", "int8", "int4"]),
    block=st.sampled_from([2, 8, 64]),
)
def test_roundtrip_within_documented_bound(x, codec, block):
    enc = outer.encode(jnp.asarray(x), codec, block_size=block)
    assert enc.payload.dtype == jnp.uint8
    y = outer.decode(enc)
    assert y.shape == x.shape and y.dtype == x.dtype
    err = np.abs(np.asarray(y, np.float64) - x.astype(np.float64))
    bound = np.asarray(outer.error_bound(x, codec, block_size=block), np.float64)
    assert np.all(err <= bound * (1 + 1e-6) + 1e-30)


def test_wire_sizes():
    x = jnp.linspace(-1, 1, 1000)
    encoded = {
        c: jax.eval_shape(lambda c=c: outer.encode(x, c, block_size=100)) for c in outer.CODECS
    }
    sizes = {c: e.nbytes for c, e in encoded.items()}  # shapes alone give the sizes
    want = {"fp32": 4000, "bf16": 2000, "int8": 1000 + 40, "int4": 500 + 40}
    # stat2: 10 blocks of 100 two-bit indices (25 bytes) and four BF16 levels (8 bytes)
    assert sizes == {**want, "stat2": 10 * (25 + 8)}
    assert sizes == {c: outer.wire_size(1000, c, 100) for c in outer.CODECS}


def test_int_codecs_tight_on_grid_values():
    x = jnp.array([-7.0, -3.0, 0.0, 1.0, 7.0, 2.0])
    np.testing.assert_array_equal(outer.decode(outer.encode(x, "int4", block_size=6)), x)


def test_nonfinite_stays_detectable():
    x = jnp.array([1.0, jnp.nan, 2.0, 3.0])
    for codec in ("bf16", "int8", "int4", "stat2"):
        y = outer.decode(outer.encode(x, codec, block_size=4))
        assert not np.all(np.isfinite(np.asarray(y)))


def test_tree_roundtrip_under_jit():
    tree = {"a": jnp.arange(10.0).reshape(2, 5), "b": {"c": -jnp.ones((3,))}}
    enc = jax.jit(lambda t: outer.encode_tree(t, "int8", block_size=4))(tree)
    # payloads are padded to whole blocks: 12 + 4 bytes, plus one fp32 scale per block
    assert outer.wire_bytes(enc) == 12 + 3 * 4 + 4 + 1 * 4
    dec = jax.jit(outer.decode_tree)(enc)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=9 / 254), dec, tree)


def test_bad_codec_named():
    with pytest.raises(ValueError, match="codec"):
        outer.encode(jnp.ones(3), "int3")
    with pytest.raises(ValueError, match="block_size"):
        outer.encode(jnp.ones(3), "int4", block_size=3)
    with pytest.raises(ValueError, match="multiple of 4 for stat2"):
        outer.encode(jnp.ones(3), "stat2", block_size=6)
    with pytest.raises(ValueError, match="codec"):
        outer.leaf_codecs({"a": jnp.ones(3)}, "int2")
    with pytest.raises(ValueError, match="embeddings must be a sequence"):
        outer.leaf_codecs({"a": jnp.ones(3)}, "stat2", embeddings="embed")


def test_integer_bounds_hold_with_fp32_rounding():
    # x / s and s * q each round in FP32: on these values int8's error exceeded
    # max|block| / 254 by 5.1e-6 relative (more than the round-trip test's 1e-6 slack)
    x = jnp.asarray(np.random.default_rng(0).uniform(-1e4, 1e4, 100_000).astype(np.float32))
    for codec in ("int8", "int4"):
        err = jnp.abs(outer.decode(outer.encode(x, codec)) - x)
        assert bool(jnp.all(err <= outer.error_bound(x, codec)))


@pytest.mark.parametrize("codec", ["fp32", "bf16", "int8", "int4", "stat2"])
def test_encode_and_decode_give_the_same_bits_eagerly_and_under_jit(codec):
    """A codec is one function: the learner encodes under ``jit``, a follower or a test may
    encode the same tensor eagerly, and both must send (and decode to) the same bits.
    jax 0.12.1 rewrote ``max / 127`` as ``max * (1 / 127)`` under ``jit`` only, which gave
    the int8 and int4 scales one ulp apart; the scales are now that product in both."""
    x = jnp.asarray(np.random.default_rng(0).normal(size=(7, 300)).astype(np.float32))
    eager = outer.encode(x, codec)
    jitted = jax.jit(lambda x: outer.encode(x, codec))(x)
    for a, b in ((eager.payload, jitted.payload), (eager.scales, jitted.scales)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    np.testing.assert_array_equal(
        np.asarray(outer.decode(eager)), np.asarray(jax.jit(outer.decode)(eager))
    )
