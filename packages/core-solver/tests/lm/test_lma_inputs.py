"""Bad input at the LMA level (issue 8): a clear error before any work, nothing changed.

Each case checks the error type, that the message says what was found and ends in a HINT,
and that the model's parameters (and the solver's λ, step count and report) are those
from before the call. Batch-shape cases live in ``test_lma.py``; these are the rest of
issue 8's list: dtypes, devices, slice sizes above the batch, models without trainable
parameters or on a foreign device, Legate's GPUs among the model devices, and
residual functions of the wrong shape, with NaN, or detached from the parameters.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
import torch
from problems import problem, residual_fn
from torch import nn

from marquardt.devices import DeviceError
from marquardt.jacobian import (
    DeviceMismatchError,
    NoTrainableParametersError,
    ResidualDetachedError,
    ResidualNotFiniteError,
    ResidualShapeError,
)
from marquardt.solver import LMA, SolverInputError
from marquardt.testing.models import flat


def _stepped(fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = residual_fn) -> LMA:
    """An LMA on the exponential problem after one good step (λ and report are set)."""
    prob = problem("exponential")
    lma = LMA(prob.make_model(), ["cpu"], fn, backend="numpy")
    lma.step(prob.x, prob.y)
    return lma


def _state(lma: LMA) -> tuple[torch.Tensor, float, int, object]:
    return flat(lma.model), lma.damping, lma.steps, lma.report


def _unchanged(lma: LMA, before: tuple[torch.Tensor, float, int, object]) -> None:
    params, damping, steps, report = before
    assert torch.equal(flat(lma.model), params)
    assert (lma.damping, lma.steps, lma.report) == (damping, steps, report)


STEP_CASES = [
    ("float32 inputs", lambda x, y: (x.float(), y), None, "float64", "inputs.to("),
    ("float32 targets", lambda x, y: (x, y.float()), None, "float64", "targets.to("),
    ("meta inputs", lambda x, y: (x.to("meta"), y), None, "on meta", "keep them on the CPU"),
    ("slice above batch", lambda x, y: (x[:7], y[:7]), 8, "batch of 7", "drop_last"),
]


@pytest.mark.parametrize(
    ("label", "make", "slice_size", "found", "hint"), STEP_CASES, ids=[c[0] for c in STEP_CASES]
)
def test_bad_batch_fails_before_any_work(label, make, slice_size, found, hint) -> None:  # type: ignore[no-untyped-def]
    prob = problem("exponential")
    lma = _stepped()
    before = _state(lma)
    x, y = make(prob.x, prob.y)
    with pytest.raises(SolverInputError, match="HINT") as info:
        lma.step(x, y, slice_size)
    assert found in str(info.value) and hint in str(info.value)
    _unchanged(lma, before)


def test_slice_size_equal_to_the_batch_is_one_slice() -> None:
    prob = problem("exponential")
    lma = _stepped()
    lma.step(prob.x[:7], prob.y[:7], slice_size=7)
    assert lma.report is not None and lma.report.rows == 7


def _wrong_shape(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return (a - b).mean()  # one number for the whole batch, not rows per sample


def _detached(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return (a - b).detach()


_BAD_TARGET = problem("exponential").y[30]


def _nan_at_sample_30(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    # NaN for sample 30 only (past the few samples the engine probes first); by value,
    # so that it holds whether the engine calls this per sample or per chunk.
    return torch.where(b == _BAD_TARGET, torch.full_like(a, math.nan), a - b)


RESIDUAL_CASES = [
    ("wrong shape", _wrong_shape, ResidualShapeError, "residuals per sample"),
    ("detached", _detached, ResidualDetachedError, "do not depend on any trainable parameter"),
    ("nan", _nan_at_sample_30, ResidualNotFiniteError, "sample 30"),
]


@pytest.mark.parametrize(
    ("label", "fn", "error", "found"), RESIDUAL_CASES, ids=[c[0] for c in RESIDUAL_CASES]
)
def test_bad_residual_fn_fails_before_parameters_move(label, fn, error, found) -> None:  # type: ignore[no-untyped-def]
    prob = problem("exponential")
    lma = _stepped()
    lma._engine.residual_fn = fn  # the same solver, now with a faulty residual function
    before = _state(lma)
    with pytest.raises(error, match="HINT") as info:
        lma.step(prob.x, prob.y)
    assert found in str(info.value)
    _unchanged(lma, before)


def test_model_without_trainable_parameters_is_refused() -> None:
    prob = problem("exponential")
    model = prob.make_model().requires_grad_(False)
    before = flat(model)
    with pytest.raises(NoTrainableParametersError, match="HINT"):
        LMA(model, ["cpu"], residual_fn)
    assert torch.equal(flat(model), before)


def test_model_on_a_device_not_in_devices_is_refused() -> None:
    model = nn.Linear(2, 1, device="meta")
    with pytest.raises(DeviceMismatchError, match=r"meta.*not one of them.*HINT"):
        LMA(model, ["cpu"], residual_fn)


def _fake_split(monkeypatch: pytest.MonkeyPatch, gpus: int, legate: int) -> None:
    """``gpus`` visible GPUs of which Legate holds the first ``legate`` (no NVML needed)."""
    from marquardt.devices import _split
    from marquardt.devices._discovery import GpuInfo, Survey

    infos = tuple(
        GpuInfo(
            ordinal=i,
            index=i,
            uuid=f"GPU-{i}",
            name="test GPU",
            memory_total=16 << 30,
            memory_used=0,
            memory_free=16 << 30,
            utilization_gpu=0,
            utilization_memory=0,
            mig_mode=None,
            pci_bus_id=f"0000:0{i}:00.0",
        )
        for i in range(gpus)
    )
    monkeypatch.setattr(_split, "survey", lambda: Survey(infos))
    monkeypatch.setenv("LEGATE_CONFIG", f"--gpus {legate}")


def test_devices_held_by_legate_are_refused_before_anything_is_built(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _fake_split(monkeypatch, gpus=4, legate=3)
    prob = problem("exponential")
    model = prob.make_model()  # on the CPU: the device check must come first
    before = flat(model)
    with pytest.raises(DeviceError, match=r"cuda:1 is held by Legate.*HINT: .*cuda:3"):
        LMA(model, [torch.device("cuda:3"), "cuda:1"], residual_fn)
    assert torch.equal(flat(model), before)


def test_cpu_devices_are_never_checked_against_legate(monkeypatch: pytest.MonkeyPatch) -> None:
    from marquardt.devices import _split

    def fail() -> None:
        raise AssertionError("CPU devices must not survey the GPUs")

    monkeypatch.setattr(_split, "survey", fail)
    prob = problem("exponential")
    LMA(prob.make_model(), ["cpu", torch.device("cpu")], residual_fn)


def test_sync_replicas_copies_a_loaded_state_to_every_replica() -> None:
    prob = problem("exponential")
    model = prob.make_model()
    lma = LMA(model, ["cpu", "cpu"], residual_fn, backend="numpy")
    lma.step(prob.x, prob.y)
    target = {k: v + 0.25 for k, v in model.state_dict().items()}
    model.load_state_dict(target)  # writes into the source model's replica only
    other = lma._replicas[1].flat
    assert not torch.equal(other, lma._replicas[0].flat)
    lma.sync_replicas()
    assert torch.equal(lma._replicas[1].flat, lma._replicas[0].flat)
    assert torch.equal(lma._replicas[0].flat, flat(model))


def test_residuals_that_grow_with_the_batch_are_refused_naming_the_shapes() -> None:
    """Targets (N,) against outputs (N, 1): ``out - y`` broadcasts to N × N; refused before
    any work, with the shapes of the outputs, the targets and the residuals."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(1, 8), nn.Tanh(), nn.Linear(8, 1)).double()
    x = torch.linspace(-1, 1, 200, dtype=torch.float64)[:, None]
    y = torch.sin(3 * x[:, 0])
    lma = LMA(model, ["cpu"], lambda out, t: out - t)
    params = flat(model).clone()
    with pytest.raises(ResidualShapeError, match="HINT") as info:
        lma.step(x, y)
    text = str(info.value)
    assert "outputs of shape (4, 1)" in text and "targets of shape (4,)" in text
    assert "residuals of shape (4, 4)" in text and "grows with the batch" in text
    assert torch.equal(flat(model), params) and lma.steps == 0
    assert lma.step(x, y[:, None])[0] >= 0  # the targets in the outputs' shape are taken
