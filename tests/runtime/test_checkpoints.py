"""The runtime's orbax checkpoints: a pytree round-trips by its template, a copied save
is immune to later writes into the caller's arrays, and a wrong template is named."""

import ml_dtypes
import numpy as np
import pytest

from dipsjax.runtime.checkpoint import Checkpoints


def _state():
    return {
        "w": np.arange(12, dtype=np.float32).reshape(3, 4),
        "opt": (np.full(5, 0.5, ml_dtypes.bfloat16), np.int32(7)),
    }


def test_a_state_round_trips_by_its_template_and_a_copied_save_keeps_its_values(tmp_path):
    ck = Checkpoints(tmp_path / "ckpt", keep=2)
    state = _state()
    ck.save(3, state, {"version": 3, "ended": [[0, 2]]})
    state["w"][:] = -1.0  # the caller reuses its buffer before the write is done
    ck.save(4, _state(), {"version": 4}, copy=False)
    got, meta = ck.restore(_state(), step=3)
    assert meta == {"version": 3, "ended": [[0, 2]]}
    np.testing.assert_array_equal(got["w"], _state()["w"])  # copied at save
    ck.save(5, _state(), {"version": 5}, copy=False)
    assert ck.steps() == [4, 5]  # the 2 newest kept
    got, meta = ck.restore(_state(), step=4)
    assert meta == {"version": 4}
    np.testing.assert_array_equal(got["w"], _state()["w"])
    assert got["opt"][0].dtype == ml_dtypes.bfloat16 and float(got["opt"][0][0]) == 0.5
    assert int(got["opt"][1]) == 7
    ck.close()
    again = Checkpoints(tmp_path / "ckpt2")
    state = _state()
    again.save(1, state, {"version": 1})
    state["w"][:] = -1.0
    got, _ = again.restore(_state())
    np.testing.assert_array_equal(got["w"], _state()["w"])  # copied at save
    with pytest.raises(ValueError, match="leaf 000002 has shape \\(3, 4\\), the model wants"):
        again.restore({"w": np.zeros((2, 2), np.float32), "opt": _state()["opt"]})
    with pytest.raises(FileNotFoundError, match="no checkpoint with step 9"):
        again.restore(_state(), step=9)
    again.close()


def test_an_uncompressed_checkpoint_round_trips_and_is_not_compressed(tmp_path):
    """``compress=False`` (the followers'): the same state back, bit for bit; on disk at
    least the state's bytes (zeros would compress to almost nothing with zstd)."""
    zeros = {"w": np.zeros((1024, 256), np.float32), "opt": _state()["opt"]}
    sizes = {}
    for compress in (True, False):
        ck = Checkpoints(tmp_path / f"ckpt{compress}", compress=compress)
        ck.save(1, zeros, {"version": 1})
        got, _ = ck.restore(zeros)
        assert got["w"].tobytes() == zeros["w"].tobytes()
        ck.close()
        sizes[compress] = sum(
            p.stat().st_size for p in (tmp_path / f"ckpt{compress}").rglob("*") if p.is_file()
        )
    assert sizes[False] >= zeros["w"].nbytes > 10 * sizes[True], sizes
