"""Products of a parameter subset: the selected columns of J, and nothing wider formed."""

from __future__ import annotations

import pytest
import torch
from jacobian_problems import MODES, Problem, make_problem, reference_jacobian
from torch import nn

from marquardt.jacobian import ColumnSubset, JacobianEngine, Replicas
from marquardt.testing.models import LargestTensor


def _subset(params: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    k = max(1, params // 3)
    return torch.randperm(params, generator=g)[:k]


@pytest.mark.parametrize("mode", MODES)
def test_subset_products_are_the_selected_columns(problem: Problem, mode: str) -> None:
    replicas = Replicas(problem.model, ["cpu"])
    engine = JacobianEngine(replicas, problem.residual_fn, mode=mode)
    ref_j, ref_r = reference_jacobian(problem, replicas.names, replicas.flat_params())
    index = _subset(replicas.num_params, 7)
    columns = engine.columns(index)
    cols = ref_j[:, columns.index]
    acc = engine.normal_products(
        engine.prepare(problem.x, problem.y, 3, strategy="accumulate", columns=columns)
    )
    assert acc.jtj.shape == (columns.size, columns.size)
    torch.testing.assert_close(acc.jtj, cols.T @ cols, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(acc.jtr, cols.T @ ref_r, rtol=1e-10, atol=1e-12)
    batch = engine.prepare(problem.x, problem.y, 3, strategy="explicit", columns=columns)
    parts = list(engine.jacobian_slices(batch))
    jac = torch.cat([p.jacobian for p in parts])
    torch.testing.assert_close(jac, cols, rtol=1e-10, atol=1e-12)
    full = torch.empty(batch.rows, columns.size, dtype=torch.float64)
    res = torch.empty(batch.rows, dtype=torch.float64)
    engine.fill_jacobian(batch, full, res)
    torch.testing.assert_close(full, cols, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(res, ref_r)


def test_columns_are_checked() -> None:
    sizes = [6, 2]
    with pytest.raises(ValueError, match=r"in \[0, 8\)"):
        ColumnSubset.of([0, 8], sizes)
    with pytest.raises(ValueError, match="repeated"):
        ColumnSubset.of([1, 1], sizes)
    with pytest.raises(ValueError, match="integer"):
        ColumnSubset.of(torch.tensor([0.5]), sizes)
    subset = ColumnSubset.of([7, 1, 6], sizes)
    assert subset.index.tolist() == [1, 6, 7]
    assert [(p.tensor, p.local.tolist(), p.positions.tolist()) for p in subset.parts] == [
        (0, [1], [0]),
        (1, [0, 1], [1, 2]),
    ]


@pytest.mark.parametrize("mode", ["layers", "vmap", "jacfwd"])
def test_subset_never_forms_the_full_columns(mode: str) -> None:
    """P = 33,537 parameters, k = 64 columns of the first and last layers, 64 samples: a
    step that formed J whole (64 × P) or a per-sample block of the hidden layer's weight
    would allocate more than 10 × 64 × 64 numbers; the subset forms at most slice × k and
    the activations."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(1, 128), nn.Tanh(), nn.Linear(128, 256), nn.Tanh())
    model.append(nn.Linear(256, 1))
    model = model.double()
    replicas = Replicas(model, ["cpu"])
    params = replicas.num_params
    assert params > 30000
    x = torch.randn(64, 1, dtype=torch.float64)
    y = torch.randn(64, 1, dtype=torch.float64)
    # A 1 MiB budget keeps forward mode's tangents (columns × samples × activations) small.
    engine = JacobianEngine(replicas, lambda a, b: a - b, mode=mode, memory_budget=1 << 20)
    # 32 columns of the first layer's weight, 32 of the last layer's: the middle 128 × 256
    # weight is not touched.
    index = torch.cat([torch.arange(0, 32), torch.arange(params - 33, params - 1)])
    columns = engine.columns(index)
    batch = engine.prepare(x, y, strategy="accumulate", columns=columns)
    with LargestTensor() as seen:
        products = engine.normal_products(batch)
    assert products.jtj.shape == (64, 64)
    assert seen.largest <= 10 * 64 * 64, seen.largest
    jac, _ = JacobianEngine(replicas, lambda a, b: a - b, mode="layers").jacobian(x, y)
    torch.testing.assert_close(products.jtj, jac[:, index].T @ jac[:, index])


def test_subset_plan_is_for_k_columns() -> None:
    problem = make_problem("mlp")
    replicas = Replicas(problem.model, ["cpu"])
    engine = JacobianEngine(replicas, problem.residual_fn)
    batch = engine.prepare(problem.x, problem.y, columns=engine.columns([0, 1]))
    assert batch.params == 2
    assert batch.strategy == "accumulate"  # 7 rows ≥ 2 columns
    assert batch.plan.params == 2


def test_subsets_of_changing_size_on_one_engine() -> None:
    """Steps of k = 2, then 5, then 3 columns reuse the engine's chunk workspace."""
    problem = make_problem("multi_output")
    replicas = Replicas(problem.model, ["cpu"])
    engine = JacobianEngine(replicas, problem.residual_fn, mode="layers")
    ref_j, _ = reference_jacobian(problem, replicas.names, replicas.flat_params())
    for index in ([0, 1], [3, 4, 5, 9, 20], [2, 7, 26]):
        columns = engine.columns(index)
        batch = engine.prepare(problem.x, problem.y, strategy="accumulate", columns=columns)
        jtj = engine.normal_products(batch).jtj
        cols = ref_j[:, index]
        torch.testing.assert_close(jtj, cols.T @ cols, rtol=1e-10, atol=1e-12)
