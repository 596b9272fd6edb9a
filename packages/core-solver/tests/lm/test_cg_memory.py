"""The planner's memory of a matrix-free step counts the vectors the conjugate gradients hold."""

from __future__ import annotations

from marquardt.devices import _plan_matrix_free as plan
from marquardt.solver import TruncatedCG
from marquardt.solver._lm.solve import cg


def test_the_planners_vectors_are_the_solvers() -> None:
    assert plan.CG_VECTORS == cg.CG_VECTORS
    assert plan.SKETCH_VECTORS == cg.SKETCH_VECTORS
    defaults = TruncatedCG()
    assert (defaults.probes, defaults.rank) == (plan.DEFAULT_PROBES, plan.DEFAULT_RANK)
    held = cg.CG_VECTORS + defaults.probes + cg.SKETCH_VECTORS * defaults.rank
    assert held == plan.MATRIX_FREE_VECTORS_HELD
