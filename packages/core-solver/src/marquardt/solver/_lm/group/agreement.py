"""The ranks' agreement after a step (``MARQUARDT_SOLVER_CHECK_RANKS=1``): `check_agreement`.

The all-reduced products are bitwise identical on every rank and every rank solves the
same system with the same λ, so on identical hardware the ranks end every step bitwise
alike. This compares λ, attempts, acceptance, ‖lr·δ‖, the loss and Σθ across ranks.
"""

from __future__ import annotations

import torch

from marquardt.jacobian import Replicas

from ..._errors import RanksDisagreeError, message
from ..report import StepReport
from .collectives import Collectives

__all__ = ["check_agreement"]

_NAMES = ("λ", "attempts", "accepted", "‖lr·δ‖", "loss", "Σθ")


def check_agreement(collectives: Collectives, report: StepReport, replicas: Replicas) -> None:
    """Compare the step's outcome across ranks, bitwise (NaN agrees with NaN).

    Raises:
        RanksDisagreeError: a rank ended the step in another state than rank 0.
    """
    mine = torch.tensor(
        [
            report.damping,
            float(report.attempts),
            float(report.accepted),
            report.step_norm,
            report.loss_after,
            float(replicas.flat_params().double().sum()),
        ],
        dtype=torch.float64,
        device=collectives.device,
    )
    everyone = collectives.gathered(mine, "all-gather of the agreement check")
    reference = everyone[0].tolist()
    differ: list[str] = []
    for rank, values in enumerate(everyone):
        got = values.tolist()
        for name, a, b in zip(_NAMES, reference, got, strict=True):
            same = a == b or (a != a and b != b)  # NaN agrees with NaN
            if not same:
                differ.append(f"rank {rank} has {name} = {b!r} where rank 0 has {a!r}")
    if differ:
        raise RanksDisagreeError(
            message(
                f"the ranks of the process group were to end LM step {collectives.step} in "
                "the same state (MARQUARDT_SOLVER_CHECK_RANKS)",
                "; ".join(differ),
                "every rank must build the LMA with the same options and call step() "
                "the same number of times; different hardware or BLAS on different "
                "nodes can make identical solves differ in the last bits",
            )
        )
