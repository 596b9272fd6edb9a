"""backend="auto" and explicit backend names."""

from __future__ import annotations

import pytest
import torch

from marquardt.solver import BackendUnavailableError, SolverConfigError
from marquardt.solver._backends import choice
from marquardt.solver._backends.numpy_backend import NumpyBackend
from marquardt.solver._backends.torch_backend import TorchBackend


def test_auto_is_torch_on_the_model_device_without_legate_gpus(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("MARQUARDT_SOLVER_BACKEND", raising=False)
    monkeypatch.setattr(choice, "legate_gpus", lambda: 0)
    backend = choice.resolve_backend("auto", torch.device("cpu"))
    assert isinstance(backend, TorchBackend) and backend.device == torch.device("cpu")


def test_auto_is_cupynumeric_when_legate_holds_a_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MARQUARDT_SOLVER_BACKEND", raising=False)
    monkeypatch.setattr(choice, "legate_gpus", lambda: 2)
    assert choice._auto_name() == "cupynumeric"


def test_no_legate_config_means_no_legate_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LEGATE_CONFIG", raising=False)
    assert choice.legate_gpus() == 0


def test_environment_overrides_auto(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MARQUARDT_SOLVER_BACKEND", "numpy")
    assert isinstance(choice.resolve_backend("auto", torch.device("cpu")), NumpyBackend)
    # An explicit name is never overridden.
    assert isinstance(choice.resolve_backend("torch", torch.device("cpu")), TorchBackend)
    monkeypatch.setenv("MARQUARDT_SOLVER_BACKEND", "fortran")
    with pytest.raises(ValueError, match=r"MARQUARDT_SOLVER_BACKEND.*HINT"):
        choice.resolve_backend("auto", torch.device("cpu"))


def test_instances_pass_through_and_other_objects_are_refused() -> None:
    mine = NumpyBackend()
    assert choice.resolve_backend(mine, torch.device("cpu")) is mine
    with pytest.raises(SolverConfigError, match="ArrayBackend"):
        choice.resolve_backend(object(), torch.device("cpu"))  # type: ignore[arg-type]
    with pytest.raises(SolverConfigError, match="HINT"):
        choice.resolve_backend("jax", torch.device("cpu"))


def test_missing_backend_module_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(choice._MODULES, "cupynumeric", "marquardt.solver._backends.absent")
    with pytest.raises(BackendUnavailableError, match=r"marquardt-solver\[legate\]"):
        choice.resolve_backend("cupynumeric", torch.device("cpu"))
