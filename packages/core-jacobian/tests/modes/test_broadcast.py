"""The ``broadcast`` mode (per-sample copies of the parameters) against the other modes."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from marquardt.jacobian import JacobianEngine, Replicas, plan_jacobian


class Curve(nn.Module):
    """y = a·exp(−((x − μ)/s)²) + W·[x, x²] with a vector and a 2 × 2 matrix parameter;
    element-wise in its parameters, so it evaluates per-sample copies of them."""

    per_sample_parameters = True

    def __init__(self, outputs: int = 1) -> None:
        super().__init__()
        self.outputs = outputs
        self.peak = nn.Parameter(torch.tensor([1.5, 0.2, 0.7], dtype=torch.float64))
        self.mix = nn.Parameter(torch.tensor([[0.3, -0.2], [0.1, 0.4]], dtype=torch.float64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, mu, s = self.peak.unbind(0)
        bump = a * torch.exp(-(((x - mu) / s) ** 2))
        first = bump + self.mix[0, 0] * x + self.mix[0, 1] * x * x
        if self.outputs == 1:
            return first.unsqueeze(-1)
        second = bump * self.mix[1, 0] + self.mix[1, 1] * x
        return torch.stack([first, second], dim=-1)


class Mixing(Curve):
    """Declares per-sample parameters but gives every sample the first sample's copy:
    wrong by design."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = super().forward(x)
        return out + self.peak.reshape(3, -1)[:, 0].sum()


class Scalar(Curve):
    """Declares per-sample parameters but reads one as a Python number: fails by design."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x) * float(self.peak[0].detach())


def _data(n: int, outputs: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    x = torch.linspace(-2.0, 2.0, n, dtype=torch.float64)
    y = torch.randn(n, outputs, generator=g, dtype=torch.float64)
    return x, y


def _residual(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return out - y


@pytest.mark.parametrize("outputs", [1, 2])
def test_broadcast_matches_vmap_and_is_chosen(outputs: int) -> None:
    x, y = _data(37, outputs)
    fast = JacobianEngine(Replicas(Curve(outputs), ["cpu"]), _residual)
    jac, res = fast.jacobian(x, y, slice_size=10)
    assert fast.last_plan is not None and fast.last_plan.mode == "broadcast"
    assert "per_sample_parameters" in fast.last_plan.reason
    ref = JacobianEngine(Replicas(Curve(outputs), ["cpu"]), _residual, mode="vmap")
    ref_j, ref_r = ref.jacobian(x, y, slice_size=10)
    assert jac.shape == (37 * outputs, 7)
    torch.testing.assert_close(jac, ref_j, rtol=1e-12, atol=1e-13)
    torch.testing.assert_close(res, ref_r, rtol=1e-12, atol=1e-13)


def test_broadcast_accumulate_matches_explicit() -> None:
    x, y = _data(300, 2)
    engine = JacobianEngine(Replicas(Curve(2), ["cpu"]), _residual, memory_budget=1 << 12)
    products = engine.accumulate(x, y)
    plan = engine.last_plan
    assert plan is not None and plan.mode == "broadcast" and plan.samples_per_chunk < 300
    jac, res = engine.jacobian(x, y)
    torch.testing.assert_close(products.jtj, jac.T @ jac, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(products.jtr, jac.T @ res, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(("model", "why"), [(Mixing, "disagree"), (Scalar, "failed")])
def test_a_model_that_mixes_samples_falls_back(model: type[Curve], why: str) -> None:
    x, y = _data(20, 1)
    engine = JacobianEngine(Replicas(model(1), ["cpu"]), _residual, mode="broadcast")
    jac, _ = engine.jacobian(x, y)
    plan = engine.last_plan
    assert plan is not None and plan.mode == "jacfwd" and why in plan.reason
    ref = JacobianEngine(Replicas(model(1), ["cpu"]), _residual, mode="vmap")
    torch.testing.assert_close(jac, ref.jacobian(x, y)[0], rtol=1e-12, atol=1e-13)


def test_undeclared_models_never_get_broadcast() -> None:
    plain = nn.Sequential(nn.Linear(1, 3), nn.Tanh(), nn.Linear(3, 1)).double()
    x = torch.linspace(0.0, 1.0, 9, dtype=torch.float64).unsqueeze(1)
    engine = JacobianEngine(Replicas(plain, ["cpu"]), _residual, mode="broadcast")
    engine.jacobian(x, torch.zeros(9, 1, dtype=torch.float64))
    assert engine.last_plan is not None and engine.last_plan.mode == "jacfwd"
    assert "does not declare" in engine.last_plan.reason


def test_planner_caps_broadcast_chunks_at_cache_size() -> None:
    plan = plan_jacobian(
        10**7, 4, 1, torch.float64, 1 << 30, mode="broadcast", broadcast_supported=True
    )
    assert plan.mode == "broadcast" and plan.samples_per_chunk == 1 << 16
