"""``_curve.batched_lm.normal``: JᵀJ and Jᵀr̃ formed eagerly and as the traced iteration forms
them, the linear model's reduction from them, and the kernel key that covers the module."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from marquardt.solver._curve.batched_lm import normal
from marquardt.solver._curve.kernel_cache import kernel_key


def _problem() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(5)
    js = torch.randn(7, 11, 4, generator=gen, dtype=torch.float64)
    rs = torch.randn(7, 11, generator=gen, dtype=torch.float64)
    step = torch.randn(7, 4, generator=gen, dtype=torch.float64)
    return js, rs, step


def test_the_fused_products_equal_the_matrix_products() -> None:
    js, rs, _ = _problem()
    gram, g = normal.products(js, rs)
    with normal.fused():
        gram_f, g_f = normal.products(js, rs)
    torch.testing.assert_close(gram, js.transpose(1, 2) @ js, rtol=1e-13, atol=1e-13)
    torch.testing.assert_close(gram_f, gram, rtol=1e-13, atol=1e-13)
    torch.testing.assert_close(g_f, g, rtol=1e-13, atol=1e-13)
    assert torch.equal(gram_f, gram_f.transpose(1, 2))
    torch.testing.assert_close(
        normal.column_norms(gram), torch.linalg.vector_norm(js, dim=1), rtol=1e-13, atol=0
    )


@pytest.mark.parametrize("linear", [True, False])
def test_the_predicted_reduction_is_the_linear_models(linear: bool) -> None:
    js, rs, step = _problem()
    # A robust loss's cost is not ½‖r̃‖²; the linear loss's is.
    cost = 0.5 * (rs * rs).sum(1) * (1.0 if linear else 0.7)
    gram, g = normal.products(js, rs)
    moved = rs + (js @ step[:, :, None])[:, :, 0]
    want = cost - 0.5 * (moved * moved).sum(1)
    got = normal.predicted(cost, (rs * rs).sum(1), gram, g, step, linear)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


def test_a_non_finite_jacobian_row_marks_the_fit() -> None:
    js, rs, _ = _problem()
    js[2, 3, 1] = torch.nan
    js[4, 0, 0] = torch.inf
    gram, g = normal.products(js, rs)
    assert normal.finite(rs, gram, g).tolist() == [True, True, False, True, False, True, True]


def test_the_kernel_key_covers_the_module(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    before = kernel_key.solver_code(None)
    changed = tmp_path / "normal.py"
    changed.write_bytes(Path(normal.__file__).read_bytes() + b"\n# changed\n")
    monkeypatch.setattr(normal, "__file__", str(changed))
    monkeypatch.setattr(kernel_key, "_SOURCES", {})
    assert kernel_key.solver_code(None) != before
