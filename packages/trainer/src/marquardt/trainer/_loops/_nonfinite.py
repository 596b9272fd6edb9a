"""A step whose loss, or whose parameters after it, are NaN or infinite: noticed at once.

The loss is looked at after every step (it is read as a number anyway). The parameters
and buffers are read after every step under ``"skip"``, which must undo the step that
made them non-finite; under ``"stop"`` and ``"continue"`` they are read after every
``MODEL_CHECK_EVERY``-th step and after the last step of each epoch, since a model made
non-finite by a step with a finite loss gives a non-finite loss on the next step (the
forward pass reads the parameters): the fault is then reported one step later, at the
step whose loss it spoils, and the every-``MODEL_CHECK_EVERY`` check catches parameters
and buffers the loss does not read. This spares a host read of every parameter tensor on
every step (``finite_model`` costs as much as the optimizer step of a small model).

``TrainConfig.on_nonfinite`` says what happens then:

- ``"stop"`` (the default): the run stops with ``NonFiniteLossError``
  naming the step, the epoch, the batch and the last checkpoint (a finite one: see
  below). No checkpoint is written after the fault.
- ``"skip"``: the step is undone (the model's parameters and buffers and the optimizer's
  state go back to where they were before it) and the batch is skipped; the step is
  taken again on the next batch, so the step count and the LR schedule do not see the
  skipped batch. After ``MAX_SKIPPED`` non-finite batches in a row the run stops as with
  ``"stop"``. Undoing needs a copy of the model and optimizer state before every step.
- ``"continue"``: the step stands and the run goes on (a notice on the console), as
  Lightning and perceptrain do by default.

Whatever the choice, a checkpoint is never written from a non-finite model (see
``finite_model``): the numbered checkpoints that ``keep_checkpoints`` rotates are
all finite, and the last one is where ``resume_from="latest"`` starts again.

In the LM loop a step cannot accept a non-finite point (a trial must lower the loss);
what the loop meets instead is a batch on which the residuals at the current parameters
are not finite, which the ``LMA`` refuses before changing anything: that batch is the
fault here. Under DDP the ranks agree (one all-reduce of one flag per step): every rank
stops, skips or goes on at the same step, so none is left waiting in a collective.
"""

from __future__ import annotations

import copy
import math
from typing import Any

import torch
from torch import nn

from .. import _distributed as pg
from .._config_rules import NONFINITE_POLICIES
from .._errors import NonFiniteLossError
from .._logging._base import notice
from ._base import StepResult
from ._context import RunContext

__all__ = ["MAX_SKIPPED", "MODEL_CHECK_EVERY", "POLICIES", "NonFiniteGuard", "finite_model"]

#: The values of ``TrainConfig.on_nonfinite``.
POLICIES = NONFINITE_POLICIES
#: ``"skip"`` stops the run after this many non-finite batches in a row.
MAX_SKIPPED = 25
#: Under ``"stop"`` and ``"continue"`` the model is read after every this many steps (and
#: after each epoch's last step); under ``"skip"`` after every step.
MODEL_CHECK_EVERY = 32


@torch.no_grad()
def finite_model(model: nn.Module) -> bool:
    """Whether every floating parameter and buffer of ``model`` is finite (one host read).

    A NaN or an infinity in any entry makes the sum of all entries non-finite, so a finite
    sum (in float64, which the sum of float32 values cannot overflow) proves them all
    finite: one reduction per tensor instead of a mask. Only a non-finite sum is looked at
    entry by entry (a float64 model's sum can overflow while every entry is finite).
    """
    tensors = [
        t for t in (*model.parameters(), *model.buffers()) if t.is_floating_point() and t.numel()
    ]
    if not tensors:
        return True
    home = tensors[0].device
    total = torch.stack([t.sum(dtype=torch.float64).to(home) for t in tensors]).sum()
    if bool(torch.isfinite(total)):
        return True
    return all(bool(torch.isfinite(t).all()) for t in tensors)


def _refused_batch(exc: BaseException) -> bool:
    """Whether ``exc`` is the LMA refusing a batch whose data or residuals are not finite."""
    try:
        from marquardt.solver import BatchNotFiniteError, ResidualNotFiniteError
    except ImportError:
        return False
    return isinstance(exc, ResidualNotFiniteError | BatchNotFiniteError)


