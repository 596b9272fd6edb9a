"""``Trainer``: the facade that checks everything, picks the loop and the launch, builds the run.

The gradient loop (:mod:`._loops._gradient`) averages gradients over W processes,
ḡ = (1/W) Σ_r ∇L_r(θ) (Li et al. 2020), so W processes of batch b follow one process of
batch W·b; the LM loop (:mod:`._loops._lm`) takes one Levenberg-Marquardt step
δ = (JᵀJ + λD)⁻¹ Jᵀr per batch (Marquardt 1963) in one process. The runner
(:mod:`._loops._runner`) gives both the same schedule: steps over cycled epochs,
checkpoints, resume, validation, callbacks, reports.

``fit`` either trains in this process (plain, torchrun, one srun task per process, legate:
:mod:`._launch._worker`) or spawns the training processes, each of which builds its own
``Trainer`` from a picklable spec, and takes the trained state back
(:mod:`._launch._spawning`).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

from torch import nn

from . import _compute
from ._callbacks import Hooks
from ._config import TrainConfig
from ._data._sources import DataSource
from ._environments import LaunchEnvironment, detect_environment
from ._errors import ConfigError
from ._launch._spawning import fit_spawn
from ._launch._spec import OptimizerSpec, SchedulerSpec, WorkerSpec
from ._launch._worker import run_worker
from ._logging._base import notice
from ._loops._base import Loop
from ._loops._context import RunContext
from ._loops._gradient import GradientLoop
from ._loops._lm import LMLoop, build_lma, is_lma, is_lma_factory
from ._loops._schedule import LRSchedule, check_scheduler
from ._persistence import _files as ckpt
from ._persistence._handback import apply_result
from ._persistence._plan import RunPlan, plan_run
from ._persistence._run_state import check_checkpoint
from ._state import TrainerState
from .optimize_step import optimize_step

_LOSSES: dict[str, Callable[[], nn.Module]] = {
    "mse": nn.MSELoss,
    "cross_entropy": nn.CrossEntropyLoss,
}


class Trainer:
    """Train ``model`` with ``optimizer`` (a torch optimizer, or an ``LMA``) under ``config``.

    ``loss_fn``: ``"mse"``, ``"cross_entropy"`` or a callable ``(outputs, targets) ->
    loss`` (or ``(loss, metrics)``). ``optimize_step``: the function that takes one step
    (default [`optimize_step`][marquardt.trainer.optimize_step.optimize_step]). ``scheduler``: a
    ``torch.optim.lr_scheduler`` scheduler of ``optimizer`` (stepped as
    ``TrainConfig.scheduler_interval`` says; ``ReduceLROnPlateau`` after each validation).
    ``environment``: the launch environment; detected from the process's environment
    variables when not given.

    Everything that can be checked is checked here, before any work: the configuration
    against the machine (GPUs, launcher, tasks), the optimizer against the model, the loop
    against the process count.
    """

    use_grad: ClassVar[bool] = True

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
        *,
        scheduler: Any = None,
        environment: LaunchEnvironment | None = None,
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
        if not callable(optimize_step):
            raise ConfigError(
                f"Trainer(optimize_step=...): expected a callable, got "
                f"{type(optimize_step).__name__}. HINT: pass a function (model, optimizer, "
                "loss_fn, batch, device, dtype) -> (loss, metrics), or leave the default"
            )
        self.config = config
        self.model = model
        self.optimizer = optimizer
        self.loss_fn = self._resolve_loss(loss_fn)
        self.optimize_step = optimize_step
        self.loop = self._choose_loop()
        if scheduler is not None and self.loop.kind == "lm":
            raise ConfigError(
                "Trainer(scheduler=...) with an LMA: LM has no learning rate to schedule (its "
                "damping adapts itself). HINT: leave scheduler=None in the LM loop"
            )
        check_scheduler(scheduler, optimizer, config)
        self.scheduler = scheduler
        self.gpu_count = _compute.visible_gpu_count()
        self.compute = _compute.resolve_compute(config, self.gpu_count)
        self.environment = environment or detect_environment(
            os.environ, config.nprocs, self.gpu_count, self.compute.use_gpu
        )
        self.environment.validate()
        self.loop.check_world(self.environment.name, self.environment.world_size)
        self.state = TrainerState()

    @property
    def is_lm(self) -> bool:
        """Whether this trainer runs the LM loop."""
        return self.loop.kind == "lm"

    # ----------------------------------------------------------------- set-up
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

    def _choose_loop(self) -> Loop:
        """The LM loop for an LMA, else the gradient loop (``set_use_grad`` says which is meant)."""
        if is_lma(self.optimizer) or is_lma_factory(self.optimizer):
            return LMLoop(self.model, self.optimizer, self.config)
        if not Trainer.use_grad:
            raise ConfigError(
                f"Trainer.set_use_grad(False) selects the LM loop, which needs an LMA, but the "
                f"optimizer is a {type(self.optimizer).__name__}. HINT: pass "
                "marquardt.solver.LMA(model, devices, residual_fn) (pip install "
                "marquardt-trainer[lm]), or call Trainer.set_use_grad(True)"
            )
        return GradientLoop(
            self.model, self.optimizer, self.loss_fn, self.optimize_step, self.config
        )

    def run_context(self) -> RunContext:
        """This process's `RunContext` of the run (the parts get it, not the Trainer)."""
        return RunContext(
            config=self.config,
            state=self.state,
            loop=self.loop,
            hooks=Hooks(self.config.callbacks, owner=self),
            schedule=LRSchedule(self.scheduler, self.config),
            loss_fn=self.loss_fn,
            compute=self.compute,
            launcher=self.environment.name,
        )

    def _check_resume(self, plan: RunPlan) -> None:
        """The planned checkpoint fits this run, before any process or step starts."""
        if plan.resume is not None:
            path = Path(plan.resume)
            check_checkpoint(
                ckpt.read_checkpoint(path),
                path,
                self.model,
                self.loop.kind,
                self.loop.optimizer_name,
                self.config.callbacks,
            )

    # ----------------------------------------------------------------- fit
    def fit(
        self,
        train_loader: Any = None,
        val_loader: Any = None,
        *,
        train_dataset: Any = None,
        val_dataset: Any = None,
        batch_size: int | None = None,
        num_workers: int = 0,
        shuffle: bool = True,
        drop_last: bool = False,
    ) -> tuple[nn.Module, Any]:
        """Train; return the trained model and optimizer (in this process, also after a spawn).

        Data, at one of three levels: loaders (``fit(train_loader, val_loader)``); datasets
        with loader settings (``fit(train_dataset=ds, val_dataset=vs, batch_size=32,
        num_workers=1)``), from which each process builds its loaders, the training one
        with a ``DistributedSampler``; or dataset factories (``train_dataset=make_dataset``,
        a callable taking no argument), called inside each training process.

        After SIGTERM the run writes a checkpoint and this call exits the program with
        status 0 (``SystemExit``); a restart with ``resume_from="latest"`` continues it.
        """
        data = DataSource.from_fit(
            train_loader,
            val_loader,
            train_dataset,
            val_dataset,
            batch_size,
            num_workers,
            shuffle,
            drop_last,
        )
        env = self.environment
        layouts = env.layouts()
        if env.spawns or layouts[0].rank == 0:
            for text in self.compute.notices:
                notice(text)
        plan: RunPlan | None = None
        if env.spawns or env.world_size == 1:
            plan = plan_run(self.config)
            self._check_resume(plan)
        if env.spawns:
            assert plan is not None
            self._fit_spawn(env, layouts, plan, data)
        else:
            run_worker(self.run_context(), env, layouts[0], plan, data)
        if self.state.interrupted:
            raise SystemExit(0)
        return self.model, self.loop.optimizer

    def _fit_spawn(
        self, env: LaunchEnvironment, layouts: list[Any], plan: RunPlan, data: DataSource
    ) -> None:
        """Spawn the training processes; the caller's objects get rank 0's trained state."""
        spec = WorkerSpec(
            trainer_class=type(self),
            model=self.model,
            optimizer=self.optimizer
            if self.is_lm
            else OptimizerSpec.capture(self.optimizer, self.model),
            scheduler=None if self.scheduler is None else SchedulerSpec.capture(self.scheduler),
            config=self.config,
            loss_fn=self.loss_fn,
            optimize_step=self.optimize_step,
            data=data,
            plan=plan,
            result_path="",
            launcher=env.name,
            gpu_count=self.gpu_count,
            use_gpu=self.compute.use_gpu,
        )
        result = fit_spawn(spec, layouts)
        if self.is_lm:  # the caller gets an LMA of its own model (one process) with the state
            self.loop.optimizer = build_lma(self.optimizer, self.model, world_size=1)
        apply_result(
            result,
            self.model,
            self.loop.optimizer,
            self.scheduler,
            self.config.callbacks,
            self.state,
        )
        if self.is_lm:
            self.loop.optimizer.sync_replicas()
        if self.state.interrupted:
            notice(
                f"{env.name}: training stopped by SIGTERM at step {self.state.step}; the "
                "checkpoint is written, exiting with status 0 (resume with "
                "resume_from='latest')"
            )
