"""marquardt.jacobian: model replicas and data-parallel residual Jacobians in PyTorch.

For residuals ``r(θ) ∈ ℝᴿ`` of a model with flat trainable parameters ``θ ∈ ℝᴾ``, this
package computes ``J = ∂r/∂θ`` slice by slice on every model device, and hands out
either the slices of ``J`` or the Levenberg-Marquardt normal products ``JᵀJ`` and
``Jᵀr`` (Marquardt 1963; Nielsen 1999), or, without forming ``J``, the Gauss-Newton
products ``JᵀJv`` of a matrix-free step (Martens 2010). Residuals are functions of the model's outputs,
``residual_fn(outputs, targets)``, or call the model as a function of one point and
differentiate it by its inputs (``PointResidual``: physics-informed networks), at
collocation points that may be redrawn as training goes (``Collocation``).
"""

from __future__ import annotations

from ._columns import ColumnSubset
from ._engine import JacobianEngine
from ._errors import (
    BatchLengthError,
    BatchNormTrainingError,
    CompileFallbackWarning,
    DeviceMismatchError,
    EmptyBatchError,
    JacobianError,
    NonFiniteInputError,
    NoTrainableParametersError,
    ParameterDtypeError,
    ResidualDetachedError,
    ResidualNotDifferentiableError,
    ResidualNotFiniteError,
    ResidualShapeError,
    SliceSizeError,
    UnknownModeError,
)
from ._gauss_newton import GaussNewtonProducts
from ._grad_mode import keeps_grad_mode
from ._pinn import (
    CausalWeights,
    Collocation,
    FourierFeatures,
    HardBoundary,
    PeriodicFeatures,
    PinnStep,
    Sine,
)
from ._planner import JacobianPlan, plan_jacobian
from ._points import PointModel, PointResidual, ResidualGroup
from ._prepared import PreparedBatch
from ._products import JacobianSlice, NormalProducts, SliceStream
from ._replicas import Replicas

__all__ = [
    "BatchLengthError",
    "BatchNormTrainingError",
    "CausalWeights",
    "Collocation",
    "ColumnSubset",
    "CompileFallbackWarning",
    "DeviceMismatchError",
    "EmptyBatchError",
    "FourierFeatures",
    "GaussNewtonProducts",
    "HardBoundary",
    "JacobianEngine",
    "JacobianError",
    "JacobianPlan",
    "JacobianSlice",
    "NoTrainableParametersError",
    "NonFiniteInputError",
    "NormalProducts",
    "ParameterDtypeError",
    "PeriodicFeatures",
    "PinnStep",
    "PointModel",
    "PointResidual",
    "PreparedBatch",
    "Replicas",
    "ResidualDetachedError",
    "ResidualGroup",
    "ResidualNotDifferentiableError",
    "ResidualNotFiniteError",
    "ResidualShapeError",
    "Sine",
    "SliceSizeError",
    "SliceStream",
    "UnknownModeError",
    "keeps_grad_mode",
    "plan_jacobian",
]
