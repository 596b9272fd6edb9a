"""Physics-informed modelling on top of the Jacobian engine.

The layers networks for PINNs use and torch lacks (``activations.py``: `Sine`,
`FourierFeatures`, `PeriodicFeatures`), Dirichlet conditions built into the network
(``boundary.py``: `HardBoundary`), causal weights for residuals in time (``causal.py``:
`CausalWeights`) and collocation points drawn afresh as training goes
(``collocation.py``: `Collocation`); the whole LM step of a PINN as one function, compiled
where asked (``step.py``: `PinnStep`). ``taylor_rules.py`` registers the layers' forward
Laplacian with the engine's modes. This room imports the engine; the engine never imports
it.
"""

from __future__ import annotations

from . import taylor_rules  # noqa: F401  (registers the layers with the engine)
from .activations import FourierFeatures, PeriodicFeatures, Sine
from .boundary import HardBoundary
from .causal import CausalWeights
from .collocation import Collocation
from .step import PinnStep

__all__ = [
    "CausalWeights",
    "Collocation",
    "FourierFeatures",
    "HardBoundary",
    "PeriodicFeatures",
    "PinnStep",
    "Sine",
]