class NonFiniteGuard:
    """The loop's step, checked for a non-finite loss or model (see the module docstring)."""

    def __init__(self, context: RunContext) -> None:
        self.context = context
        self.policy = context.config.on_nonfinite
        self._warned = False
        self._skipped = 0  # non-finite steps undone in a row
        self._every = 1 if self.policy == "skip" else MODEL_CHECK_EVERY

    def _model_due(self, epoch_end: bool) -> bool:
        """Whether the model is read after this step (see the module docstring)."""
        return epoch_end or (self.context.state.step + 1) % self._every == 0

    def step(
        self, batches: list[Any], device: torch.device, epoch_end: bool = True
    ) -> StepResult | None:
        """One step of the loop on ``batches`` as ``on_nonfinite`` asks; ``None`` when the
        step was undone and these batches are to be skipped.

        Arguments:
            batches: the step's prepared batches.
            device: this process's device.
            epoch_end: whether this is the epoch's last step (the model is then read
                whatever the policy).

        Returns:
            The step's result, or ``None`` when it was undone.
        """
        loop = self.context.loop
        saved = self._snapshot() if self.policy == "skip" else None
        why = ""
        try:
            result = loop.step(batches, device)
        except ValueError as exc:
            if not _refused_batch(exc):
                raise
            result, why = StepResult(math.nan), str(exc).split(". HINT")[0]
        else:
            if not math.isfinite(result.loss):
                why = f"the training loss is {result.loss}"
            elif self._model_due(epoch_end) and not finite_model(loop.model):
                why = "the parameters are not finite after the step"
        (bad,) = pg.flags_any([bool(why)], device)
        if not bad:
            if self._skipped:
                result = StepResult(
                    result.loss,
                    {**result.metrics, "skipped_batches": float(self._skipped)},
                    result.stop_reason,
                )
                self._skipped = 0
            return result
        why = why or "another rank found a non-finite loss or model"
        if self.policy == "continue":
            if not self._warned:
                self._warned = True
                self._notice(
                    f"{self._where()}: {why}; on_nonfinite='continue' goes on, without "
                    "writing checkpoints while the model is not finite (the last one, "
                    f"{self.context.state.last_checkpoint}, is kept); later non-finite "
                    "steps are not reported"
                )
            return result
        if self.policy == "stop":
            raise self._error(why, "")
        assert saved is not None
        self._restore(saved)
        self._skipped += 1
        if self._skipped >= MAX_SKIPPED:
            raise self._error(why, f" ({self._skipped} batches in a row were skipped)")
        self._notice(f"{self._where()}: {why}; the batch is skipped and the step undone")
        return None

    def _where(self) -> str:
        state = self.context.state
        batch = state.batch_in_epoch  # the step's first batch (counted after the step)
        return f"step {state.step + 1} (epoch {state.epoch}, batch {batch})"

    def _error(self, why: str, more: str) -> NonFiniteLossError:
        state = self.context.state
        last = state.last_checkpoint
        if last is not None:
            kept = f"the last checkpoint, {last}, is finite"
            resume = "resume with resume_from='latest'"
        elif state.rank != 0:
            kept = "rank 0 writes the checkpoints and names the last one"
            resume = "resume with resume_from='latest'"
        else:
            kept = "no checkpoint was written before it"
            resume = "set checkpoint_every to keep finite checkpoints"
        return NonFiniteLossError(
            f"non-finite training at {self._where()}: {why}{more}; {kept}. HINT: lower the "
            f"learning rate, clip gradients (grad_clip=1.0) or check this batch's data, then "
            f"{resume}; on_nonfinite='skip' skips such batches, 'continue' goes on",
            step=state.step + 1,
            epoch=state.epoch,
            batch=state.batch_in_epoch,
            last_checkpoint=None if last is None else str(last),
        )

    def _notice(self, text: str) -> None:
        if self.context.state.rank == 0:
            notice(text)

    def _snapshot(self) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        loop = self.context.loop
        model = {k: v.detach().clone() for k, v in loop.model.state_dict().items()}
        return model, copy.deepcopy(loop.state_dict())

    def _restore(self, saved: tuple[dict[str, torch.Tensor], dict[str, Any]]) -> None:
        loop = self.context.loop
        with torch.no_grad():
            loop.model.load_state_dict(saved[0])
        loop.load_state_dict(saved[1])
        for p in loop.model.parameters():
            p.grad = None
