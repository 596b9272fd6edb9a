"""LMA on residuals that differentiate the model by its inputs (``PointResidual``): the
2-D Poisson problem to 1e-4 relative L2, two processes against one, parameter subsets,
and the options it refuses before any work."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from pinn_problems import (
    CONFIGS,
    batch,
    network,
    points,
    relative_error,
    residual,
    run_config,
    source,
)

from marquardt.solver import LMA, SolverConfigError

WORKER = Path(__file__).resolve().parents[1] / "pinn_problems.py"


def test_poisson_reaches_1e_4_relative_l2() -> None:
    x, y = batch(16)
    model = network(12)
    lma = LMA(model, ["cpu"], residual(), geodesic=0.75, scaling_memory=1.0)
    start = relative_error(model)
    for _ in range(100):
        _, terminated = lma.step(x, y)
        if terminated:
            break
    assert start > 0.5
    assert relative_error(model) <= 1e-4


def test_resampled_points_each_step_lower_the_loss() -> None:
    model = network(8)
    lma = LMA(model, ["cpu"], residual())
    gen = torch.Generator().manual_seed(0)
    losses = []
    for _ in range(15):
        inner = torch.rand(60, 2, generator=gen, dtype=torch.float64)
        _, edge = points(8)
        x, y = residual().batch(pde=(inner, source(inner)), boundary=edge)
        losses.append(lma.step(x, y)[0])
    assert losses[-1] < 0.05 * losses[0]


def test_subset_steps_lower_the_loss() -> None:
    x, y = batch(8)
    lma = LMA(network(8), ["cpu"], residual(), params_per_step=30, seed=1)
    first = lma.step(x, y)[0]
    for _ in range(10):
        last = lma.step(x, y)[0]
    assert lma.report is not None and lma.report.selected == 30
    assert last < first


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"loss_fn": lambda a, b: ((a - b) ** 2).mean()}, "LMA\\(loss_fn"),
        ({"robust_loss": "soft_l1"}, "LMA\\(robust_loss"),
    ],
)
def test_options_of_the_outputs_are_refused(options: dict[str, Any], match: str) -> None:
    model = network(4)
    before = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(SolverConfigError, match=match):
        LMA(model, ["cpu"], residual(), **options)
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))


def test_a_float32_model_is_refused_with_a_hint() -> None:
    with pytest.raises(SolverConfigError, match=r"HINT: call model\.to\(torch\.float64\)"):
        LMA(network(4).float(), ["cpu"], residual())


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("pinn-pair")
    out = tmp / "results.pt"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    procs = [
        subprocess.Popen(
            [sys.executable, str(WORKER), str(rank), "2", str(tmp / "store"), str(out)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in range(2)
    ]
    logs = [proc.communicate(timeout=180) for proc in procs]
    assert out.exists(), "rank 0 wrote no results:\n" + logs[0][1][-3000:]
    return torch.load(out)  # type: ignore[no-any-return]


@pytest.mark.multiprocess
@pytest.mark.parametrize("name", list(CONFIGS))
def test_two_processes_take_the_steps_of_one(pair: dict[str, Any], name: str) -> None:
    torch.set_num_threads(1)
    two, one = pair[name], run_config(name, group=False)
    start = torch.nn.utils.parameters_to_vector(network(6).parameters())
    for k, (a, b) in enumerate(zip(two["theta"], one["theta"], strict=True)):
        rel = float((a - b).detach().norm() / b.detach().norm())
        assert rel <= 1e-8, f"step {k}: relative difference {rel:.3g}"
    assert two["damping"] == pytest.approx(one["damping"], rel=1e-8)
    assert float((one["theta"][-1] - start).detach().norm()) > 1e-3


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_poisson_on_a_gpu_matches_the_cpu_iterates() -> None:
    x, y = batch(8)
    cpu, gpu = network(8), network(8).cuda()
    lm_cpu = LMA(cpu, ["cpu"], residual())
    lm_gpu = LMA(gpu, ["cuda:0"], residual())
    for _ in range(3):
        lm_cpu.step(x, y)
        lm_gpu.step(x.cuda(), y.cuda())
    a = torch.nn.utils.parameters_to_vector(cpu.parameters()).detach()
    b = torch.nn.utils.parameters_to_vector(gpu.parameters()).detach().cpu()
    assert float((a - b).norm() / a.norm()) <= 1e-8
