"""One training run of the time-to-quality benchmark (``bench_quality.py``), traced: the
full-data MSE after each timed stretch of training, and the training time at which each
threshold was first reached.

The run is the seed's loop: 100000 points of ``y = sinc(10 x)``, shuffled batches of 10000
fetched on the host and moved to the device each step, a 1-H-1 tanh MLP from the seed. The
clock covers fetching the batch and the step (on a GPU it is read after the device has
finished); it is stopped for each evaluation of the MSE on every point.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import _common as c
import torch

from marquardt.testing.problems import sinc

THRESHOLDS = (1e-3, 1e-4, 1e-5, 1e-6)
#: Adam's steps between two evaluations (one epoch).
ADAM_EVAL_EVERY = 10
#: Ours takes its batch in slices of this many points on a GPU (the seed's setting).
GPU_SLICE = 5_000

Step = Callable[[torch.Tensor, torch.Tensor], bool]


class QualityTrace:
    """The full-data MSE after each timed stretch of training, and the training time at
    which each of ``THRESHOLDS`` was first reached.

    **Arguments:**

    - `mse`: the MSE before training.
    """

    def __init__(self, mse: float) -> None:
        self.trace: list[tuple[float, int, float]] = [(0.0, 0, mse)]
        self.reached: dict[str, float | None] = {f"{t:g}": None for t in THRESHOLDS}

    def stop(self, train: float, steps: int, mse: float, terminated: bool, why: str) -> str:
        """Record one evaluation; why the run ends now (``why`` if the optimizer
        terminated), or "" to go on."""
        self.trace.append((train, steps, mse))
        for t in THRESHOLDS:
            if self.reached[f"{t:g}"] is None and mse <= t:
                self.reached[f"{t:g}"] = train
        if mse <= THRESHOLDS[-1]:
            return "reached every threshold"
        if terminated:
            return why
        return "MSE is NaN" if mse != mse else ""


def _ours(model: torch.nn.Module, device: torch.device) -> tuple[Step, Any]:
    from marquardt.solver import LMA

    lma = LMA(model, [device], lambda a, b: a - b)
    slice_size = GPU_SLICE if device.type == "cuda" else None

    def step(x: torch.Tensor, y: torch.Tensor) -> bool:
        return lma.step(x, y, slice_size)[1]

    return step, lma.model


def _peer(model: torch.nn.Module, device: torch.device) -> tuple[Step, Any]:
    tlm = c.import_peer()
    module = tlm.training.LevenbergMarquardtModule(model, solve_method="cholesky")

    def step(x: torch.Tensor, y: torch.Tensor) -> bool:
        return bool(module.training_step(x, y)[2])

    return step, module.model


def _adam(model: torch.nn.Module, lr: float) -> tuple[Step, Any]:
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)

    def step(x: torch.Tensor, y: torch.Tensor) -> bool:
        optimizer.zero_grad(set_to_none=True)
        loss = (model(x) - y).pow(2).mean()
        loss.backward()
        optimizer.step()
        return False

    return step, model


def side(kind: str, model: torch.nn.Module, device: torch.device, lr: float | None) -> Any:
    """``(step, evaluated model)`` of ``kind`` ("ours", "peer", "adam" at ``lr``)."""
    if kind == "ours":
        return _ours(model, device)
    if kind == "peer":
        return _peer(model, device)
    assert lr is not None
    return _adam(model, lr)


def trace_run(
    kind: str, hidden: int, cap: float, lr: float | None = None, device: str = "cpu"
) -> dict[str, Any]:
    """One training run of ``kind`` on a 1-``hidden``-1 MLP for at most ``cap`` seconds of
    training, in this process (``bench_quality.py`` starts one process per run).

    **Arguments:**

    - `kind`: "ours", "peer" or "adam".
    - `hidden`: the MLP's hidden width.
    - `cap`: seconds of training at most.
    - `lr`: Adam's learning rate (Adam only).
    - `device`: the torch device the model and the steps run on.

    **Returns:** the trace, the time each threshold was reached, and why the run stopped.
    """
    where = torch.device(device)
    if where.type == "cpu":
        c.setup_threads()
    x_all, y_all = sinc()
    x_dev, y_dev = x_all.to(where), y_all.to(where)
    step, evaluated = side(kind, c.sinc_model(hidden).to(where), where, lr)
    eval_every = ADAM_EVAL_EVERY if kind == "adam" else 1
    batches = c.shuffled_batches(x_all, y_all)
    quality = QualityTrace(c.full_mse(evaluated, x_dev, y_dev))
    train, steps, stopped, eval_seconds = 0.0, 0, "time cap", 0.0
    while train < cap:
        c.synchronize(where)
        start = time.perf_counter()
        for _ in range(eval_every):
            x, y = next(batches)
            terminated = step(x.to(where), y.to(where))
            steps += 1
            if terminated:
                break
        c.synchronize(where)
        train += time.perf_counter() - start
        t_eval = time.perf_counter()
        mse = c.full_mse(evaluated, x_dev, y_dev)
        eval_seconds += time.perf_counter() - t_eval
        why = quality.stop(
            train, steps, mse, terminated, "the optimizer terminated (damping at its ceiling)"
        )
        if why:
            stopped = why
            break
    return {
        "kind": kind,
        "hidden": hidden,
        "lr": lr,
        "device": str(where),
        "cap_seconds": cap,
        "train_seconds": train,
        "eval_seconds_excluded": eval_seconds,
        "steps": steps,
        "final_mse": quality.trace[-1][2],
        "stopped": stopped,
        "reached": quality.reached,
        "trace": quality.trace,
    }
