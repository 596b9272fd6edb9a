"""The attempt as one pure tensor function (``_lm/attempt_tensor.py``): run uncompiled it
takes the eager steps exactly; compiled it agrees with them; the capture wrapper keeps the
uncompiled function off CUDA; the planner says which path ran and why."""

from __future__ import annotations

import copy
import os
import tempfile
from collections.abc import Callable
from typing import Any

import pytest
import torch
from problems import problem, residual_fn
from torch import nn

from marquardt.solver import LMA, SolverConfigError
from marquardt.solver._lm.attempt.graphs import capture_attempt
from marquardt.solver._lm.attempt.paths import AttemptPaths


@pytest.fixture
def compile_cache(monkeypatch: pytest.MonkeyPatch) -> str:
    """Inductor's artifacts in the temporary folder, kept between runs, never in the tree."""
    folder = os.path.join(tempfile.gettempdir(), "marquardt-inductor")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", folder)
    return folder


def _sinc(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.linspace(-1.0, 1.0, n, dtype=torch.float64).reshape(-1, 1)
    return x, torch.sinc(10.0 * x)


def _mlp(width: int) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(1, width), nn.Tanh(), nn.Linear(width, 1)).double()


def _pair(model: nn.Module, paths: AttemptPaths, **kwargs: Any) -> tuple[LMA, LMA]:
    eager = LMA(copy.deepcopy(model), ["cpu"], residual_fn, compile_attempt="off", **kwargs)
    tensor = LMA(copy.deepcopy(model), ["cpu"], residual_fn, **kwargs)
    tensor._attempt_paths = paths
    return eager, tensor


def _uncompiled() -> AttemptPaths:
    return AttemptPaths("on", compiler=lambda f: f, name="tensor")


def _same_steps(
    eager: LMA, tensor: LMA, x: torch.Tensor, y: torch.Tensor, steps: int, tol: float
) -> list[int]:
    """Step both; compare θ, λ, acceptance and losses; return the attempts per step."""
    attempts = []
    for _ in range(steps):
        loss_e, stop_e = eager.step(x, y)
        loss_t, stop_t = tensor.step(x, y)
        re, rt = eager.report, tensor.report
        assert re is not None and rt is not None
        assert rt.attempt_path != "eager", rt.attempt_reason
        assert re.attempt_path == "eager"
        assert (re.accepted, re.attempts, re.rejections) == (
            rt.accepted,
            rt.attempts,
            rt.rejections,
        )
        assert (stop_e, re.termination) == (stop_t, rt.termination)
        assert loss_t == pytest.approx(loss_e, rel=tol, abs=tol)
        assert rt.loss_before == pytest.approx(re.loss_before, rel=tol, abs=tol)
        assert tensor.damping == pytest.approx(eager.damping, rel=tol)
        assert tensor.damping_rule.state_dict() == pytest.approx(eager.damping_rule.state_dict())
        theta_e = torch.cat([p.reshape(-1) for p in eager.model.parameters()])
        theta_t = torch.cat([p.reshape(-1) for p in tensor.model.parameters()])
        torch.testing.assert_close(theta_t, theta_e, rtol=tol, atol=tol)
        assert rt.host_reads == rt.attempts
        attempts.append(re.attempts)
        if stop_e:
            break
    return attempts


@pytest.mark.parametrize("damping", ["nielsen", "fixed"])
def test_the_uncompiled_function_takes_the_eager_steps_on_a_network(damping: str) -> None:
    x, y = _sinc(200)
    eager, tensor = _pair(_mlp(16), _uncompiled(), damping=damping)
    attempts = _same_steps(eager, tensor, x, y, steps=15, tol=1e-10)
    assert max(attempts) > 1  # rejected attempts were compared too


@pytest.mark.parametrize("name", ["rosenbrock", "exponential", "rational", "misra1a"])
def test_the_uncompiled_function_takes_the_eager_steps_on_the_shared_problems(name: str) -> None:
    p = problem(name)
    eager, tensor = _pair(p.make_model(), _uncompiled(), **p.options)
    assert _same_steps(eager, tensor, p.x, p.y, steps=12, tol=1e-10)


