"""The planner that counts time: with the machine's rates injected (nothing is timed),
``auto`` takes the dense strategy where its step is quick and the matrix-free one where
the dense step would take minutes, and says why."""

from __future__ import annotations

import pytest
import torch

from marquardt.devices import MachineConstants, prefers_matrix_free, step_seconds
from marquardt.jacobian._planner import plan_jacobian

#: A laptop-like CPU and a GPU-like machine, injected.
CPU = MachineConstants(matmul_flops=5e10, factor_flops=1e10, bandwidth=1e10)
GPU = MachineConstants(matmul_flops=5e13, factor_flops=5e12, bandwidth=2e12)


def _plan(rows: int, params: int, machine: MachineConstants | None) -> str:
    plan = plan_jacobian(
        rows, params, 1, torch.float32, 1 << 28, activations_per_sample=769, machine=machine
    )
    return plan.strategy


@pytest.mark.parametrize(
    ("rows", "params", "machine", "expected"),
    [
        (100_000, 769, CPU, "accumulate"),  # small P: JᵀJ in well under a second
        (200, 50_000, CPU, "explicit"),  # few rows: the 200 × 200 system
        (20_000, 132_609, CPU, "matrix_free"),  # JJᵀ of 20,000²: minutes
        (100_000, 20_000, CPU, "matrix_free"),  # JᵀJ of 20,000²: a 2·R·P² Gram product
        (100_000, 20_000, GPU, "accumulate"),  # the same shape in seconds on a fast device
        (20_000, 132_609, None, "explicit"),  # no rates: the dense strategy of the shape
    ],
)
def test_auto_takes_the_fastest_step(
    rows: int, params: int, machine: MachineConstants | None, expected: str
) -> None:
    assert _plan(rows, params, machine) == expected


def test_the_reason_gives_both_predictions() -> None:
    plan = plan_jacobian(
        20_000, 132_609, 1, torch.float32, 1 << 28, activations_per_sample=769, machine=CPU
    )
    assert plan.strategy == "matrix_free" and plan.mode == "products"
    assert "explicit ≈" in plan.reason and "matrix_free ≈" in plan.reason
    assert "injected machine rates" in plan.reason
    # A forced strategy is never second-guessed.
    forced = plan_jacobian(
        20_000, 132_609, 1, torch.float32, 1 << 28, strategy="explicit", machine=CPU
    )
    assert forced.strategy == "explicit"


def test_the_step_time_model() -> None:
    dense = step_seconds("explicit", 20_000, 132_609, 4, CPU)
    free = step_seconds("matrix_free", 20_000, 132_609, 4, CPU)
    assert dense.seconds > 60 and free.seconds < 5
    assert prefers_matrix_free(dense, free) and not prefers_matrix_free(free, dense)
    assert set(dense.parts) == {"forwards", "jacobian", "gram", "factor"}
    # Twice the rates, half the seconds.
    fast = MachineConstants(2 * CPU.matmul_flops, 2 * CPU.factor_flops, 2 * CPU.bandwidth)
    assert step_seconds("explicit", 20_000, 132_609, 4, fast).seconds == pytest.approx(
        dense.seconds / 2
    )
    with pytest.raises(ValueError, match="step-time model"):
        step_seconds("subsets", 10, 10, 4, CPU)
