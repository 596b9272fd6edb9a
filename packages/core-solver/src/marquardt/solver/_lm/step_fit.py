"""Whether a step fits the memory, and the planner's answer when it does not: `fit_step`.

Before any Jacobian is formed a step checks that it fits (``memory_fit.py`` counts the
bytes). With nothing forced (``strategy="auto"``, no ``params_per_step``) a dense step
that does not fit switches to the matrix-free step (conjugate gradients on products JᵀJv;
Martens 2010), or where even that does not fit to random subsets of the largest k that
does, and a ``UserWarning`` says so; a forced strategy or k that does not fit is refused
before any work. In a process group every rank takes the plan the tightest rank can take,
and learns whether each rank could plan its share: a rank that refused its share lowers
the flag (``group/refusal.py``), and the others raise ``ResidualNotFiniteError``.
Legate's GPUs are sized by ``marquardt-devices`` and not checked here.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch

from marquardt.jacobian import JacobianEngine, PreparedBatch

from .._errors import SolverConfigError, message
from .group import REFUSED, refused_elsewhere
from .memory_fit import StepMemory, step_memory, usable_memory
from .scope import StepScope

__all__ = ["Refit", "StepLimits", "fit_step"]


@dataclass(frozen=True)
class Refit:
    """What the solver does from now on when a step did not fit: ``strategy`` (and why,
    ``reason``), and for random subsets their size ``subsets``."""

    strategy: str
    reason: str = ""
    subsets: int | None = None


@dataclass(frozen=True)
class StepLimits:
    """What bounds a step's memory besides its batch.

    Arguments:
        backend: the name of the solver's array backend.
        memory_limit: the usable bytes (None: 0.8 × the free memory).
        probes: the matrix-free step's diagonal probes.
        rank: the matrix-free step's Nyström sketch rank.
        auto_subsets: whether the planner may choose (nothing was forced).
    """

    backend: str
    memory_limit: int | None
    probes: int
    rank: int = 0
    auto_subsets: bool = False


def _free_fits(
    batch: PreparedBatch,
    slice_size: int | None,
    engine: JacobianEngine,
    limits: StepLimits,
    scope: StepScope,
) -> StepMemory | None:
    """The matrix-free step of the same batch (a plan, no Jacobian formed), when it fits
    on every rank."""
    replicas = engine.replicas
    devices = replicas.devices
    free_plan = engine.prepare(
        batch.inputs, batch.targets, slice_size, strategy="matrix_free", checked=True
    ).plan
    free = step_memory(
        free_plan,
        replicas.num_params,
        replicas.dtype.itemsize,
        len(devices),
        usable_memory(devices[0], limits.memory_limit),
        probes=limits.probes,
        rank=limits.rank,
    )
    (free_fits,) = scope.least((int(free.fits),))
    return free if free_fits else None


def _refuse(batch: PreparedBatch, fit: StepMemory, p: int) -> Exception:
    """The refusal of a step that does not fit and that the planner may not change."""
    if fit.fits:
        return SolverConfigError(
            message(
                "this step fits this rank's memory",
                "another rank of the process group has too little memory for it",
                "read that rank's error; give every rank the same memory_limit and devices",
            )
        )
    what = (
        f"strategy={batch.strategy!r} on all {p} parameters"
        if batch.columns is None
        else f"params_per_step={batch.columns.size} (strategy={batch.strategy!r})"
    )
    return fit.refuse(what)


def fit_step(
    batch: PreparedBatch,
    slice_size: int | None,
    *,
    scope: StepScope,
    engine: JacobianEngine,
    limits: StepLimits,
) -> Refit | None:
    """None when the step of ``batch`` fits; else the `Refit` the planner chose.

    Arguments:
        batch: the step's prepared batch (its plan, its columns).
        slice_size: the step's slice size (to plan the matrix-free step of the batch).
        scope: the step's scope (in a process group, the ranks agree on the plan).
        engine: the Jacobian engine (its replicas' devices, dtype and P).
        limits: the backend, memory and matrix-free options that bound the step.

    Raises:
        SolverConfigError: a forced strategy or subset size that does not fit, or a step
            that fits here but not on another rank.
        ResidualNotFiniteError: another rank refused its share of the batch.
    """
    dense = batch.strategy != "matrix_free"
    if limits.backend == "cupynumeric" and dense:
        if scope.world_size > 1:
            *_, planned = scope.least((1, 0, 1))
            if not planned:
                raise refused_elsewhere(REFUSED)
        return None
    replicas = engine.replicas
    devices = replicas.devices
    device = torch.device("cpu") if limits.backend == "numpy" and dense else devices[0]
    p = replicas.num_params
    usable = usable_memory(device, limits.memory_limit)
    fit = step_memory(
        batch.plan, p, replicas.dtype.itemsize, len(devices), usable, probes=limits.probes
    )
    fits, fitting_k, planned = scope.least((int(fit.fits), fit.fitting_k, 1))
    if not planned:
        raise refused_elsewhere(REFUSED)
    if fits:
        return None
    # Every rank is here (the minimum said "does not fit" to all of them).
    free_to_choose = batch.columns is None and limits.auto_subsets
    if free_to_choose and dense:
        free = _free_fits(batch, slice_size, engine, limits, scope)
        if free is not None:
            return _matrix_free(batch, p, fit, free)
    if free_to_choose and fitting_k >= 1:
        warnings.warn(
            f"an LM step on all {p} parameters needs "
            f"{fit.formula} = {fit.needed} B but {fit.usable} B are usable "
            f"({fit.source}): stepping on random subsets of k = {fitting_k} "
            "parameters (pass params_per_step= and param_selection= to choose)",
            UserWarning,
            stacklevel=3,
        )
        return Refit("auto", subsets=fitting_k)
    raise _refuse(batch, fit, p)


def _matrix_free(batch: PreparedBatch, p: int, dense: StepMemory, free: StepMemory) -> Refit:
    """Strategy "matrix_free" from now on, and why (the warning, ``report``)."""
    n = batch.rows
    system = f"{p} x {p} (JᵀJ)" if batch.strategy == "accumulate" else f"{n} x {n} (JJᵀ)"
    reason = (
        f"matrix_free: the {batch.strategy} step's {system} system needs "
        f"{dense.formula} = {dense.needed} B but {dense.usable} B are usable "
        f"({dense.source}), and the other dense form is larger; the matrix-free step "
        f"needs at most {free.formula} = {free.needed} B"
    )
    warnings.warn(
        f"an LM step on all {p} parameters does not fit: {reason}. "
        "Stepping matrix-free (conjugate gradients on products JᵀJv) from now on "
        "(pass strategy= to choose)",
        UserWarning,
        stacklevel=4,
    )
    return Refit("matrix_free", reason=reason)
