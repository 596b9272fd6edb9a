"""Small shared problems (float64) for the marquardt.jacobian tests."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

ResidualFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def diff(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return a - b


def ce_residual(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return torch.sqrt(F.cross_entropy(out, target, reduction="none") + 1e-6)


class SmallCNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(2, 3, kernel_size=3, padding=1, stride=1)
        self.conv2 = nn.Conv2d(3, 2, kernel_size=2, stride=2, dilation=1)
        self.conv1d = nn.Conv1d(2, 2, kernel_size=3, padding=1, bias=False)
        self.head = nn.Linear(2 * 2 * 2 + 4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.conv1(x))
        h = torch.tanh(self.conv2(h))  # (b, 2, 2, 2)
        s = torch.tanh(self.conv1d(h.reshape(h.shape[0], 2, 4)))  # (b, 2, 4)
        flat = torch.cat([h.reshape(h.shape[0], -1), s.reshape(s.shape[0], -1)[:, :4]], dim=1)
        return self.head(flat)


class BNModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.l1 = nn.Linear(3, 6)
        self.bn = nn.BatchNorm1d(6)
        self.l2 = nn.Linear(6, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.l2(torch.tanh(self.bn(self.l1(x))))


class EmbedModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(7, 3, padding_idx=0)
        self.out = nn.Linear(3, 2)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.out(torch.tanh(self.emb(ids)).mean(dim=1))


@dataclass
class Problem:
    name: str
    model: nn.Module
    x: torch.Tensor
    y: torch.Tensor
    residual_fn: ResidualFn


def make_problem(name: str) -> Problem:
    g = torch.Generator().manual_seed(1234)
    torch.manual_seed(1234)
    n = 7
    if name == "mlp":
        model = nn.Sequential(nn.Linear(3, 5), nn.Tanh(), nn.Linear(5, 1))
        x = torch.randn(n, 3, generator=g)
        y = torch.randn(n, 1, generator=g)
        fn: ResidualFn = diff
    elif name == "multi_output":
        model = nn.Sequential(nn.Linear(2, 4), nn.Tanh(), nn.Linear(4, 3))
        x = torch.randn(n, 2, generator=g)
        y = torch.randn(n, 3, generator=g)
        fn = diff
    elif name == "cnn":
        model = SmallCNN()
        x = torch.randn(n, 2, 4, 4, generator=g)
        y = torch.randn(n, 3, generator=g)
        fn = diff
    elif name == "batchnorm_eval":
        model = BNModel()
        with torch.no_grad():
            model.bn.running_mean.uniform_(-0.5, 0.5)
            model.bn.running_var.uniform_(0.5, 2.0)
        model.eval()
        x = torch.randn(n, 3, generator=g)
        y = torch.randn(n, 2, generator=g)
        fn = diff
    elif name == "frozen":
        model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2))
        model[0].weight.requires_grad_(False)
        x = torch.randn(n, 3, generator=g)
        y = torch.randn(n, 2, generator=g)
        fn = diff
    elif name == "cross_entropy":
        model = nn.Sequential(nn.Linear(3, 5), nn.Tanh(), nn.Linear(5, 4))
        x = torch.randn(n, 3, generator=g)
        y = torch.randint(0, 4, (n,), generator=g)
        fn = ce_residual
    elif name == "embedding":
        model = EmbedModel()
        x = torch.randint(0, 7, (n, 5), generator=g)
        y = torch.randn(n, 2, generator=g)
        fn = diff
    else:  # pragma: no cover
        raise KeyError(name)
    return Problem(
        name,
        model.double(),
        x.double() if x.is_floating_point() else x,
        y.double() if y.is_floating_point() else y,
        fn,
    )


PROBLEMS = ["mlp", "multi_output", "cnn", "batchnorm_eval", "frozen", "cross_entropy", "embedding"]
MODES = ["vmap", "jacfwd", "layers"]


def residuals_of(p: Problem, names: list[str]) -> Callable[[torch.Tensor], torch.Tensor]:
    """The problem's residuals over the whole batch as a function of the flat parameters
    (in the order of ``names``)."""
    shapes = {n: t.shape for n, t in p.model.named_parameters()}

    def residuals(theta: torch.Tensor) -> torch.Tensor:
        params = {}
        offset = 0
        for n in names:
            size = int(torch.Size(shapes[n]).numel())
            params[n] = theta[offset : offset + size].view(shapes[n])
            offset += size
        out = torch.func.functional_call(p.model, params, (p.x,))
        return p.residual_fn(out, p.y).reshape(-1)

    return residuals


def reference_jacobian(
    p: Problem, names: list[str], flat: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """J and r from torch.autograd.functional.jacobian over the whole batch."""
    residuals = residuals_of(p, names)
    jac = torch.autograd.functional.jacobian(residuals, flat)
    return jac, residuals(flat).detach()


def finite_difference_jacobian(
    p: Problem, names: list[str], flat: torch.Tensor, h: float = 1e-6
) -> torch.Tensor:
    """J by central differences of step ``h``."""
    residuals = residuals_of(p, names)
    cols = []
    with torch.no_grad():
        for j in range(flat.numel()):
            e = torch.zeros_like(flat)
            e[j] = h
            cols.append((residuals(flat + e) - residuals(flat - e)) / (2 * h))
    return torch.stack(cols, dim=1)
