"""The model's trainable parameters as one flat vector (perceptrain's ``parameters``)."""

from ._parameters import get_parameters, num_parameters, set_parameters

__all__ = ["get_parameters", "num_parameters", "set_parameters"]
