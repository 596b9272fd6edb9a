"""LM across the ranks of a torch.distributed process group, one concern a module.

The residual vector of a global batch stacks the ranks' local residuals, r = (r₀; r₁; …),
and its Jacobian stacks their row blocks J = (J₀; J₁; …), so the damped normal equations
(Levenberg 1944; Marquardt 1963) are sums over ranks, formed by the cross-rank assembly
(``_lm/assembly_ranks.py``). The trial loss of every attempt is Σₖ ‖rₖ‖² / Σₖ Nₖ (a
custom ``loss_fn``: Σₖ Lₖ·nₖ / Σₖ nₖ over samples), all-reduced as two numbers, so the
ranks take the same accept / reject decision (Nielsen 1999) and λ stays identical.

* `Collectives` (``collectives.py``): torch.distributed's collectives, each failure a
  `RankFailureError` naming ranks, found by a roll call (``roll_call.py``);
* ``broadcast.py``: θ and the subset seed of the group's rank 0 on every rank;
* ``refusal.py``: the ranks refuse a batch with NaN or infinite data together;
* ``agreement.py``: the after-step agreement check (``MARQUARDT_SOLVER_CHECK_RANKS=1``).

The step scopes that use them (`LocalScope`, `GroupScope`) are in ``_lm/scope.py``.
"""

from ..._errors import RankFailureError, RanksDisagreeError
from .agreement import check_agreement
from .broadcast import broadcast_parameters, common_seed
from .collectives import Collectives
from .refusal import REFUSED, not_finite_products, refuse, refused_elsewhere, summed_totals
from .roll_call import ROLL_CALL_SECONDS, roll_call

__all__ = [
    "REFUSED",
    "ROLL_CALL_SECONDS",
    "Collectives",
    "RankFailureError",
    "RanksDisagreeError",
    "broadcast_parameters",
    "check_agreement",
    "common_seed",
    "not_finite_products",
    "refuse",
    "refused_elsewhere",
    "roll_call",
    "summed_totals",
]
