"""An interrupt at a random moment inside a slice stream reaches the caller as
KeyboardInterrupt, with one device (inline) and two (worker threads), and leaves the
parameters and the engine as they were."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from marquardt.jacobian import JacobianEngine, Replicas
from marquardt.testing.interrupts import interrupt_repeatedly


def _engine(devices: list[str]) -> tuple[JacobianEngine, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(1, 24), nn.Tanh(), nn.Linear(24, 24), nn.Tanh(),
                          nn.Linear(24, 1)).double()  # fmt: skip
    x = torch.linspace(-1.0, 1.0, 400, dtype=torch.float64).reshape(-1, 1)
    engine = JacobianEngine(Replicas(model, devices), lambda a, b: a - b)
    return engine, x, torch.sinc(10.0 * x)


@pytest.mark.parametrize("devices", [["cpu"], ["cpu", "cpu"]], ids=["inline", "threads"])
def test_interrupts_inside_the_slice_stream_stay_interrupts(devices: list[str]) -> None:
    engine, x, y = _engine(devices)
    start = engine.replicas.flat_params().clone()
    reference, _ = engine.jacobian(x, y, slice_size=20)

    def work() -> None:
        for piece in engine.slices(x, y, slice_size=20):
            piece.jacobian.sum()

    def after(_hit: bool) -> None:
        assert torch.equal(engine.replicas.flat_params(), start)
        torch.set_grad_enabled(
            True
        )  # a stream leaves grad mode to its consumer (LMA.step keeps it)

    hits, runs = interrupt_repeatedly(work, after, trials=40, seed=3, hits=12)
    assert hits >= 12, f"only {hits} of {runs} streams were interrupted"
    jac, _ = engine.jacobian(x, y, slice_size=20)
    assert torch.equal(jac, reference)
    engine.close()


def test_an_interrupt_inside_restore_restores_every_replica_first(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    engine, _x, _y = _engine(["cpu", "cpu"])
    replicas = engine.replicas
    start = replicas.flat_params().clone()
    replicas.backup()
    replicas.add_(torch.ones_like(start))
    copy = torch.Tensor.copy_
    calls = [0]

    def copy_then_interrupt(self: torch.Tensor, src: torch.Tensor) -> torch.Tensor:
        out = copy(self, src)
        calls[0] += 1
        if calls[0] == 1:
            raise KeyboardInterrupt
        return out

    monkeypatch.setattr(torch.Tensor, "copy_", copy_then_interrupt)
    with pytest.raises(KeyboardInterrupt):
        replicas.restore()
    monkeypatch.undo()
    for i in range(2):
        assert torch.equal(replicas[i].flat, start)
    engine.close()
