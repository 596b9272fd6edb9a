"""Time marching for the suite's problems in time (``Problem.in_time``, time the last input
on [0, 1]): the span cut into windows fitted in turn, each on points of its own window,
its initial rows the values the last window's network takes at the window's start, its
network starting from the last window's weights (Wight & Zhao 2021, "Solving Allen–Cahn
and Cahn–Hilliard equations using the adaptive physics informed neural networks";
Mattey & Ghosh 2022, "A novel sequential method to train physics informed neural
networks for Allen Cahn and Cahn Hilliard equations", CMAME 390).

`window` makes the problem of one window; `Marched` is the solution over the whole span,
each window's network on its own times; `Marching` drives the windows by time budget.
"""

from __future__ import annotations

import copy
import dataclasses

import torch
from pinn_problem import Points, Problem
from torch import nn

__all__ = ["Marched", "Marching", "window"]


def window(problem: Problem, lo: float, hi: float, start: nn.Module | None) -> Problem:
    """``problem`` on the times ``[lo, hi]``: every group's points drawn as before with
    their time mapped from [0, 1] to the window; the ``initial`` group's targets the values
    of ``start`` at its points (now at ``t = lo``), or the problem's own with None."""
    if not problem.in_time:
        raise ValueError(f"the problem {problem.name!r} has no time to march in")

    def sampler(rows: dict[str, int], g: torch.Generator) -> Points:
        out: Points = {}
        for name, value in problem.sampler(rows, g).items():
            x = (value[0] if isinstance(value, tuple) else value).clone()
            x[:, -1] = lo + (hi - lo) * x[:, -1]
            if name == "initial" and start is not None:
                with torch.no_grad():
                    out[name] = (x, start(x)[:, 0].detach())
            elif isinstance(value, tuple):
                out[name] = (x, value[1])
            else:
                out[name] = x
        return out

    return dataclasses.replace(problem, sampler=sampler)


class Marched(nn.Module):
    """The solution of the windows fitted so far: window ``k``'s network at the times in
    ``[edges[k], edges[k + 1])``, the last network at every later time.

    Arguments:
        nets: the windows' networks, in time order.
        edges: the windows' bounds (one more than the windows of the whole span).
    """

    def __init__(self, nets: list[nn.Module], edges: list[float]) -> None:
        super().__init__()
        self.nets = nn.ModuleList(nets)
        self.register_buffer("inner", torch.tensor(edges[1:-1], dtype=torch.float64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        k = torch.bucketize(x[:, -1].contiguous(), self.inner.to(x.dtype), right=True)
        k = k.clamp(max=len(self.nets) - 1).unsqueeze(-1)
        # Every network at every point, each kept where it serves: no data-dependent
        # branch, so that torch.func maps it over points.
        out = torch.zeros(int(x.shape[0]), 1, dtype=x.dtype, device=x.device)
        for i, net in enumerate(self.nets):
            out = torch.where(k == i, net(x), out)
        return out


class Marching:
    """The windows of ``problem``, fitted in turn by time budget.

    Arguments:
        problem: a problem in time.
        model: the network, trained window after window (each window starts from the
            weights the last one ended with).
        windows: how many equal windows cut [0, 1].
    """

    def __init__(self, problem: Problem, model: nn.Module, windows: int) -> None:
        self.problem = problem
        self.model = model
        self.edges = [k / windows for k in range(windows + 1)]
        self.done: list[nn.Module] = []
        self.current = window(problem, 0.0, self.edges[1], None)

    @property
    def index(self) -> int:
        """The window being fitted."""
        return len(self.done)

    def advance(self) -> Problem:
        """Freeze the current window's network, and the problem of the next window (its
        initial values those of the frozen network at its start)."""
        frozen = copy.deepcopy(self.model).requires_grad_(False)
        self.done.append(frozen)
        k = self.index
        self.current = window(self.problem, self.edges[k], self.edges[k + 1], frozen)
        return self.current

    def solution(self) -> Marched:
        """The whole span's solution: the frozen windows, then the network being fitted."""
        return Marched([*self.done, self.model], self.edges)
