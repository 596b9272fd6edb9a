"""Jacobians of every mode against autograd and finite differences, and the products."""

from __future__ import annotations

import pytest
import torch
from jacobian_problems import (
    MODES,
    Problem,
    finite_difference_jacobian,
    make_problem,
    reference_jacobian,
)

from marquardt.jacobian import JacobianEngine, Replicas
from marquardt.jacobian._modes._reference import reference_jacobian as rule_check_jacobian


@pytest.mark.parametrize("mode", MODES)
def test_jacobian_matches_autograd(problem: Problem, mode: str) -> None:
    replicas = Replicas(problem.model, ["cpu"])
    engine = JacobianEngine(replicas, problem.residual_fn, mode=mode)
    jac, res = engine.jacobian(problem.x, problem.y, slice_size=3)
    ref_j, ref_r = reference_jacobian(problem, replicas.names, replicas.flat_params())
    assert jac.shape == ref_j.shape
    torch.testing.assert_close(jac, ref_j, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(res, ref_r, rtol=1e-12, atol=1e-12)


def test_rule_check_reference_matches_autograd(problem: Problem) -> None:
    """The per-row reverse mode that checks the layer rules is itself the exact Jacobian."""
    replicas = Replicas(problem.model, ["cpu"])
    jac, res = rule_check_jacobian(replicas[0], problem.residual_fn, problem.x, problem.y)
    ref_j, ref_r = reference_jacobian(problem, replicas.names, replicas.flat_params())
    torch.testing.assert_close(jac, ref_j, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(res, ref_r, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name", ["mlp", "cnn", "cross_entropy", "multi_output"])
def test_jacobian_matches_finite_differences(name: str) -> None:
    problem = make_problem(name)
    replicas = Replicas(problem.model, ["cpu"])
    engine = JacobianEngine(replicas, problem.residual_fn)
    jac, _ = engine.jacobian(problem.x, problem.y)
    fd = finite_difference_jacobian(problem, replicas.names, replicas.flat_params())
    torch.testing.assert_close(jac, fd, rtol=1e-5, atol=1e-7)


def test_layers_mode_is_used_where_rules_exist_and_falls_back_elsewhere() -> None:
    mlp = make_problem("mlp")
    engine = JacobianEngine(Replicas(mlp.model, ["cpu"]), mlp.residual_fn, mode="layers")
    engine.jacobian(mlp.x, mlp.y)
    assert engine.last_plan is not None and engine.last_plan.mode == "layers"
    bn = make_problem("batchnorm_eval")
    engine = JacobianEngine(Replicas(bn.model, ["cpu"]), bn.residual_fn, mode="layers")
    engine.jacobian(bn.x, bn.y)
    assert engine.last_plan is not None and engine.last_plan.mode == "vmap"
    assert "BatchNorm1d" in engine.last_plan.reason


def test_layers_rule_check_catches_weight_used_outside_its_layer() -> None:
    class Tied(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = torch.nn.Linear(2, 2)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.nn.functional.linear(torch.tanh(self.a(x)), self.a.weight)

    model = Tied().double()
    x = torch.randn(5, 2, dtype=torch.float64)
    y = torch.randn(5, 2, dtype=torch.float64)
    engine = JacobianEngine(Replicas(model, ["cpu"]), lambda a, b: a - b)
    jac, _ = engine.jacobian(x, y)
    assert engine.last_plan is not None and engine.last_plan.mode == "vmap"
    ref = JacobianEngine(Replicas(Tied().double(), ["cpu"]), lambda a, b: a - b, mode="vmap")
    ref.replicas.set_flat_params(engine.replicas.flat_params())
    torch.testing.assert_close(jac, ref.jacobian(x, y)[0])


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", ["mlp", "cnn", "multi_output", "cross_entropy"])
def test_explicit_and_accumulate_agree(name: str, mode: str) -> None:
    problem = make_problem(name)
    engine = JacobianEngine(Replicas(problem.model, ["cpu"]), problem.residual_fn, mode=mode)
    slices = list(engine.slices(problem.x, problem.y, slice_size=2))
    assert [s.start for s in slices] == [0, *[s.stop for s in slices[:-1]]]
    jac = torch.cat([s.jacobian for s in slices])
    res = torch.cat([s.residuals for s in slices])
    products = engine.accumulate(problem.x, problem.y, slice_size=2, dtype=torch.float64)
    assert engine.last_plan is not None and engine.last_plan.strategy == "accumulate"
    torch.testing.assert_close(products.jtj, jac.T @ jac, rtol=0, atol=1e-10)
    torch.testing.assert_close(products.jtr, jac.T @ res, rtol=0, atol=1e-10)
    assert products.rss == pytest.approx(float(res @ res), abs=1e-10)
    assert products.rows == res.numel()
    assert torch.equal(products.jtj, products.jtj.T)


def test_accumulate_in_float64_from_float32_model() -> None:
    problem = make_problem("mlp")
    model = problem.model.float()
    engine = JacobianEngine(Replicas(model, ["cpu"]), problem.residual_fn)
    products = engine.accumulate(problem.x.float(), problem.y.float(), dtype=torch.float64)
    assert products.jtj.dtype == torch.float64
    jac, _res = engine.jacobian(problem.x.float(), problem.y.float())
    j64 = jac.double()
    torch.testing.assert_close(products.jtj, j64.T @ j64, rtol=1e-12, atol=1e-12)
    assert engine.accumulate(problem.x.float(), problem.y.float()).jtj.dtype == torch.float32


@pytest.mark.parametrize("kernel", ["torch", "numpy", "numpy-threads"])
def test_gram_kernels_agree(kernel: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MARQUARDT_JACOBIAN_GRAM_KERNEL", kernel)
    problem = make_problem("multi_output")
    engine = JacobianEngine(Replicas(problem.model, ["cpu"]), problem.residual_fn)
    products = engine.accumulate(problem.x, problem.y, slice_size=3)
    jac, _ = engine.jacobian(problem.x, problem.y)
    torch.testing.assert_close(products.jtj, jac.T @ jac, rtol=0, atol=1e-12)


@pytest.mark.parametrize("name", ["mlp", "cnn", "batchnorm_eval"])
def test_several_cpu_devices_give_the_same_as_one(name: str) -> None:
    one = make_problem(name)
    two = make_problem(name)
    e1 = JacobianEngine(Replicas(one.model, ["cpu"]), one.residual_fn)
    e2 = JacobianEngine(Replicas(two.model, ["cpu", "cpu", "cpu"]), two.residual_fn)
    j1, r1 = e1.jacobian(one.x, one.y, slice_size=2)
    j2, r2 = e2.jacobian(two.x, two.y, slice_size=2)
    torch.testing.assert_close(j1, j2, rtol=0, atol=1e-14)
    torch.testing.assert_close(r1, r2, rtol=0, atol=1e-14)
    p1 = e1.accumulate(one.x, one.y, slice_size=2)
    p2 = e2.accumulate(two.x, two.y, slice_size=2)
    torch.testing.assert_close(p1.jtj, p2.jtj, rtol=0, atol=1e-12)
    torch.testing.assert_close(p1.jtr, p2.jtr, rtol=0, atol=1e-12)
    assert e1.loss(one.x, one.y) == pytest.approx(e2.loss(two.x, two.y), rel=1e-14)


def test_default_slice_size_splits_over_devices() -> None:
    problem = make_problem("mlp")
    engine = JacobianEngine(Replicas(problem.model, ["cpu", "cpu"]), problem.residual_fn)
    slices = list(engine.slices(problem.x, problem.y))
    assert [(s.start, s.stop) for s in slices] == [(0, 4), (4, 7)]


def test_handed_out_slices_are_fresh() -> None:
    problem = make_problem("mlp")
    engine = JacobianEngine(Replicas(problem.model, ["cpu"]), problem.residual_fn)
    first = list(engine.slices(problem.x, problem.y, slice_size=3))
    kept = [s.jacobian.clone() for s in first]
    engine.replicas.add_(torch.ones(engine.replicas.num_params, dtype=torch.float64))
    second = list(engine.slices(problem.x, problem.y, slice_size=3))
    for old, copy, new in zip(first, kept, second, strict=True):
        assert torch.equal(old.jacobian, copy)
        assert old.jacobian.data_ptr() != new.jacobian.data_ptr()


def test_residuals_and_loss() -> None:
    problem = make_problem("multi_output")
    engine = JacobianEngine(Replicas(problem.model, ["cpu", "cpu"]), problem.residual_fn)
    with torch.no_grad():
        expected = (problem.model(problem.x) - problem.y).reshape(-1)
    torch.testing.assert_close(engine.residuals(problem.x, problem.y, slice_size=2), expected)
    assert engine.loss(problem.x, problem.y, 3) == pytest.approx(float(expected.pow(2).mean()))
    mse = torch.nn.functional.mse_loss
    assert engine.loss(problem.x, problem.y, 7, loss_fn=mse) == pytest.approx(
        float(expected.pow(2).mean())
    )


def test_rows_per_sample_and_timings() -> None:
    problem = make_problem("multi_output")
    engine = JacobianEngine(Replicas(problem.model, ["cpu"]), problem.residual_fn)
    assert engine.rows_per_sample(problem.x, problem.y) == 3
    products = engine.accumulate(problem.x, problem.y)
    assert set(products.timings) >= {"jacobian", "gram", "transfer"}
    assert products.timings["jacobian"] > 0
    stream = engine.slices(problem.x, problem.y, 5)
    assert stream.timings["jacobian"] == 0.0
    assert len(list(stream)) == -(-len(problem.x) // 5)
    assert stream.timings["jacobian"] > 0
    assert not hasattr(engine, "timings")


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", ["mlp", "multi_output"])
def test_budget_capped_slices_give_the_unsliced_products(name: str, mode: str) -> None:
    # A budget of about one sample forces one-sample slices for slice_size=None; the sums
    # must equal JᵀJ, Jᵀr, rᵀr of the whole J in float64.
    problem = make_problem(name)
    replicas = Replicas(problem.model, ["cpu"])
    tight = JacobianEngine(replicas, problem.residual_fn, mode=mode, memory_budget=1)
    products = tight.accumulate(problem.x, problem.y, dtype=torch.float64)
    assert tight.last_plan is not None and tight.last_plan.slice_samples == 1
    assert "slices of 1 samples" in tight.last_plan.reason
    whole = JacobianEngine(replicas, problem.residual_fn, mode=mode, memory_budget=1 << 30)
    jac, res = whole.jacobian(problem.x, problem.y)
    assert whole.last_plan is not None and whole.last_plan.samples_per_chunk == len(problem.x)
    torch.testing.assert_close(products.jtj, jac.T @ jac, rtol=0, atol=1e-12)
    torch.testing.assert_close(products.jtr, jac.T @ res, rtol=0, atol=1e-12)
    assert products.rss == pytest.approx(float(res @ res), rel=1e-13)
    assert products.rows == res.numel()
    # Explicit keeps one slice per device, filled chunk by chunk into one J.
    jac_tight, res_tight = tight.jacobian(problem.x, problem.y)
    assert tight.last_plan.slice_samples == len(problem.x)
    torch.testing.assert_close(jac_tight, jac, rtol=0, atol=1e-14)
    torch.testing.assert_close(res_tight, res, rtol=0, atol=1e-14)
    # Forward-only passes are cut by the budget too, with the same result.
    assert tight.loss(problem.x, problem.y) == pytest.approx(float(res @ res) / res.numel())
    torch.testing.assert_close(tight.residuals(problem.x, problem.y), res, rtol=0, atol=1e-14)


def test_cpu_gram_kernel_is_fixed_not_timed(monkeypatch: pytest.MonkeyPatch) -> None:
    # A kernel chosen by timing the first chunks made the 3-output benchmark 2.3× slower
    # on a loaded machine (NumPy's OpenBLAS threads fighting torch's): the choice must not
    # depend on anything measured at run time, only on the device and the setting.
    from marquardt.jacobian._gram import NUMPY_FROM_PARAMS, GramAccumulator, choose_kernel

    monkeypatch.delenv("MARQUARDT_JACOBIAN_GRAM_KERNEL", raising=False)
    problem = make_problem("multi_output")
    engine = JacobianEngine(Replicas(problem.model, ["cpu"]), problem.residual_fn)
    for _ in range(3):
        engine.accumulate(problem.x, problem.y, slice_size=2)
        assert choose_kernel(torch.device("cpu")) == "torch"
    assert GramAccumulator(3, torch.device("cpu"), torch.float64).kernel == "torch"
    # Large P: NumPy's syrk, by a fixed rule on P alone.
    assert GramAccumulator(NUMPY_FROM_PARAMS, torch.device("cpu"), torch.float32).kernel == "numpy"
    assert choose_kernel(torch.device("cpu"), NUMPY_FROM_PARAMS - 1) == "torch"
    monkeypatch.setenv("MARQUARDT_JACOBIAN_GRAM_KERNEL", "torch")
    assert choose_kernel(torch.device("cpu"), 10 * NUMPY_FROM_PARAMS) == "torch"
    monkeypatch.setenv("MARQUARDT_JACOBIAN_GRAM_KERNEL", "numpy")
    assert choose_kernel(torch.device("cpu")) == "numpy"
