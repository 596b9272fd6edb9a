"""Parameter subsets per step: which ``k`` columns a block-coordinate LM step updates.

With ``params_per_step=k`` a step solves the damped system of ``J_S``, the ``k`` columns
of ``J`` for a subset ``S`` of the parameters,

    (J_SᵀJ_S/N + λD_S) δ_S = J_Sᵀr/N     (or the N × N dual when N < k),

and moves θ_S ← θ_S − lr·δ_S, the other parameters held (block-coordinate descent on the
Gauss-Newton model; Nocedal & Wright ch. 9; the "parameter selection" of
torch-levenberg-marquardt). Memory is ``O(k²)`` for the system and ``O(slice·k)`` for
the Jacobian columns, which are the only ones formed (``marquardt.jacobian.ColumnSubset``).
λ is one for all blocks (shared), as the damping rule holds it: measured on the layer
rule, per-block λ was no better (docs/algorithm.md gives the figures).

Selection rules (`ParamSelection`):

* ``"layer"``: the flat parameter vector is cut into blocks that follow the parameter
  tensors: consecutive tensors are packed together while their total stays ≤ k (a layer's
  weight and bias usually share a block), and a tensor larger than k is cut into
  ⌈size/k⌉ nearly equal runs of consecutive entries. Steps cycle through the blocks in
  order; a block has at most k columns.
* ``"random"``: k distinct columns drawn uniformly per step from a ``torch.Generator``
  seeded with ``seed``; its state is part of ``LMA.state_dict`` so a resumed run draws the
  same subsets as an uninterrupted one.
* a callable ``select(step, params) -> indices``: at most k distinct flat indices.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch

from marquardt.devices._whole import is_whole, require_whole

from .._backends.base import LinearSystem, Solution
from .._errors import SolverConfigError, SolverStateError, message
from .solve.kind import LinearSolver

__all__ = ["SELECTIONS", "ParamSelection", "SubsetSolver", "layer_blocks"]

SELECTIONS = ("layer", "random")

Selector = Callable[[int, int], "torch.Tensor | Sequence[int]"]


def layer_blocks(sizes: Sequence[int], k: int) -> list[tuple[int, int]]:
    """The ``[start, stop)`` ranges of the layer rule for tensors of ``sizes`` (see the
    module docstring)."""
    blocks: list[tuple[int, int]] = []
    start = offset = 0
    for size in sizes:
        if size > k:
            if offset > start:
                blocks.append((start, offset))
            runs = math.ceil(size / k)
            edges = [offset + round(i * size / runs) for i in range(runs + 1)]
            blocks.extend((a, b) for a, b in itertools.pairwise(edges))
            offset += size
            start = offset
            continue
        if offset + size - start > k:
            blocks.append((start, offset))
            start = offset
        offset += size
    if offset > start:
        blocks.append((start, offset))
    return blocks


def check_selection(
    params_per_step: int | None,
    param_selection: str | Selector,
    seed: int | None,
    gtol: float | None,
) -> None:
    """Refuse bad subset options before anything is built."""
    if params_per_step is None:
        return
    require_whole(
        params_per_step,
        1,
        SolverConfigError,
        "params_per_step was expected as a whole number ≥ 1 of parameters per step",
        "pass e.g. params_per_step=4096, or None to update every parameter",
    )
    if not callable(param_selection) and param_selection not in SELECTIONS:
        raise SolverConfigError(
            message(
                "param_selection was expected as 'layer', 'random' or a function "
                "(step, params) -> indices",
                f"got {param_selection!r}",
                "pass param_selection='layer' or 'random'",
            )
        )
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise SolverConfigError(
            message("seed was expected as an integer", f"got {seed!r}", "pass e.g. seed=0")
        )
    if gtol is not None:
        raise SolverConfigError(
            message(
                "gtol with params_per_step was requested",
                "a subset step sees the gradient of its k columns only, so the gtol test "
                "would stop on one block's gradient",
                "leave gtol None with params_per_step (ftol / xtol apply), or drop params_per_step",
            )
        )


class ParamSelection:
    """Which columns each step updates: ``k`` per step by ``rule`` over ``sizes``."""

    def __init__(
        self, k: int, rule: str | Selector, sizes: Sequence[int], seed: int | None
    ) -> None:
        self.params = int(sum(sizes))
        self.k = min(k, self.params)
        self.rule = rule if isinstance(rule, str) else "callable"
        self._select = rule if callable(rule) else None
        self._blocks = layer_blocks(sizes, self.k) if rule == "layer" else []
        self._cursor = 0
        self._seed = seed
        self._generator = torch.Generator()
        if seed is None:
            self._generator.seed()
        else:
            self._generator.manual_seed(seed)

    @classmethod
    def resumed(cls, state: object, sizes: Sequence[int], seed: int | None) -> ParamSelection:
        """A selection for a saved ``state`` of the "layer" or "random" rule (the solver
        chose subsets itself before it was saved); its state is loaded by the caller."""
        rule = state.get("rule") if isinstance(state, dict) else None
        k = state.get("k") if isinstance(state, dict) else None
        if rule not in SELECTIONS or not is_whole(k, 1):
            raise SolverStateError(
                message(
                    "a param_selection state of rule 'layer' or 'random' with k ≥ 1 was expected",
                    f"got rule {rule!r} and k {k!r}",
                    "pass what LMA.state_dict() returned, unedited, or construct the LMA "
                    "with the params_per_step and param_selection it was saved with",
                )
            )
        return cls(k, str(rule), sizes, seed)

    @property
    def blocks(self) -> list[tuple[int, int]]:
        """The layer rule's blocks (empty for the other rules)."""
        return list(self._blocks)

    def _draw(self, step: int) -> torch.Tensor:
        if self.rule == "layer":
            lo, hi = self._blocks[self._cursor % len(self._blocks)]
            self._cursor = (self._cursor + 1) % len(self._blocks)
            return torch.arange(lo, hi, dtype=torch.int64)
        if self.rule == "random":
            drawn = torch.randperm(self.params, generator=self._generator)[: self.k]
            return torch.sort(drawn).values
        assert self._select is not None
        chosen = torch.as_tensor(self._select(step, self.params)).reshape(-1)
        if chosen.numel() > self.k:
            raise SolverConfigError(
                message(
                    f"param_selection was expected to return at most k = {self.k} indices",
                    f"it returned {chosen.numel()} at step {step}",
                    "return fewer indices, or raise params_per_step",
                )
            )
        return chosen

    @contextmanager
    def drawn(self, step: int) -> Iterator[torch.Tensor]:
        """The indices of ``step``; the selection's state goes back to where it was when
        the step raises, so a failed step draws the same subset again."""
        saved = self.state_dict()
        try:
            yield self._draw(step)
        except BaseException:
            self.load_state_dict(saved)
            raise

    def state_dict(self) -> dict[str, Any]:
        """The rule, the layer cursor and the random generator's state."""
        return {
            "rule": self.rule,
            "k": self.k,
            "cursor": self._cursor,
            "generator": self._generator.get_state().clone(),
        }

    def load_state_dict(self, state: object) -> None:
        """Restore what `state_dict` returned (checked before any change)."""
        expected = {"rule", "k", "cursor", "generator"}
        if not isinstance(state, dict) or set(state) != expected:
            raise SolverStateError(
                message(
                    f"param_selection state with the keys {sorted(expected)} was expected",
                    f"got {sorted(state) if isinstance(state, dict) else type(state).__name__}",
                    "pass what LMA.state_dict() returned, unedited",
                )
            )
        if state["rule"] != self.rule or state["k"] != self.k:
            raise SolverStateError(
                message(
                    f"the state of param_selection={state['rule']!r} with k = {state['k']} "
                    "was given",
                    f"this solver selects by {self.rule!r} with k = {self.k}",
                    "construct the LMA with the same params_per_step and param_selection",
                )
            )
        generator = state["generator"]
        cursor = state["cursor"]
        if not isinstance(generator, torch.Tensor) or not isinstance(cursor, int):
            raise SolverStateError(
                message(
                    "param_selection state with a generator tensor and an integer cursor "
                    "was expected",
                    f"got {type(generator).__name__} and {type(cursor).__name__}",
                    "pass what LMA.state_dict() returned, unedited",
                )
            )
        self._generator.set_state(generator.clone())
        self._cursor = cursor


class SubsetSolver:
    """A `LinearSolver` over the ``k × k`` system of a subset whose solutions are
    scattered into the ``P`` parameters (zero outside the subset), so the attempt loop
    moves θ_S only.

    Arguments:
        inner: the solver of the subset's system.
        index: the subset's parameters.
        params: P.
    """

    def __init__(self, inner: LinearSolver, index: torch.Tensor, params: int) -> None:
        self.inner = inner
        self.name = inner.name
        self._index = index
        self._params = params

    def solve(self, system: LinearSystem, damping: float, scaling: str) -> Solution | None:
        """The inner solve, δ_S scattered into a P-vector (its other terms as they are)."""
        solved = self.inner.solve(system, damping, scaling)
        if solved is None:
            return None
        delta = solved.delta
        full = torch.zeros(self._params, dtype=delta.dtype, device=delta.device)
        full[self._index.to(delta.device)] = delta
        return dataclasses.replace(solved, delta=full)

    def accept(self) -> None:
        """The inner solver's."""
        self.inner.accept()
