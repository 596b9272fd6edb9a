"""``Trainer``: checks everything it can, then runs the DDP loop or the LM loop.

The DDP loop (:mod:`._ddp`) averages gradients over W processes, ḡ = (1/W) Σ_r ∇L_r(θ)
(Li et al. 2020), so W processes of batch b follow one process of batch W·b; the LM loop
(:mod:`._lm`) takes one Levenberg-Marquardt step δ = (JᵀJ + λD)⁻¹ Jᵀr per batch
(Marquardt 1963) in one process. Both count optimizer steps (``max_iter``), cycling the
loader over epochs (:mod:`._loop`), and checkpoint, resume, validate, call callbacks and
report the same way.

``fit`` either trains in this process (plain, torchrun, one srun task per process, legate:
:mod:`._worker`) or spawns the training processes and takes the trained state back
(:mod:`._spawning`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from typing import Any, ClassVar

from torch import nn

from . import _distributed as pg
from ._config import TrainConfig
from ._ddp import check_torch_optimizer
from ._environments import LaunchEnvironment, TorchrunEnvironment, detect_environment
from ._errors import ConfigError
from ._lm import check_lma, check_single_process, is_lma
from ._logging import notice
from ._plan import RunPlan, plan_run
from ._resume import check_resume
from ._spawning import fit_spawn
from ._state import TrainerState
from ._worker import run_worker
from .optimize_step import optimize_step

_LOSSES: dict[str, Callable[[], nn.Module]] = {
    "mse": nn.MSELoss,
    "cross_entropy": nn.CrossEntropyLoss,
}


class Trainer:
    """Train ``model`` with ``optimizer`` (a torch optimizer, or an ``LMA``) under ``config``.

    ``loss_fn``: ``"mse"``, ``"cross_entropy"`` or a callable ``(outputs, targets) ->
    loss`` (or ``(loss, metrics)``). ``optimize_step``: the function that takes one step
    (default :func:`marquardt.trainer.optimize_step.optimize_step`).

    Everything that can be checked is checked here, before any work: the configuration
    against the machine (GPUs, launcher, tasks), the optimizer against the model, the loop
    against the process count.
    """

    use_grad: ClassVar[bool] = True
    #: The launcher's name in a spawned process (which has no environment object).
    _environment_name: str = "spawn"
    #: The seed of the run's sampler, stored in checkpoints (set when training starts).
    _sampler_seed: int = 0

    @classmethod
    def set_use_grad(cls, value: bool) -> None:
        """``True``: gradient loop with a torch optimizer; ``False``: the LM loop (an LMA)."""
        if not isinstance(value, bool):
            raise ConfigError(
                f"Trainer.set_use_grad({value!r}): expected True or False, got a "
                f"{type(value).__name__}. HINT: Trainer.set_use_grad(False) selects the LM loop"
            )
        cls.use_grad = value

    def __init__(
        self,
        model: nn.Module,
        optimizer: Any,
        config: TrainConfig | None = None,
        loss_fn: str | Callable[..., Any] = "mse",
        optimize_step: Callable[..., Any] = optimize_step,
    ) -> None:
        config = TrainConfig() if config is None else config
        if not isinstance(config, TrainConfig):
            raise ConfigError(
                f"Trainer(config={config!r}): expected a TrainConfig. "
                "HINT: Trainer(model, optimizer, TrainConfig(max_iter=100))"
            )
        if not isinstance(model, nn.Module):
            raise ConfigError(
                f"Trainer(model=...): expected a torch.nn.Module, got {type(model).__name__}. "
                "HINT: pass the network itself (a subclass of torch.nn.Module)"
            )
        if not any(p.requires_grad for p in model.parameters()):
            raise ConfigError(
                f"Trainer: the model ({type(model).__name__}) has no trainable parameters. "
                "HINT: check requires_grad, or that the layers are registered as submodules"
            )
        self.config = config
        self.model = model
        self.optimizer = optimizer
        self.is_lm = is_lma(optimizer)
        self.loss_fn = self._resolve_loss(loss_fn)
        if not callable(optimize_step):
            raise ConfigError(
                f"Trainer(optimize_step=...): expected a callable, got "
                f"{type(optimize_step).__name__}. HINT: pass a function (model, optimizer, "
                "loss_fn, batch, device, dtype) -> (loss, metrics), or leave the default"
            )
        self.optimize_step = optimize_step
        self._check_optimizer()
        self.gpu_count = pg.visible_gpu_count()
        self.compute = pg.resolve_compute(config, self.gpu_count)
        self.environment: LaunchEnvironment | None = detect_environment(
            os.environ, config.nprocs, self.gpu_count, self.compute.use_gpu
        )
        self.environment.validate()
        if self.is_lm:
            check_single_process(self.environment.name, self.environment.world_size)
        self.state = TrainerState()

    # ----------------------------------------------------------------- checks
    @staticmethod
    def _resolve_loss(loss_fn: str | Callable[..., Any]) -> Callable[..., Any]:
        if isinstance(loss_fn, str):
            if loss_fn not in _LOSSES:
                raise ConfigError(
                    f"Trainer(loss_fn={loss_fn!r}): unknown loss name. HINT: use one of "
                    f"{', '.join(map(repr, _LOSSES))}, or pass a callable (outputs, targets)"
                )
            return _LOSSES[loss_fn]()
        if not callable(loss_fn):
            raise ConfigError(
                f"Trainer(loss_fn={loss_fn!r}): expected a name or a callable. HINT: use one "
                f"of {', '.join(map(repr, _LOSSES))}, or a callable (outputs, targets) -> loss"
            )
        return loss_fn

    def _check_optimizer(self) -> None:
        if self.is_lm:
            check_lma(self.optimizer, self.model, self.config)
            return
        if not Trainer.use_grad:
            raise ConfigError(
                f"Trainer.set_use_grad(False) selects the LM loop, which needs an LMA, but the "
                f"optimizer is a {type(self.optimizer).__name__}. HINT: pass "
                "marquardt.solver.LMA(model, devices, residual_fn) (pip install "
                "marquardt-trainer[lm]), or call Trainer.set_use_grad(True)"
            )
        check_torch_optimizer(self.optimizer, self.model, self.config, self.optimize_step)

    @staticmethod
    def _check_loader(loader: Any, name: str) -> None:
        if loader is None:
            return
        if not isinstance(loader, Iterable):
            raise ConfigError(
                f"fit({name}=...): expected a DataLoader or an iterable of "
                f"batches, got {type(loader).__name__}. HINT: wrap the data in a DataLoader, "
                "e.g. DataLoader(TensorDataset(x, y), batch_size=16)"
            )
        try:
            size = len(loader)  # type: ignore[arg-type]
        except TypeError:
            return
        if size == 0:
            raise ConfigError(
                f"fit({name}=...): the loader yields no batches (len 0). HINT: check the "
                "dataset is not empty and that drop_last=True does not drop its only batch"
            )

    # ----------------------------------------------------------------- fit
    def fit(
        self, train_loader: Iterable[Any], val_loader: Iterable[Any] | None = None
    ) -> tuple[nn.Module, Any]:
        """Train; return the trained model and optimizer (in this process, also after a spawn).

        After SIGTERM the run writes a checkpoint and this call exits the program with
        status 0 (``SystemExit``); a restart with ``resume_from="latest"`` continues it.
        """
        self._check_loader(train_loader, "train_loader")
        self._check_loader(val_loader, "val_loader")
        env = self.environment
        assert env is not None
        if env.spawns:
            return fit_spawn(self, env, train_loader, val_loader)
        layout = env.layouts()[0]
        if layout.rank == 0:
            for text in self.compute.notices:
                notice(text)
        plan: RunPlan | None = None
        if layout.world_size == 1:
            plan = plan_run(self.config)
            check_resume(self, plan)
        run_worker(
            self,
            layout,
            plan,
            None,
            train_loader,
            val_loader,
            env_init=isinstance(env, TorchrunEnvironment),
        )
        if self.state.interrupted:
            raise SystemExit(0)
        return self.model, self.optimizer
