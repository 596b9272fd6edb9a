"""Bad input fails before any work, with the house message, and changes nothing."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from jacobian_problems import make_problem
from torch import nn

from marquardt.jacobian import (
    BatchLengthError,
    BatchNormTrainingError,
    EmptyBatchError,
    JacobianEngine,
    NonFiniteInputError,
    Replicas,
    ResidualDetachedError,
    ResidualNotFiniteError,
    ResidualShapeError,
    SliceSizeError,
    UnknownModeError,
)


def _engine(
    fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
) -> JacobianEngine:
    problem = make_problem("mlp")
    return JacobianEngine(Replicas(problem.model, ["cpu", "cpu"]), fn or problem.residual_fn)


CALLS = ["slices", "accumulate", "loss", "residuals"]


def _call(
    engine: JacobianEngine, name: str, x: torch.Tensor, y: torch.Tensor, size: int | None = None
) -> None:
    if name == "slices":
        list(engine.slices(x, y, size))
    elif name == "accumulate":
        engine.accumulate(x, y, size)
    elif name == "loss":
        engine.loss(x, y, size)
    else:
        engine.residuals(x, y, size)


@pytest.mark.parametrize("call", CALLS)
@pytest.mark.parametrize(
    ("case", "error", "pattern"),
    [
        ("length", BatchLengthError, r"inputs hold 7 and targets hold 6\. HINT"),
        ("empty", EmptyBatchError, r"empty.*HINT"),
        ("slice0", SliceSizeError, r"slice_size=0.*between 1 and 7.*HINT"),
        ("slice_big", SliceSizeError, r"slice_size=8.*HINT"),
        ("nan_input", NonFiniteInputError, r"finite inputs.*first in sample 2.*HINT"),
        ("inf_target", NonFiniteInputError, r"finite targets.*HINT"),
    ],
)
def test_bad_batches(call: str, case: str, error: type[Exception], pattern: str) -> None:
    engine = _engine()
    problem = make_problem("mlp")
    x, y, size = problem.x, problem.y, None
    if case == "length":
        y = y[:6]
    elif case == "empty":
        x, y = x[:0], y[:0]
    elif case == "slice0":
        size = 0
    elif case == "slice_big":
        size = 8
    elif case == "nan_input":
        x = x.clone()
        x[2, 1] = float("nan")
    elif case == "inf_target":
        y = y.clone()
        y[0, 0] = float("inf")
    before = engine.replicas.flat_params()
    with pytest.raises(error, match=pattern):
        _call(engine, call, x, y, size)
    assert torch.equal(engine.replicas.flat_params(), before)
    assert engine.last_plan is None


def test_residual_not_per_sample() -> None:
    problem = make_problem("mlp")
    engine = _engine(lambda a, b: (a - b).mean())
    with pytest.raises(ResidualShapeError, match=r"returned a tensor of shape \(\).*HINT"):
        engine.accumulate(problem.x, problem.y)
    engine = _engine(lambda a, b: (a - b).reshape(-1)[:-1])
    with pytest.raises(ResidualShapeError, match="HINT"):
        list(engine.slices(problem.x, problem.y))


def test_residuals_broadcast_against_the_batch_are_refused_before_any_slice() -> None:
    """Outputs (N, 1) less targets (N,) broadcast to N × N: their count per sample grows with
    the batch, which the probe tells from N × m before any Jacobian is formed."""
    problem = make_problem("mlp")
    outputs = problem.model(problem.x)
    targets = torch.zeros(outputs.shape[0], dtype=outputs.dtype)
    engine = _engine(lambda a, b: a[:, :1] - b)
    with pytest.raises(ResidualShapeError, match=r"grows with the batch.*HINT") as info:
        engine.accumulate(problem.x, targets)
    assert "residuals of shape (4, 4)" in str(info.value)


def test_residual_nan_and_detached() -> None:
    problem = make_problem("mlp")
    engine = _engine(lambda a, b: torch.log(a - b - 100.0))
    with pytest.raises(ResidualNotFiniteError, match=r"NaN or infinite.*HINT"):
        engine.accumulate(problem.x, problem.y)
    engine = _engine(lambda a, b: (a - b).detach())
    with pytest.raises(ResidualDetachedError, match=r"do not depend.*HINT"):
        list(engine.slices(problem.x, problem.y))


def test_nan_residual_late_in_batch_is_caught_before_products_are_returned() -> None:
    problem = make_problem("mlp")
    y = problem.y.clone()
    y[6] = 1000.0  # finite target whose residual the function below makes NaN

    def fn(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.where(b > 500.0, torch.nan, 1.0) * (a - b)

    engine = _engine(fn)
    before = engine.replicas.flat_params()
    for name in ("accumulate", "loss"):
        with pytest.raises(ResidualNotFiniteError, match="first at sample 6"):
            _call(engine, name, problem.x, y)
    assert torch.equal(engine.replicas.flat_params(), before)


def test_batchnorm_in_training_mode_is_refused() -> None:
    problem = make_problem("batchnorm_eval")
    problem.model.train()
    engine = JacobianEngine(Replicas(problem.model, ["cpu"]), problem.residual_fn)
    with pytest.raises(
        BatchNormTrainingError, match=r"'bn' \(BatchNorm1d\).*HINT: call model.eval"
    ):
        engine.accumulate(problem.x, problem.y)
    running = problem.model.bn.running_mean.clone()
    assert torch.equal(problem.model.bn.running_mean, running)


def test_unknown_mode_and_bad_arguments(monkeypatch: pytest.MonkeyPatch) -> None:
    replicas = Replicas(nn.Linear(2, 1), ["cpu"])
    with pytest.raises(UnknownModeError, match=r"mode='fast'.*HINT"):
        JacobianEngine(replicas, lambda a, b: a - b, mode="fast")
    monkeypatch.setenv("MARQUARDT_JACOBIAN_MODE", "nope")
    with pytest.raises(UnknownModeError, match="MARQUARDT_JACOBIAN_MODE=nope"):
        JacobianEngine(replicas, lambda a, b: a - b)
    monkeypatch.setenv("MARQUARDT_JACOBIAN_MODE", "jacfwd")
    assert JacobianEngine(replicas, lambda a, b: a - b).mode == "jacfwd"
    with pytest.raises(TypeError, match="HINT"):
        JacobianEngine(replicas, "a - b")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="memory_budget"):
        JacobianEngine(replicas, lambda a, b: a - b, memory_budget=0)