def test_the_under_determined_system_takes_the_eager_steps() -> None:
    x, y = _sinc(30)  # N = 30 < P = 49
    eager, tensor = _pair(_mlp(16), _uncompiled(), strategy="explicit")
    _same_steps(eager, tensor, x, y, steps=6, tol=1e-10)
    assert tensor.report is not None and tensor.report.params > tensor.report.rows


def test_the_compiled_attempt_agrees_with_the_eager_one(compile_cache: str) -> None:
    x, y = _sinc(40)
    _agree_on_path(_mlp(4), x, y, "cpu", "compiled", steps=3)


def _agree_on_path(
    model: nn.Module, x: torch.Tensor, y: torch.Tensor, device: str, path: str, steps: int
) -> None:
    """compile_attempt='on' takes the eager steps to 1e-8 on ``path``, one read an attempt."""
    eager = LMA(copy.deepcopy(model), [device], residual_fn, compile_attempt="off")
    other = LMA(copy.deepcopy(model), [device], residual_fn, compile_attempt="on")
    for _ in range(steps):
        loss_e, _ = eager.step(x, y)
        loss_o, _ = other.step(x, y)
        report = other.report
        assert report is not None and report.attempt_path == path, report.attempt_reason
        assert report.host_reads == report.attempts
        assert loss_o == pytest.approx(loss_e, rel=1e-8, abs=1e-12)
        theta_e = torch.cat([p.reshape(-1) for p in eager.model.parameters()])
        theta_o = torch.cat([p.reshape(-1) for p in other.model.parameters()])
        torch.testing.assert_close(theta_o, theta_e, rtol=1e-8, atol=1e-10)


def test_a_model_the_compiler_cannot_trace_runs_the_eager_attempts() -> None:
    def refuse(fn: Callable[..., Any]) -> Callable[..., Any]:
        def traced(*args: Any) -> Any:
            raise RuntimeError("cannot trace this model\nmore")

        return traced

    x, y = _sinc(60)
    lma = LMA(_mlp(4), ["cpu"], residual_fn)
    lma._attempt_paths = AttemptPaths("on", compiler=refuse)
    for _ in range(2):
        lma.step(x, y)
        report = lma.report
        assert report is not None and report.attempt_path == "eager"
        assert report.attempt_reason == (
            "the attempt could not be compiled (RuntimeError: cannot trace this model)"
        )


def test_auto_keeps_the_eager_attempts_on_a_cpu_and_says_why() -> None:
    x, y = _sinc(60)
    lma = LMA(_mlp(4), ["cpu"], residual_fn)
    for _ in range(2):
        lma.step(x, y)
        assert lma.report is not None and lma.report.attempt_path == "eager"
        assert "compile_attempt='on' forces it" in lma.report.attempt_reason


def test_steps_the_function_cannot_serve_run_the_eager_attempts() -> None:
    x, y = _sinc(60)
    lma = LMA(_mlp(4), ["cpu"], residual_fn, params_per_step=5, compile_attempt="on")
    lma.step(x, y)
    assert lma.report is not None
    assert (lma.report.attempt_path, lma.report.attempt_reason) == (
        "eager",
        "steps on parameter subsets",
    )


def test_compile_attempt_is_checked() -> None:
    with pytest.raises(SolverConfigError, match="compile_attempt='sometimes'"):
        LMA(_mlp(4), ["cpu"], residual_fn, compile_attempt="sometimes")


def test_the_capture_wrapper_keeps_the_uncaptured_function_off_cuda() -> None:
    def fn(*args: Any) -> Any:
        return args

    runner, path, reason = capture_attempt(fn, (torch.zeros(2),), torch.device("cpu"))
    assert runner is fn and path == "tensor"
    assert reason == "CUDA graphs need a CUDA device; cpu runs it uncaptured"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graph capture needs a CUDA GPU")
def test_the_captured_attempt_takes_the_eager_steps_on_a_gpu() -> None:
    x, y = (t.cuda() for t in _sinc(200))
    _agree_on_path(_mlp(16).cuda(), x, y, "cuda", "captured", steps=8)
