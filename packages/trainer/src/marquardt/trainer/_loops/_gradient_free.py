"""``GradientFreeLoop``: a nevergrad optimizer, one ask/tell per batch, in one process.

perceptrain's gradient-free training (``Trainer.set_use_grad(False)`` with a nevergrad
optimizer, Rapin & Teytaud 2018, "Nevergrad - A gradient-free optimization platform").
The model is a function of θ ∈ ℝᴾ, its trainable parameters as one vector
(``marquardt.trainer._parameters``); the optimizer proposes θ and learns from the loss
at θ, without gradients. Each batch is one step:

    L = loss_fn(batch, model)          at the θ the model holds
    optimizer.tell(candidate, L)       the candidate whose θ the model holds
    candidate = optimizer.ask()        the next θ to try
    model ← candidate.value

The first candidate is θ₀, the model's parameters when the loop is made, told to
nevergrad as a point it did not ask for. As in perceptrain the optimizer's ``budget`` is
set to ``max_iter`` (a run tells it more often, once per batch of every epoch; nevergrad
accepts that), the loss reported for a step is the loss before the step's ``ask``, and
after the last step the model holds the last candidate asked, which was not evaluated;
``optimizer.recommend().value`` is the best θ seen, for
``set_parameters``.

Nevergrad is the optional extra ``marquardt-trainer[nevergrad]``, imported only when a
gradient-free run is made. A checkpoint holds the optimizer and its candidate pickled
together (nevergrad's own format, as perceptrain's ``optimizer.dump``): read only
checkpoints you trust.
"""

from __future__ import annotations

import io
import pickle
import sys
from collections.abc import Callable, Mapping
from types import ModuleType
from typing import Any

import torch
from torch import nn

from .._config import TrainConfig
from .._errors import ConfigError
from .._loss import loss_and_metrics
from .._parameters import get_parameters, num_parameters, set_parameters
from ..optimize_step import _to
from ._base import StepResult, gpu_or_cpu, place
from ._torch_lr_scheduler import check_scheduler

#: The extra that installs nevergrad, named in every error about it.
EXTRA_HINT = "pip install 'marquardt-trainer[nevergrad]'"


def require_nevergrad() -> ModuleType:
    """``nevergrad``, or ``ConfigError`` saying how to install it."""
    try:
        import nevergrad
    except ImportError as exc:
        raise ConfigError(
            f"gradient-free training (Trainer.set_use_grad(False)) needs nevergrad, which is "
            f"not installed ({exc}). HINT: {EXTRA_HINT}"
        ) from exc
    return nevergrad


def is_nevergrad_optimizer(obj: Any) -> bool:
    """Whether ``obj`` is a nevergrad optimizer (False, without importing it, if it is absent).

    An object can only be a nevergrad optimizer once nevergrad has been imported, so the
    check looks in ``sys.modules`` and never imports nevergrad itself.
    """
    base = sys.modules.get("nevergrad.optimization.base")
    return base is not None and isinstance(obj, base.Optimizer)


def check_nevergrad_optimizer(optimizer: Any, model: nn.Module) -> None:
    """``optimizer`` is a nevergrad optimizer over a vector of the model's parameter count."""
    if not is_nevergrad_optimizer(optimizer):
        hint = (
            "pass the optimizer of the gradient loop with Trainer.set_use_grad(True)"
            if isinstance(optimizer, torch.optim.Optimizer)
            else "e.g. nevergrad.optimizers.NGOpt(parametrization=num_parameters(model), "
            f"budget=config.max_iter) ({EXTRA_HINT})"
        )
        raise ConfigError(
            "Trainer.set_use_grad(False) trains without gradients and needs a nevergrad "
            f"optimizer, got {type(optimizer).__name__}. An LMA selects the LM loop by "
            f"itself, under either setting. HINT: {hint}"
        )
    expected = num_parameters(model)
    dimension = getattr(optimizer, "dimension", expected)
    if dimension != expected:
        raise ConfigError(
            f"the nevergrad optimizer searches a space of dimension {dimension} but the model "
            f"has {expected} trainable parameters. HINT: build it with "
            "parametrization=num_parameters(model)"
        )


