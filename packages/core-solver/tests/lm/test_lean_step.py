"""One LM step does each piece of work once: one check of the batch, one probe forward,
one plan; δ stays on the backend's device; an interrupted step leaves no trial point."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn

import marquardt.jacobian._engine_plan as engine_module
from marquardt.solver import LMA
from marquardt.solver._lm.attempt import eager as attempts_module
from marquardt.testing.interrupts import interrupt_repeatedly


def _sinc(n: int, dtype: torch.dtype = torch.float64) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.linspace(-1.0, 1.0, n, dtype=dtype).reshape(-1, 1)
    return x, torch.sinc(10.0 * x)


def _mlp(width: int, depth: int = 1, dtype: torch.dtype = torch.float64) -> nn.Module:
    torch.manual_seed(0)
    layers: list[nn.Module] = [nn.Linear(1, width), nn.Tanh()]
    for _ in range(depth - 1):
        layers += [nn.Linear(width, width), nn.Tanh()]
    layers.append(nn.Linear(width, 1))
    return nn.Sequential(*layers).to(dtype)


def _counting(monkeypatch: pytest.MonkeyPatch, module: Any, name: str) -> list[int]:
    calls: list[int] = []
    original: Callable[..., Any] = getattr(module, name)

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(module, name, counted)
    return calls


@pytest.mark.parametrize(
    ("width", "strategy"), [(8, "accumulate"), (64, "explicit")], ids=["accumulate", "explicit"]
)
def test_an_unchanged_batch_is_probed_planned_and_scanned_once(
    monkeypatch: pytest.MonkeyPatch, width: int, strategy: str
) -> None:
    x, y = _sinc(120)
    lma = LMA(_mlp(width), ["cpu"], residual_fn=lambda a, b: a - b, damping="fixed")
    lma.step(x, y, 40)  # the first step also checks the layer rules once per engine
    probes = _counting(monkeypatch, engine_module, "probe")
    plans = _counting(monkeypatch, engine_module, "plan_jacobian")
    scans: dict[str, int] = {"inputs": 0, "targets": 0}
    isfinite = torch.isfinite

    def counting_isfinite(t: torch.Tensor) -> torch.Tensor:
        for name, batch in (("inputs", x), ("targets", y)):
            if t.shape == batch.shape and t.data_ptr() == batch.data_ptr():
                scans[name] += 1
        return isfinite(t)

    monkeypatch.setattr(torch, "isfinite", counting_isfinite)
    for _ in range(3):
        lma.step(x, y, 40)
        assert lma.report is not None and lma.report.strategy == strategy
        assert lma.report.attempts >= 1
    # The first step probed, planned and scanned this batch; passed again unchanged, its
    # plan is kept and it is not scanned again.
    assert (len(probes), len(plans)) == (0, 0)
    assert scans == {"inputs": 0, "targets": 0}
    with torch.no_grad():
        y.add_(0.0)  # an in-place write: scanned, probed and planned again
    lma.step(x, y, 40)
    assert scans == {"inputs": 0, "targets": 1}
    assert (len(probes), len(plans)) == (1, 1)
    lma.step(x, y, 20)  # another slicing: planned anew
    assert (len(probes), len(plans)) == (2, 2)
    assert lma.report is not None and lma.report.strategy == strategy


def test_a_new_batch_with_nan_is_refused_after_a_clean_one() -> None:
    x, y = _sinc(50)
    lma = LMA(_mlp(8), ["cpu"], residual_fn=lambda a, b: a - b)
    lma.step(x, y)
    y_bad = y.clone()
    y_bad[3] = float("nan")
    with pytest.raises(Exception, match="finite targets"):
        lma.step(x, y_bad)
    with torch.no_grad():
        y[5] = float("inf")  # the scanned tensor itself, written in place
    with pytest.raises(Exception, match="finite targets"):
        lma.step(x, y)
    assert lma.steps == 1


def test_bad_batch_is_still_refused_before_any_work() -> None:
    x, y = _sinc(50)
    lma = LMA(_mlp(8), ["cpu"], residual_fn=lambda a, b: a - b)
    before = [p.detach().clone() for p in lma.model.parameters()]
    y_bad = y.clone()
    y_bad[7] = float("nan")
    with pytest.raises(Exception, match="finite targets"):
        lma.step(x, y_bad)
    assert lma.steps == 0 and lma.report is None
    for p, q in zip(lma.model.parameters(), before, strict=True):
        assert torch.equal(p, q)


def test_each_attempt_reads_the_device_once_and_applies_delta_where_it_lies(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Per attempt one read of (trial loss, model terms, status, ‖δ‖) from the device, and
    the δ handed to the replicas is the backend's own tensor on the backend's device."""
    x, y = _sinc(200)
    lma = LMA(_mlp(8), ["cpu"], residual_fn=lambda a, b: a - b, backend="torch", damping_start=1e-8)
    reads = _counting(monkeypatch, attempts_module, "read_values")
    solved: list[torch.Tensor] = []
    applied: list[torch.Tensor] = []
    solve = lma.backend.solve
    replicas = lma._replicas
    add = replicas.add_

    def spy_solve(*args: Any, **kwargs: Any) -> Any:
        solution = solve(*args, **kwargs)
        solved.append(solution.delta)
        return solution

    def spy_add(delta: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        applied.append(delta)
        add(delta, *args, **kwargs)

    monkeypatch.setattr(lma.backend, "solve", spy_solve)
    monkeypatch.setattr(replicas, "add_", spy_add)
    attempts = 0
    for _ in range(5):
        lma.step(x, y)
        assert lma.report is not None
        attempts += lma.report.attempts
    assert len(reads) == attempts == len(solved) == len(applied)
    for s, a in zip(solved, applied, strict=True):
        assert a is s and a.device == torch.device("cpu")


def _mse(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    with torch.no_grad():
        return float((model(x) - y).pow(2).mean())


def test_interrupts_at_random_moments_leave_the_last_accepted_point() -> None:
    """KeyboardInterrupt during trial forwards, solves and updates: afterwards θ is the
    point the step began at or an accepted one (lower loss), never a rejected trial."""
    x, y = _sinc(600)
    # Small fixed damping and many attempts: most attempts are rejected trial points.
    lma = LMA(
        _mlp(24, depth=2),
        ["cpu"],
        residual_fn=lambda a, b: a - b,
        damping="fixed",
        damping_start=1e-9,
        damping_up=1.5,
        attempts=30,
    )
    model = lma.model
    lma.step(x, y, 200)  # warm-up
    began: dict[str, Any] = {}

    def before() -> None:
        began.update(
            params=[p.detach().clone() for p in model.parameters()],
            loss=_mse(model, x, y),
            damping=lma.damping,
            steps=lma.steps,
        )

    def after(hit: bool) -> None:
        now = [p.detach() for p in model.parameters()]
        assert all(bool(torch.isfinite(p).all()) for p in now)
        unchanged = all(torch.equal(p, q) for p, q in zip(now, began["params"], strict=True))
        loss_now = _mse(model, x, y)
        assert unchanged or loss_now < began["loss"], (
            f"θ moved to a point with loss {loss_now:.6e} ≥ {began['loss']:.6e} at the start"
        )
        if hit and lma.steps == began["steps"] and unchanged:
            # Interrupted before anything was accepted: λ may have risen, never fallen.
            assert lma.damping >= began["damping"]
        if lma.damping >= 1e9:
            lma.damping_rule.load_state_dict({**lma.damping_rule.state_dict(), "damping": 1e-9})

    # Interrupts fire within the shortest of three timed steps, so within a step, not
    # after it, whatever its length; 60 runs, however many land.
    interrupted, _ = interrupt_repeatedly(
        lambda: lma.step(x, y, 200), after, trials=60, seed=7, before=before
    )
    assert interrupted >= 20, f"only {interrupted} of 60 steps were interrupted"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_no_host_transfer_inside_an_attempt_on_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    """On CUDA a solve and the update of the replicas make no host synchronisation (so δ
    never crosses to the host); the attempt reads the device once, for its scalars."""
    device = torch.device("cuda:0")
    x, y = _sinc(2000)
    lma = LMA(_mlp(32).to(device), [device], residual_fn=lambda a, b: a - b, backend="torch")
    lma.step(x, y)
    solve = lma.backend.solve
    replicas = lma._replicas
    add = replicas.add_
    solved: list[torch.Tensor] = []

    def strict_solve(*args: Any, **kwargs: Any) -> Any:
        torch.cuda.set_sync_debug_mode("error")
        try:
            solution = solve(*args, **kwargs)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        solved.append(solution.delta)
        return solution

    def strict_add(delta: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        assert delta.device == device
        torch.cuda.set_sync_debug_mode("error")
        try:
            add(delta, *args, **kwargs)
        finally:
            torch.cuda.set_sync_debug_mode("default")

    monkeypatch.setattr(lma.backend, "solve", strict_solve)
    monkeypatch.setattr(replicas, "add_", strict_add)
    reads = _counting(monkeypatch, attempts_module, "read_values")
    for _ in range(3):
        lma.step(x, y)
    assert solved and all(d.device == device for d in solved)
    assert len(reads) == len(solved)


def test_a_geodesic_step_plans_its_two_strategies_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Geodesic acceleration streams J's slices (``explicit``) beside the step's
    ``accumulate`` system: both plans of the unchanged batch are kept, not made again
    every step by turns."""
    x, y = _sinc(120)
    lma = LMA(_mlp(8), ["cpu"], residual_fn=lambda a, b: a - b, geodesic=0.75)
    lma.step(x, y)
    probes = _counting(monkeypatch, engine_module, "probe")
    plans = _counting(monkeypatch, engine_module, "plan_jacobian")
    for _ in range(3):
        lma.step(x, y)
        assert lma.report is not None and lma.report.strategy == "accumulate"
    assert (len(probes), len(plans)) == (0, 0)
