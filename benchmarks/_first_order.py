"""The first-order methods the PINN benchmarks run against LM: Adam and L-BFGS, each as a
``step()`` on a loss function of the model's parameters.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

Loss = Callable[[], torch.Tensor]


def adam(model: torch.nn.Module, loss: Loss, lr: float, updates: int = 1) -> Callable[[], None]:
    """``torch.optim.Adam`` at ``lr``: one step is ``updates`` updates.

    **Arguments:**

    - `model`: the network whose parameters it trains.
    - `loss`: the loss, evaluated afresh at each update.
    - `lr`: the learning rate.
    - `updates`: Adam's updates per step.

    **Returns:** the step.
    """
    opt = torch.optim.Adam(model.parameters(), lr=lr)

    def step() -> None:
        for _ in range(updates):
            opt.zero_grad()
            loss().backward()
            opt.step()

    return step


def lbfgs(model: torch.nn.Module, loss: Loss) -> Callable[[], None]:
    """``torch.optim.LBFGS`` with a strong Wolfe line search and a history of 50: one step
    is one call of at most 20 iterations.

    **Arguments:**

    - `model`: the network whose parameters it trains.
    - `loss`: the loss, evaluated afresh at each iteration.

    **Returns:** the step.
    """
    opt = torch.optim.LBFGS(
        model.parameters(), lr=1.0, max_iter=20, history_size=50, line_search_fn="strong_wolfe"
    )

    def closure() -> torch.Tensor:
        opt.zero_grad()
        value = loss()
        value.backward()
        return value

    def step() -> None:
        opt.step(closure)

    return step
