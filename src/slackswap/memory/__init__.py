"""Device memory beyond saved activations: model states and the CUDA caching allocator."""

from .model_states import (
    OPTIMIZERS, PRECISIONS, SHARDINGS, ModelStates, model_states, parameter_count_of,
)
from .parameters import ParameterCount, transformer_parameters

__all__ = [
    "OPTIMIZERS", "PRECISIONS", "SHARDINGS", "ModelStates", "ParameterCount", "model_states",
    "parameter_count_of", "transformer_parameters",
]
