"""Errors raised by marquardt.jacobian.

Every error is raised before any work starts (or, for faults only a forward pass can
reveal, before any result is handed out) and changes no parameter. Each message says
what was asked, what was found, and how to fix it, ending with ``HINT:``.
"""

from __future__ import annotations

from marquardt.devices.messages import message

__all__ = [
    "BatchLengthError",
    "BatchNormTrainingError",
    "CompileFallbackWarning",
    "DeviceMismatchError",
    "EmptyBatchError",
    "JacobianError",
    "NoTrainableParametersError",
    "NonFiniteInputError",
    "ParameterDtypeError",
    "ResidualDetachedError",
    "ResidualNotDifferentiableError",
    "ResidualNotFiniteError",
    "ResidualShapeError",
    "SliceSizeError",
    "UnknownModeError",
    "message",
]


class JacobianError(ValueError):
    """Base class of every input error of marquardt.jacobian (a ``ValueError``)."""


class BatchLengthError(JacobianError):
    """Inputs and targets hold a different number of samples."""


class EmptyBatchError(JacobianError):
    """The batch holds no sample."""


class SliceSizeError(JacobianError):
    """``slice_size`` is not in ``1..batch``."""


class NonFiniteInputError(JacobianError):
    """Inputs or targets contain NaN or infinity."""


class DeviceMismatchError(JacobianError):
    """The model lives on a device that is not one of the model devices."""


class NoTrainableParametersError(JacobianError):
    """The model has no parameter with ``requires_grad=True``."""


class ParameterDtypeError(JacobianError):
    """Trainable parameters do not share one floating dtype."""


class ResidualShapeError(JacobianError):
    """``residual_fn`` returned a tensor that does not hold whole rows per sample."""


class ResidualNotFiniteError(JacobianError):
    """``residual_fn`` returned NaN or infinity."""


class ResidualDetachedError(JacobianError):
    """``residual_fn`` returned a tensor that does not depend on the parameters."""


class BatchNormTrainingError(JacobianError):
    """A batch-norm layer is in training mode, which couples the samples of a batch."""


class UnknownModeError(JacobianError):
    """An unknown Jacobian mode or strategy was requested."""


class ResidualNotDifferentiableError(JacobianError):
    """A group of a ``PointResidual`` does not depend on the parameters at its first points
    (piecewise-linear activations, such as ReLU, under a second derivative)."""


class CompileFallbackWarning(UserWarning):
    """A compiled step was asked for and the compiler could not trace the network: the
    step runs eagerly (the same function, uncompiled)."""
