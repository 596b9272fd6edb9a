"""One rank of the two-process LMA tests (``test_distributed.py``); also the reference.

``python distributed_worker.py RANK WORLD STORE OUT`` joins a gloo group through a file
store (1 torch thread), runs every configuration of :data:`CONFIGS` for ``STEPS`` steps on
its share of the global batch with ``LMA(process_group="default")`` and, on rank 0,
writes the iterates, λ and losses to ``OUT``. Then two fault phases run in the same
group: the ranks build their LMA with different λ (the agreement check must name rank 1),
and finally rank 1 kills itself with SIGKILL inside the Jacobian of a step, after writing
the time to ``OUT.killed``; rank 0 must fail with ``RankFailureError``.

:func:`run_config` with ``group=False`` runs the same configuration in one process on the
whole batch: the reference the test compares with.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from typing import Any

import torch
import torch.distributed as dist
from file_store_group import join_file_store_group
from torch import nn

from marquardt.solver import (
    LMA,
    BatchNotFiniteError,
    RanksDisagreeError,
    ResidualNotFiniteError,
    TruncatedCG,
)

STEPS = 10

# name: (global samples, samples of rank 0, LMA options)
CONFIGS: dict[str, tuple[int, int, dict[str, Any]]] = {
    "accumulate-nielsen": (200, 100, {"strategy": "auto"}),
    "accumulate-fixed": (200, 100, {"damping": "fixed"}),
    "explicit-nielsen": (40, 23, {}),
    "explicit-fixed": (40, 23, {"damping": "fixed"}),
    "explicit-forced-overdetermined": (120, 60, {"strategy": "explicit"}),
    "accumulate-uneven-robust": (200, 130, {"robust_loss": "soft_l1", "f_scale": 0.3}),
    "accumulate-loss-fn": (200, 100, {"loss_fn": "half-mse"}),
    "accumulate-tolerances": (200, 100, {"ftol": 0.1, "xtol": 0.025, "gtol": 1e-12}),
    # Ranks given different seeds: every rank must draw rank 0's subsets.
    "subsets-random": (200, 100, {"params_per_step": 20, "seed": "rank-0-wins"}),
    "subsets-layer": (40, 23, {"params_per_step": 20, "param_selection": "layer"}),
    # Products all-reduced per CG iteration; probes' signs by global row. Where CG stops
    # on its tolerance is a discontinuous function of rounding (one iteration more or
    # less): a tight tolerance makes δ the converged one, comparable to 1e-8. The first
    # with the default (Nyström) preconditioner, whose sketch is all-reduced too; the
    # second with the Jacobi one.
    "matrix-free": (200, 100, {"strategy": "matrix_free", "cg": "tight"}),
    "matrix-free-uneven-fixed": (
        200,
        130,
        {"strategy": "matrix_free", "damping": "fixed", "cg": "tight-jacobi"},
    ),
}


def _half_mse(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return 0.5 * ((a - b) ** 2).mean()


def make_model() -> nn.Module:
    """A 1-16-1 tanh MLP (P = 49), float64, the same on every rank and run."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(1, 16), nn.Tanh(), nn.Linear(16, 1)).double()


def data(samples: int) -> tuple[torch.Tensor, torch.Tensor]:
    """y = sinc(3x) + noise on [-1, 1], fixed."""
    gen = torch.Generator().manual_seed(1)
    x = torch.rand(samples, 1, generator=gen, dtype=torch.float64) * 2 - 1
    y = torch.sinc(3 * x) + 0.01 * torch.randn(samples, 1, generator=gen, dtype=torch.float64)
    return x, y


def build(options: dict[str, Any], group: bool) -> LMA:
    """The LMA of a configuration (in the group or alone)."""
    opts = dict(options)
    if opts.get("loss_fn") == "half-mse":
        opts["loss_fn"] = _half_mse
    if opts.get("cg") in ("tight", "tight-jacobi"):
        preconditioner = "jacobi" if opts["cg"] == "tight-jacobi" else "nystrom"
        opts["cg"] = TruncatedCG(iterations=200, tolerance=1e-10, preconditioner=preconditioner)
    if opts.get("seed") == "rank-0-wins":
        opts["seed"] = 5 if not group or dist.get_rank() == 0 else 6
    return LMA(
        make_model(),
        ["cpu"],
        residual_fn=lambda a, b: a - b,
        process_group="default" if group else None,
        **opts,
    )


