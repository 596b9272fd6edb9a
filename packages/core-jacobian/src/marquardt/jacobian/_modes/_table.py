"""The Jacobian modes in one table: name → the residual forms it serves, its memory per
sample, its functions, and how the planner may choose it.

Every place that chooses or runs a mode reads `MODE_TABLE`: the planner (which modes a
residual form and a model allow, in what order ``auto`` prefers them, and the memory of a
chunk), the engine's probes (which model checks to run) and the slice work (which function
forms ``J``). A mode is added by one entry here.

Residual forms: ``OUTPUTS``, ``residual_fn(outputs, targets)``, a function of the model's
outputs; ``POINTS``, a `PointResidual`, which calls the model as a function of one point
and differentiates it by its inputs. The memory of one sample, in numbers, for ``P``
parameters, ``m`` residual rows and ``a`` activations per sample (times the
input-derivative graph of a `PointResidual`):

* ``broadcast``: ``(m+1)·P + 3a``, in chunks of at most ``BROADCAST_CHUNK`` samples;
* ``layers``: ``m·P + 2a·m``;
* ``taylor``: ``2·m·P + 3a`` (``a`` counts the ``1 + 2d`` channels of each activation);
* ``jacfwd``: the ``m·P`` rows of ``J``, plus ``2a + m`` for each column pushed at once
  (forward mode is chunked over columns as well as samples);
* ``vmap``: ``3·m·P + (m+1)·a``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from .._errors import UnknownModeError, message
from .._points import AnyResidual, PointResidual
from .._replicas import Replica
from ._broadcast import BROADCAST_CHUNK, broadcast_jacobian, broadcast_support
from ._common import ModeCall, Rows
from ._forward_laplacian import points_taylor, verify_taylor
from ._jacfwd import jacfwd_jacobian
from ._layers import layers_jacobian, layers_support
from ._points import points_forward, points_reverse
from ._subset import subset_jacfwd, subset_layers, subset_vmap
from ._taylor import taylor_support
from ._verify import verify_broadcast, verify_layers
from ._vmap import vmap_jacobian

__all__ = [
    "AUTO",
    "FORMS",
    "MODE_TABLE",
    "OUTPUTS",
    "POINTS",
    "JacobianMode",
    "ModeCall",
    "Sizes",
    "check_mode",
    "form_of",
    "mode_names",
]

#: The residual forms: a function of the model's outputs, or a `PointResidual`.
OUTPUTS = "outputs"
POINTS = "points"
#: Each form in words, for a plan's reasons (why a mode that does not serve it was passed).
FORMS = {
    OUTPUTS: "the residual is a function of the model's outputs",
    POINTS: "the residual differentiates the model by its inputs (PointResidual)",
}
#: The mode name that lets the planner choose.
AUTO = "auto"


@dataclass(frozen=True)
class Sizes:
    """What a mode's memory and its choice by ``auto`` depend on.

    Arguments:
        params: ``P``, the columns of ``J``.
        outputs: ``m``, the residual rows per sample.
        activations: ``a``, the activations per sample (times the input-derivative graph).
        item: bytes per number of the dtype of ``J``.
    """

    params: int
    outputs: int
    activations: int
    item: int


#: ``(replica, residual, call) -> (J, r)``, ``J`` of shape ``(b·m) × P`` (or ``× k``).
ModeFn = Callable[[Replica, Any, ModeCall], Rows]
#: A model check: ``model -> (whether the mode applies, why or why not)``.
SupportFn = Callable[[nn.Module], tuple[bool, str]]
#: A rule check on the first samples of a residual of a form the mode serves: ``None``, or
#: why the mode cannot be used.
VerifyFn = Callable[[Replica, Any, torch.Tensor, torch.Tensor], "str | None"]


def _always(_sizes: Sizes) -> bool:
    return True


def _unstated(_sizes: Sizes) -> str:
    return ""


@dataclass(frozen=True)
class JacobianMode:
    """One way of forming ``J``, and what the planner needs to know of it.

    Arguments:
        name: the mode's name (``mode=`` of the engine).
        forms: the function forming ``J`` for each residual form the mode serves.
        memory: bytes of one sample with every column at once (for a mode with
            ``column_memory``: without the columns pushed at once).
        column_memory: bytes of one sample per column pushed at once, for a mode that
            chunks over columns too; None for the others.
        max_chunk: the most samples of one chunk, whatever the budget; None: no cap.
        writes_out: whether the mode writes ``J`` into a given buffer (``ModeCall.out``).
        support: the model check that says whether the mode applies (None: it always does).
        verify: the rule check on the first samples that a model passing ``support``
            must also pass, once per engine.
        assumed: whether the mode applies when a caller of the planner says nothing.
        chosen_when: when ``auto`` takes the mode, among those that apply, in table order.
        why: the mode's own reason when ``auto`` takes it.
        fallback: the mode used instead when this one is asked for but does not apply.
    """

    name: str
    forms: Mapping[str, ModeFn]
    memory: Callable[[Sizes], int]
    column_memory: Callable[[Sizes], int] | None = None
    max_chunk: int | None = None
    writes_out: bool = False
    support: SupportFn | None = None
    verify: VerifyFn | None = None
    assumed: bool = True
    chosen_when: Callable[[Sizes], bool] = _always
    why: Callable[[Sizes], str] = _unstated
    fallback: str | None = None

    def serves(self, form: str) -> bool:
        """Whether the mode forms ``J`` of residuals of ``form``."""
        return form in self.forms

    def jacobian(self, replica: Replica, residual: AnyResidual, call: ModeCall) -> Rows:
        """``(J, r)`` of the samples of ``call`` by this mode's function for the form of
        ``residual``."""
        return self.forms[form_of(residual)](replica, residual, call)


def form_of(residual: AnyResidual) -> str:
    """The residual form of ``residual``: ``POINTS`` or ``OUTPUTS``."""
    return POINTS if isinstance(residual, PointResidual) else OUTPUTS


def _outputs(whole: ModeFn, subset: ModeFn) -> ModeFn:
    """The outputs form's function: ``subset`` when the call names columns, else ``whole``."""

    def run(replica: Replica, residual: Any, call: ModeCall) -> Rows:
        return (whole if call.columns is None else subset)(replica, residual, call)

    return run


