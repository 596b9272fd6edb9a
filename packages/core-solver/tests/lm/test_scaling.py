"""Marquardt's diagonal scaling, clamped away from zero (Moré 1978)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from marquardt.solver._backends.scaling import (
    RELATIVE_FLOOR,
    scaling_diagonal_numpy,
    scaling_diagonal_torch,
)


def test_identity_is_ones() -> None:
    d = scaling_diagonal_numpy(np.array([0.0, 5.0, 2.0]), "identity")
    np.testing.assert_array_equal(d, [1.0, 1.0, 1.0])


def test_marquardt_clamps_zero_columns() -> None:
    diag = np.array([0.0, 4.0, 1e-30, np.nan])
    d = scaling_diagonal_numpy(diag, "marquardt")
    floor = RELATIVE_FLOOR * 4.0
    np.testing.assert_allclose(d, [floor, 4.0, floor, floor])
    assert np.all(d > 0)


def test_torch_backend_uses_the_same_rule() -> None:
    diag = np.array([0.0, 4.0, 1e-30, 3.0])
    expected = scaling_diagonal_numpy(diag, "marquardt")
    found = scaling_diagonal_torch(torch.from_numpy(diag), "marquardt")
    np.testing.assert_allclose(found.numpy(), expected)


def test_zero_diagonal_falls_back_to_one() -> None:
    np.testing.assert_array_equal(scaling_diagonal_numpy(np.zeros(3), "marquardt"), np.ones(3))


def test_unknown_scaling_is_refused() -> None:
    with pytest.raises(ValueError, match="HINT"):
        scaling_diagonal_numpy(np.ones(2), "moré")
