"""Named configurations: validation messages, exact parameter counts, abstract builds."""

import jax
import pytest
from flax import nnx

from dipsjax.model import CONFIG_NAMES, ModelConfig, abstract_model, count_params, get_config


def test_every_named_config_is_listed():
    assert set(CONFIG_NAMES) == {"tiny", "small", "llama3.2-1b", "qwen3-14b", "dips-100b"}


@pytest.mark.parametrize("name", CONFIG_NAMES)
def test_eval_shape_builds_every_config_without_allocation(name):
    config = get_config(name)
    # Hold the arrays alive now: one freed by the collector meanwhile would
    # change the count without anything being allocated.
    before = jax.live_arrays()
    model = abstract_model(config)
    _, params = nnx.split(model, nnx.Param)
    leaves = jax.tree.leaves(params)
    assert leaves and all(isinstance(x, jax.ShapeDtypeStruct) for x in leaves)
    assert len(jax.live_arrays()) == len(before)
    # The closed-form count agrees with the built model, parameter for parameter.
    assert count_params(params) == config.num_params


def test_published_shapes_give_published_counts():
    # Llama 3.2 1B: 1,235,814,400 parameters (tied); Qwen3 14B: 14.8B (untied, QK-norm).
    assert get_config("llama3.2-1b").num_params == 1_235_814_400
    assert get_config("qwen3-14b").num_params == pytest.approx(14.77e9, rel=2e-3)


def test_dips_100b_is_100b_within_5_percent():
    config = get_config("dips-100b")
    assert (config.num_layers, config.d_model, config.d_ff) == (96, 8192, 36864)
    assert config.num_params == pytest.approx(100e9, rel=0.05)


def test_tiny_is_byte_level():
    tiny = ModelConfig.tiny()
    assert tiny.vocab_size == 260 and tiny.max_seq_len == 128
    assert tiny.num_kv_heads < tiny.num_heads
    assert ModelConfig.tiny(vocab_size=300).vocab_size == 300


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"d_model": 0}, "d_model"),
        ({"num_layers": -1}, "num_layers"),
        ({"num_kv_heads": 3}, "num_kv_heads"),
        ({"head_dim": 7}, "head_dim"),
        ({"d_model": 66, "head_dim": None}, "head_dim"),
        ({"rope_theta": 0.5}, "rope_theta"),
        ({"norm_eps": 0.0}, "norm_eps"),
        ({"dtype": "float16"}, "dtype"),
        ({"vocab_size": 2.5}, "vocab_size"),
    ],
)
def test_invalid_fields_are_named(overrides, field):
    with pytest.raises(ValueError, match=field):
        get_config("tiny", **overrides)


def test_unknown_name_lists_known_ones():
    with pytest.raises(ValueError, match="tiny"):
        get_config("gpt-5")


def test_configs_are_frozen():
    with pytest.raises(AttributeError):
        get_config("tiny").d_model = 3  # type: ignore[misc]