_BROADCAST = JacobianMode(
    name="broadcast",
    # A subset's columns by vmap's rule: per-sample copies of a subset's tensors alone are
    # not what the model declares.
    forms={OUTPUTS: _outputs(broadcast_jacobian, subset_vmap)},
    memory=lambda s: s.item * ((s.outputs + 1) * s.params + 3 * s.activations),
    max_chunk=BROADCAST_CHUNK,
    support=broadcast_support,
    verify=verify_broadcast,
    assumed=False,
    fallback="jacfwd",
)
_LAYERS = JacobianMode(
    name="layers",
    forms={OUTPUTS: _outputs(layers_jacobian, subset_layers)},
    memory=lambda s: s.item * (s.outputs * s.params + 2 * s.activations * s.outputs),
    writes_out=True,
    support=layers_support,
    verify=verify_layers,
    why=lambda _s: "every layer has a per-sample rule",
    fallback="vmap",
)
_TAYLOR = JacobianMode(
    name="taylor",
    forms={POINTS: points_taylor},
    # J of the chunk and its copy into place, the input and output channels of each layer.
    memory=lambda s: s.item * (2 * s.outputs * s.params + 3 * s.activations),
    writes_out=True,
    support=taylor_support,
    verify=verify_taylor,
    assumed=False,
    fallback="vmap",
)
_JACFWD = JacobianMode(
    name="jacfwd",
    forms={OUTPUTS: _outputs(jacfwd_jacobian, subset_jacfwd), POINTS: points_forward},
    memory=lambda s: s.item * s.outputs * s.params,
    column_memory=lambda s: s.item * (2 * s.activations + s.outputs),
    # Forward mode wins when there are fewer inputs (parameters) than outputs.
    chosen_when=lambda s: s.params < s.outputs,
    why=lambda s: f"{s.params} parameters < {s.outputs} outputs per sample",
)
_VMAP = JacobianMode(
    name="vmap",
    forms={OUTPUTS: _outputs(vmap_jacobian, subset_vmap), POINTS: points_reverse},
    memory=lambda s: s.item * (3 * s.outputs * s.params + (s.outputs + 1) * s.activations),
    why=lambda _s: "no per-sample rule applies",
)

#: Every mode, in the order ``auto`` prefers them.
MODE_TABLE: dict[str, JacobianMode] = {
    m.name: m for m in (_BROADCAST, _LAYERS, _TAYLOR, _JACFWD, _VMAP)
}


def mode_names() -> tuple[str, ...]:
    """``auto`` and the name of every mode of the table, in its order."""
    return (AUTO, *MODE_TABLE)


def check_mode(name: str, asked: str | None = None) -> str:
    """``name``, when it is ``auto`` or a mode of the table.

    Arguments:
        name: the mode asked for.
        asked: how it was asked, for the message (default ``mode='<name>'``).

    Returns:
        ``name``.

    Raises:
        UnknownModeError: ``name`` is not in the table, naming the table's modes.
    """
    names = mode_names()
    if name not in names:
        raise UnknownModeError(
            message(
                f"the Jacobian mode {asked or f'mode={name!r}'} was requested",
                f"the known modes are {', '.join(names)}",
                f"pass one of {', '.join(names)}",
            )
        )
    return name