class GradientFreeLoop:
    """Gradient-free training: one nevergrad ask/tell per batch (see the module's docstring)."""

    kind = "nevergrad"

    def __init__(
        self,
        model: nn.Module,
        optimizer: Any,
        loss_fn: Callable[..., Any],
        config: TrainConfig,
    ) -> None:
        nevergrad = require_nevergrad()
        check_nevergrad_optimizer(optimizer, model)
        self.model = model
        self.optimizer = optimizer
        self.loss_fn = loss_fn
        self.dtype = config.torch_dtype
        optimizer.budget = config.max_iter
        optimizer.enable_pickling()
        theta = get_parameters(model).detach().to("cpu", torch.float64).numpy()
        self.candidate: Any = nevergrad.p.Array(init=theta)

    @property
    def optimizer_name(self) -> str:
        return type(self.optimizer).__name__

    def describe(self, backend: str) -> str:
        return f"gradient-free loop (nevergrad {self.optimizer_name})"

    def check_world(self, launcher: str, world_size: int) -> None:
        if world_size > 1:
            raise ConfigError(
                f"gradient-free training runs in one process, but this run has {world_size} "
                f"({launcher}): each would ask nevergrad for its own candidates and the "
                "replicas would part. HINT: run it with nprocs=1 (and no torchrun or srun "
                "for more than one task)"
            )

    def check_scheduler(self, scheduler: Any, config: TrainConfig) -> None:
        check_scheduler(scheduler, self.optimizer, config)

    def portable_optimizer(self) -> Any:
        """The nevergrad optimizer, pickled whole (a run of one process never spawns)."""
        return self.optimizer

    def pick_device(self, use_gpu: bool, gpu_index: Callable[[], int]) -> torch.device:
        return gpu_or_cpu(use_gpu, gpu_index)

    def setup(self, device: torch.device, world_size: int) -> None:
        place(self.model, device, self.dtype)

    def train(self) -> None:
        self.model.train()

    def teardown(self) -> None:
        """Nothing holds a process group."""

    @property
    def batches_per_step(self) -> int:
        return 1

    def prepare_batch(self, batch: Any, device: torch.device) -> Any:
        """Tensors of ``batch`` on ``device``; floating ones in the training dtype."""
        return _to(batch, device, self.dtype)

    def step(self, group: list[Any], device: torch.device) -> StepResult:
        """Evaluate the current candidate on the batch, tell it, ask and load the next."""
        (batch,) = group
        loss, metrics = loss_and_metrics(self.loss_fn(batch, self.model))
        value = float(loss.detach()) if isinstance(loss, torch.Tensor) else float(loss)
        self.optimizer.tell(self.candidate, value)
        self.candidate = self._ask()
        set_parameters(self.model, torch.as_tensor(self.candidate.value))
        return StepResult(
            value, {k: float(torch.as_tensor(v).detach()) for k, v in metrics.items()}
        )

    def _ask(self) -> Any:
        """``optimizer.ask()``; nevergrad's known clash with NumPy made readable."""
        try:
            return self.optimizer.ask()
        except TypeError as exc:
            if "0-dimensional arrays" not in str(exc):
                raise
            import numpy

            raise ConfigError(
                f"{self.optimizer_name}.ask() failed inside nevergrad: {exc}. Its meta-model "
                "(used by NGOpt and its variants) converts a one-element array with float(), "
                f"which NumPy {numpy.__version__} refuses. HINT: choose an optimizer without "
                "the meta-model, e.g. nevergrad.optimizers.OnePlusOne or CMA"
            ) from exc

    def state_dict(self) -> dict[str, Any]:
        """The optimizer and its current candidate, pickled together into a byte tensor."""
        buffer = io.BytesIO()
        pickle.dump((self.optimizer, self.candidate), buffer)
        data = torch.frombuffer(bytearray(buffer.getvalue()), dtype=torch.uint8)
        return {"optimizer": None, "lma": None, "nevergrad": data}

    def load_state_dict(self, entries: Mapping[str, Any]) -> None:
        """Take back the optimizer and candidate (the loop's ``optimizer`` is the restored one)."""
        data = entries.get("nevergrad")
        if not isinstance(data, torch.Tensor):
            raise ConfigError(
                "the checkpoint holds no nevergrad optimizer state. HINT: resume a "
                "gradient-free run from a checkpoint of a gradient-free run"
            )
        optimizer, candidate = pickle.loads(data.numpy().tobytes())
        if type(optimizer) is not type(self.optimizer):
            raise ConfigError(
                f"the checkpoint's nevergrad optimizer is a {type(optimizer).__name__}, this "
                f"run's a {self.optimizer_name}. HINT: resume with the same optimizer class"
            )
        self.optimizer, self.candidate = optimizer, candidate
