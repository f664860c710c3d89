"""The learner side's arithmetic lives in ``dipsjax.learner``, apart from the simulator and
the runtime that both use it (issue 17: the simulator runs the deployed learner)."""

import subprocess
import sys

import jax.numpy as jnp
import numpy as np

from dipsjax import outer
from dipsjax.learner.contribution import add_global_change, wire


def test_the_learner_package_imports_neither_the_simulator_nor_the_runtime():
    code = (
        "import sys, dipsjax.learner, dipsjax.learner.contribution; "
        "print(sorted(m for m in sys.modules if m.startswith(('dipsjax.sim', 'dipsjax.runtime'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_adopting_a_version_adds_the_global_change_to_ones_own_progress():
    own = {"w": jnp.array([1.0, 2.0])}
    base = {"w": np.array([0.5, 0.5], np.float32)}
    new = {"w": np.array([0.75, 0.0], np.float32)}
    np.testing.assert_allclose(add_global_change(own, new, base)["w"], [1.25, 1.5])


def test_wire_is_the_codec_round_trip_and_fp32_is_untouched():
    # Ties (1 + 2**-8 rounds to even), subnormals, signed zeros, infinities, random bits.
    bits = np.random.default_rng(0).integers(0, 2**32, 4096, dtype=np.uint64).astype(np.uint32)
    odd = [0.0, -0.0, np.inf, -np.inf, 1e-40, -1e-45, 3.4e38, 1 + 2**-8, 1 + 3 * 2**-8]
    edge = np.concatenate([np.array(odd, np.float32), bits.view(np.float32)])
    x = {
        "w": jnp.linspace(-1.0, 1.0, 64, dtype=jnp.float32),
        "e": jnp.asarray(edge[~np.isnan(edge)]),  # NaN payload bits are not specified
    }
    assert wire("fp32", x) is x
    bf16 = wire("bf16", x)
    want = outer.decode_tree(outer.encode_tree(x, "bf16"))
    for k in x:  # bit for bit, in the dtype sent
        assert bf16[k].dtype == want[k].dtype == np.float32
        assert np.asarray(bf16[k]).tobytes() == np.asarray(want[k]).tobytes()
    assert not np.array_equal(np.asarray(bf16["w"]), np.asarray(x["w"]))  # it did quantize
