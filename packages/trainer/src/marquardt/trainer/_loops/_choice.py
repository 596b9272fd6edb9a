"""Which loop trains: chosen once from the optimizer (and perceptrain's ``use_grad``).

An ``LMA`` (or a factory of one) runs the LM loop, whatever ``use_grad`` says; a torch
optimizer runs the gradient loop; a nevergrad optimizer runs the gradient-free loop, which
``Trainer.set_use_grad(False)`` asks for, as in perceptrain. Mismatches (a torch optimizer
under ``use_grad=False``, a nevergrad one under ``use_grad=True``) are refused here, before
any work.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

from torch import nn

from .._config import TrainConfig
from .._errors import ConfigError
from ._base import Loop
from ._gradient import GradientLoop
from ._gradient_free import GradientFreeLoop, is_nevergrad_optimizer
from ._lm import LMLoop, is_lma, is_lma_factory


def choose_loop(
    model: nn.Module,
    optimizer: Any,
    loss_fn: Callable[..., Any],
    optimize_step: Callable[..., Any],
    config: TrainConfig,
    use_grad: bool,
) -> Loop:
    """The loop for ``optimizer``.

    **Raises:** ``ConfigError`` when the optimizer does not fit ``use_grad``.
    """
    if is_lma(optimizer) or (is_lma_factory(optimizer) and not is_nevergrad_optimizer(optimizer)):
        if not use_grad:
            warnings.warn(
                "Trainer.set_use_grad(False) means gradient-free training (nevergrad) as in "
                "perceptrain; the LM loop is chosen by passing an LMA, whatever use_grad "
                "says. HINT: call Trainer.set_use_grad(True)",
                UserWarning,
                stacklevel=4,
            )
        return LMLoop(model, optimizer, config)
    if not use_grad:
        if not is_nevergrad_optimizer(optimizer):
            raise ConfigError(
                f"Trainer.set_use_grad(False) trains gradient-free with a nevergrad "
                f"optimizer, but the optimizer is a {type(optimizer).__name__}. HINT: pass "
                "nevergrad.optimizers.NGOpt(parametrization=n_params, budget=max_iter), "
                "or call Trainer.set_use_grad(True) for a torch optimizer or an LMA"
            )
        return GradientFreeLoop(model, optimizer, loss_fn, config)
    if is_nevergrad_optimizer(optimizer):
        raise ConfigError(
            f"Trainer: a nevergrad optimizer ({type(optimizer).__name__}) needs "
            "gradient-free training. HINT: call Trainer.set_use_grad(False) first, or use "
            "trainer.disable_grad_opt(optimizer)"
        )
    return GradientLoop(model, optimizer, loss_fn, optimize_step, config)