def run_config(name: str, *, group: bool) -> dict[str, Any]:
    """STEPS steps of configuration ``name``: θ, λ, loss, terminated and strategy per step."""
    samples, first, options = CONFIGS[name]
    x, y = data(samples)
    if group:
        lo, hi = (0, first) if dist.get_rank() == 0 else (first, samples)
        x, y = x[lo:hi], y[lo:hi]
    lma = build(options, group)
    out: dict[str, Any] = {"theta": [], "damping": [], "loss": [], "terminated": [], "strategy": []}
    for _ in range(STEPS):
        loss, terminated = lma.step(x, y)
        assert lma.report is not None
        out["theta"].append(torch.nn.utils.parameters_to_vector(lma.model.parameters()).clone())
        out["damping"].append(lma.damping)
        out["loss"].append(loss)
        out["terminated"].append(terminated)
        out["strategy"].append(lma.report.strategy)
        if terminated:
            break
    return out


def _disagreement() -> str:
    """Ranks built with different λ: the check must raise, naming rank 1."""
    x, y = data(200)
    rank = dist.get_rank()
    x, y = (x[:100], y[:100]) if rank == 0 else (x[100:], y[100:])
    lma = build({"damping_start": 1e-3 if rank == 0 else 1e-2}, True)
    try:
        lma.step(x, y)
    except RanksDisagreeError as err:
        return str(err)
    return ""


def _refused_together() -> list[dict[str, Any]]:
    """Rank 1's batch holds a NaN target ("data", refused by the data check), or a NaN
    residual (the log of a negative target) at sample 3, which planning evaluates
    ("planning"), or at sample 10, which only the assembly does ("assembly"): each rank
    must refuse the batch at once, and the next batch, clean, must step on both. Per
    rank."""
    rank = dist.get_rank()
    out: dict[str, Any] = {}
    for strategy, samples, first in (("auto", 200, 100), ("explicit", 40, 23)):
        x, y = data(samples)
        lo, hi = (0, first) if rank == 0 else (first, samples)
        x, clean = x[lo:hi], torch.exp(y[lo:hi])
        for where, sample in (("data", 5), ("planning", 3), ("assembly", 10)):
            bad = clean.clone()
            if rank == 1:
                bad[sample] = float("nan") if where == "data" else -1.0
            lma = LMA(
                make_model(),
                ["cpu"],
                residual_fn=lambda a, b: a - torch.log(b),
                process_group="default",
                strategy=strategy,
            )
            lma.step(x, clean)
            case = f"{strategy}-{where}"
            started = time.monotonic()
            try:
                lma.step(x, bad)
                out[case] = "stepped"
            except (ResidualNotFiniteError, BatchNotFiniteError) as err:
                out[case] = f"{type(err).__name__}: {err}"
            out[f"{case}-seconds"] = time.monotonic() - started
            out[f"{case}-after"] = lma.step(x, clean)[0]
    everyone: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, out)
    return everyone


def _killed_mid_step(out: str) -> None:
    """Rank 1 dies with SIGKILL inside its second step (its first residual evaluation)."""
    x, y = data(200)
    rank = dist.get_rank()
    x, y = (x[:100], y[:100]) if rank == 0 else (x[100:], y[100:])
    armed = {"now": False}

    def residual(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        if armed["now"] and rank == 1:
            with open(out + ".killed", "w") as fh:
                fh.write(repr(time.time()))
            os.kill(os.getpid(), signal.SIGKILL)
        return a - b

    lma = LMA(make_model(), ["cpu"], residual_fn=residual, process_group="default")
    for _ in range(STEPS):
        lma.step(x, y)
        armed["now"] = True
    # Not reached on either rank: rank 1 dies, rank 0 raises RankFailureError.
    sys.exit(7)


def main() -> None:
    rank, out = join_file_store_group(timeout_s=20)
    results = {name: run_config(name, group=True) for name in CONFIGS}
    results["_disagreement"] = _disagreement()
    results["_refused_together"] = _refused_together()
    if rank == 0:
        torch.save(results, out)
    dist.barrier()
    _killed_mid_step(out)


if __name__ == "__main__":
    main()
