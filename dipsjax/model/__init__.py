"""The decoder language model: LLaMA-style Flax NNX modules, named configs and memory plans."""

from dipsjax.model.configs import BYTE_VOCAB_SIZE, CONFIG_NAMES, ModelConfig, get_config
from dipsjax.model.llama import LOGICAL_AXIS_RULES, Llama, abstract_model, count_params

__all__ = [
    "BYTE_VOCAB_SIZE",
    "CONFIG_NAMES",
    "LOGICAL_AXIS_RULES",
    "Llama",
    "ModelConfig",
    "abstract_model",
    "count_params",
    "get_config",
]
