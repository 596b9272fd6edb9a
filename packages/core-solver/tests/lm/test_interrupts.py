"""Ctrl-C at a random moment inside ``curve_fit`` (the small batched core, NumPy and torch
models, and the sliced engine) reaches the caller as KeyboardInterrupt, every time, and
leaves torch's thread count as it was."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch

from marquardt.solver import curve_fit
from marquardt.testing.interrupts import interrupt_repeatedly


def _numpy_model(x: np.ndarray, a: float, b: float, c: float) -> np.ndarray:
    return a * np.exp(-b * x) + c * np.sin(3.0 * x)


def _torch_model(x: torch.Tensor, a: Any, b: Any, c: Any) -> torch.Tensor:
    return a * torch.exp(-b * x) + c * torch.sin(3.0 * x)


def _fits() -> dict[str, Callable[[], object]]:
    x = np.linspace(0.0, 4.0, 4000)
    y = _numpy_model(x, 2.5, 1.3, 0.5) + 0.01 * np.random.default_rng(0).normal(size=x.size)
    xt, yt = torch.as_tensor(x), torch.as_tensor(y)
    return {
        "numpy": lambda: curve_fit(_numpy_model, x, y, p0=[1.0, 1.0, 1.0]),
        "torch": lambda: curve_fit(_torch_model, xt, yt, p0=[1.0, 1.0, 1.0]),
        "robust": lambda: curve_fit(_torch_model, xt, yt, p0=[1.0, 1.0, 1.0], loss="soft_l1"),
        "engine": lambda: curve_fit(_torch_model, xt, yt, p0=[1.0, 1.0, 1.0], slice_size=500),
    }


@pytest.mark.parametrize("path", ["numpy", "torch", "robust", "engine"])
def test_interrupts_inside_curve_fit_stay_interrupts(path: str) -> None:
    fit = _fits()[path]
    threads = torch.get_num_threads()

    def after(_hit: bool) -> None:
        assert torch.get_num_threads() == threads
        assert torch.is_grad_enabled(), "grad mode was left off"

    hits, runs = interrupt_repeatedly(fit, after, trials=40, seed=11, hits=12)
    assert hits >= 12, f"only {hits} of {runs} fits were interrupted"
    popt, _pcov = fit()
    np.testing.assert_allclose(np.asarray(popt), [2.5, 1.3, 0.5], atol=0.05)


TRIALS = 40

_STEPS: dict[str, dict[str, Any]] = {
    "two-workers": {"devices": ["cpu", "cpu"]},
    "explicit-geodesic": {"devices": ["cpu"], "strategy": "explicit", "geodesic": 0.75},
    "param-subsets": {"devices": ["cpu"], "params_per_step": 200, "seed": 0},
}


@pytest.mark.parametrize("name", list(_STEPS))
def test_interrupts_inside_lma_step_stay_interrupts(name: str) -> None:
    """Each interrupted step raises KeyboardInterrupt and leaves θ at the point the step
    began or at an accepted one: never at a rejected trial point, on any replica."""
    from marquardt.solver import LMA

    options = dict(_STEPS[name])
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(1, 24), torch.nn.Tanh(), torch.nn.Linear(24, 24), torch.nn.Tanh(),
        torch.nn.Linear(24, 1),
    ).double()  # fmt: skip
    x = torch.linspace(-1.0, 1.0, 300, dtype=torch.float64).reshape(-1, 1)
    y = torch.sinc(10.0 * x)
    lma = LMA(model, options.pop("devices"), lambda a, b: a - b, damping="fixed",
              damping_start=1e-9, damping_up=1.5, attempts=20, **options)  # fmt: skip
    replicas = lma._replicas
    before: list[tuple[torch.Tensor, float]] = []

    def loss() -> float:
        with torch.no_grad():
            return float((model(x) - y).pow(2).mean())

    def work() -> None:
        before.append((replicas.flat_params().clone(), loss()))
        lma.step(x, y, 100)

    def after(_hit: bool) -> None:
        assert torch.is_grad_enabled(), "grad mode was left off"
        start, loss_start = before[-1]
        now = replicas.flat_params()
        for i in range(len(replicas)):
            assert torch.equal(replicas[i].flat, now), "the replicas disagree"
        assert torch.equal(now, start) or loss() < loss_start
        if lma.damping >= 1e6:
            lma.damping_rule.load_state_dict({**lma.damping_rule.state_dict(), "damping": 1e-9})

    hits, runs = interrupt_repeatedly(work, after, trials=TRIALS, seed=5, hits=12)
    assert hits >= 12, f"only {hits} of {runs} steps were interrupted"


@pytest.mark.parametrize("entry", ["curve_fit", "curve_fit_result", "curve_fit_batch"])
def test_an_interrupt_inside_no_grad_exit_leaves_grad_mode_on(
    entry: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An interrupt landing inside ``torch.no_grad().__exit__`` before it restores grad
    mode (the race the test above hits at random), made to happen on the first exit."""
    from marquardt.solver import curve_fit_batch, curve_fit_result

    exits = 0

    def interrupted_exit(self: torch.no_grad, *_exc: object) -> None:
        nonlocal exits
        exits += 1
        raise KeyboardInterrupt  # before grad mode is restored

    monkeypatch.setattr(torch.no_grad, "__exit__", interrupted_exit)
    x = torch.linspace(0.0, 4.0, 200, dtype=torch.float64)
    y = _torch_model(x, 2.5, 1.3, 0.5)
    call = {
        "curve_fit": lambda: curve_fit(_torch_model, x, y, p0=[1.0, 1.0, 1.0]),
        "curve_fit_result": lambda: curve_fit_result(_torch_model, x, y, [1.0, 1.0, 1.0]),
        "curve_fit_batch": lambda: curve_fit_batch(
            _torch_model, x, y.repeat(4, 1), torch.ones(4, 3, dtype=torch.float64)
        ),
    }[entry]
    with pytest.raises(KeyboardInterrupt):
        call()
    monkeypatch.undo()
    assert exits == 1
    assert torch.is_grad_enabled(), "grad mode was left off"
