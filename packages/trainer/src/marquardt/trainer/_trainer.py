"""``Trainer``: perceptrain 0.1.0's trainer, over our DDP and LM loops and launchers.

The facade checks everything, picks the loop (``_loops._choice``) and the launch, builds
the run. Which loop runs is decided by the optimizer: a ``marquardt.solver.LMA`` (or a
factory of one) runs the LM loop (``_loops._lm``), one Levenberg-Marquardt step
δ = (JᵀJ + λD)⁻¹ Jᵀr per batch (Marquardt 1963); a torch optimizer runs the gradient loop (``_loops._gradient``),
whose W processes average their gradients, ḡ = (1/W) Σ_r ∇L_r(θ) (Li et al. 2020).
``Trainer.set_use_grad(False)`` is perceptrain's gradient-free training with a nevergrad
optimizer. The runner (``_loops._runner``) gives every loop perceptrain's schedule:
epochs of batches, stages with hook methods and callbacks, validation, checkpoints.

``fit`` either trains in this process (plain, torchrun, one srun task per process, legate:
``_launch._worker``) or spawns the training processes, each of which builds its own
``Trainer`` from a picklable spec, and takes the trained state back
(``_launch._spawning``).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any, ClassVar

import torch
from torch import nn

from marquardt.devices import choose_threads

from . import _compute
from ._callbacks._base import CallbacksManager, TrainingStage
from ._callbacks._dispatch import StageDispatch
from ._config import TrainConfig
from ._data._sources import DataSource
from ._environments import LaunchEnvironment, detect_environment
from ._errors import ConfigError
from ._hooks import TrainerHooks
from ._launch._spawning import train_spawned
from ._launch._spec import SchedulerSpec, WorkerSpec
from ._launch._worker import run_worker
from ._logging._base import notice
from ._loops._base import Loop
from ._loops._choice import choose_loop
from ._loops._context import RunContext
from ._loops._lm import LMLoop
from ._loops._torch_lr_scheduler import LRSchedule
from ._loops._validation import run_test
from ._loss import resolve_loss
from ._persistence import _files as ckpt
from ._persistence._helpers import FolderCheckpoints
from ._persistence._plan import RunPlan, plan_run
from ._persistence._run_state import check_checkpoint
from ._result import LossMetrics, OptimizeResult
from ._state import TrainerState
from ._trainer_checks import as_loader, check_arguments
from .optimize_step import optimize_step


class Trainer(TrainerHooks):
    """Train ``model`` with ``optimizer`` under ``config`` (perceptrain's ``Trainer``).

    A subclass overrides perceptrain's hooks (``on_train_start``, ``on_train_epoch_end
    (results)``, ...), called in every training process around the stages' callbacks.
    During and after ``fit``: ``opt_result``, ``current_epoch``, ``global_step``
    (optimizer steps taken), ``training_stage``, ``callback_manager`` (the run's callbacks
    and its ``writer``, perceptrain's writer API over our loggers: ``writer.run`` is the
    MLflow run); ``stop_training()`` says whether a stop was asked
    (``trainer._stop_training.fill_(1)`` asks, as perceptrain's callbacks do).

    Arguments:
        model: the model to train (an ``nn.Module`` with trainable parameters).
        optimizer: a ``torch.optim.Optimizer`` (gradient loop, DDP over processes), a
            ``marquardt.solver.LMA`` or a factory ``make_lma(model, process_group)`` (the
            LM loop), a nevergrad optimizer with ``Trainer.set_use_grad(False)``
            (gradient-free), or ``None`` (given later with ``enable_grad_opt`` /
            ``disable_grad_opt``).
        config: the run's configuration; ``None``: ``TrainConfig()``.
        loss_fn: ``"mse"``, ``"cross_entropy"``, ``loss_fn(batch, model) -> (loss,
            metrics)`` (perceptrain's form: the second parameter named ``model`` or
            annotated ``nn.Module``; ``batch`` is ``None`` without data), or a criterion
            ``(outputs, targets) -> loss`` (any other function, or an ``nn.Module`` loss).
        train_dataloader: the default training data of ``fit`` (a tuple of tensors
            becomes a loader of ``config.batch_size``).
        val_dataloader: the default validation data, likewise.
        test_dataloader: the default data of ``test``, likewise.
        optimize_step: ``optimize_step(model, optimizer, loss_fn, xs, device, dtype)``,
            one step; default [`optimize_step`][marquardt.trainer.optimize_step.optimize_step].
        max_batches: at most this many batches per epoch; ``None``: every batch.
        scheduler: ours: a ``torch.optim.lr_scheduler`` scheduler of ``optimizer``,
            stepped as ``TrainConfig.scheduler_interval`` says.
        environment: ours: the launch environment (default: detected from ``os.environ``).

    Raises:
        ConfigError: before any work: a bad ``config``, ``model``, ``loss_fn``,
            ``optimize_step`` or ``max_batches``, a function where a loader belongs, or an
            optimizer that does not fit ``use_grad``, the model or the process count.
        LaunchError: before any work: ``compute_setup='gpu'`` without a visible GPU, or a
            configuration that does not fit the launch (``environment.validate``).
    """

    _use_grad: ClassVar[bool] = True

    @classmethod
    def set_use_grad(cls, value: bool) -> None:
        """``True``: gradient-based training (or LM with an LMA); ``False``: gradient-free
        training with a nevergrad optimizer, as in perceptrain."""
        if not isinstance(value, bool):
            raise TypeError("use_grad must be a boolean value.")
        cls._use_grad = value

    def __init__(
        self,
        model: nn.Module,
        optimizer: Any,
        config: TrainConfig | None = None,
        loss_fn: str | Callable[..., Any] = "mse",
        train_dataloader: Any = None,
        val_dataloader: Any = None,
        test_dataloader: Any = None,
        optimize_step: Callable[..., Any] = optimize_step,
        max_batches: int | None = None,
        *,
        scheduler: Any = None,
        environment: LaunchEnvironment | None = None,
    ) -> None:
        config = check_arguments(config, model, optimize_step, max_batches)
        self.config = config
        self.model = model
        self.loss_fn = resolve_loss(loss_fn)
        self.optimize_step = optimize_step
        self.max_batches = max_batches
        self.train_dataloader = as_loader(train_dataloader, config.batch_size, "train_dataloader")
        self.val_dataloader = as_loader(val_dataloader, config.batch_size, "val_dataloader")
        self.test_dataloader = as_loader(test_dataloader, config.batch_size, "test_dataloader")
        self.scheduler = scheduler
        self.state = TrainerState()
        self.opt_result: OptimizeResult | None = None
        self.training_stage = TrainingStage.IDLE
        self._stop_training = torch.tensor(0, dtype=torch.int)
        self._context: RunContext | None = None
        #: perceptrain's ``trainer.callback_manager``: the run's callbacks by stage and its
        #: ``writer``. Before ``fit`` it holds ``config.callbacks`` and no writer; from the
        #: start of ``fit`` (in the training process) it is the run's own manager, with the
        #: configuration's built-in callbacks and the run's writer, kept after ``fit``.
        self.callback_manager = CallbacksManager(config.callbacks, config, None)
        #: Where SaveCheckpoint / SaveBestCheckpoint write when called outside ``fit``.
        self.folder_checkpoints = FolderCheckpoints(self)
        self._optimizer: Any = None
        self.loop: Loop | None = None
        self.gpu_count = _compute.visible_gpu_count()
        self.compute = _compute.resolve_compute(config, self.gpu_count)
        self.environment = environment or detect_environment(
            os.environ, config.nprocs, self.gpu_count, self.compute.use_gpu
        )
        self.environment.validate()
        self.optimizer = optimizer

    # ----------------------------------------------------------------- perceptrain's state
    @property
    def use_grad(self) -> bool:
        """Gradient-based (``True``) or gradient-free (``False``) training."""
        return self._use_grad

    @use_grad.setter
    def use_grad(self, value: bool) -> None:
        if not isinstance(value, bool):
            raise TypeError("use_grad must be an True or False.")
        self._use_grad = value  # type: ignore[misc]

    @property
    def optimizer(self) -> Any:
        """The optimizer (the LMA a factory built, once ``fit`` has run)."""
        return self._optimizer

    @optimizer.setter
    def optimizer(self, optimizer: Any) -> None:
        """Set the optimizer and choose its loop, checked against the model and the world."""
        self._optimizer = optimizer
        self.loop = (
            None
            if optimizer is None
            else choose_loop(
                self.model, optimizer, self.loss_fn, self.optimize_step, self.config, self.use_grad
            )
        )
        if self.loop is not None:
            self.loop.check_scheduler(self.scheduler, self.config)
            self.loop.check_world(self.environment.name, self.environment.world_size)

    @property
    def current_epoch(self) -> int:
        """The epoch the run is in (or ended last)."""
        return self.state.current_epoch

    @property
    def global_step(self) -> int:
        """The optimizer steps taken so far (over every ``fit`` that resumed this run)."""
        return self.state.step

    @property
    def accelerator(self) -> Any:
        """perceptrain's ``trainer.accelerator``, read-only: ``rank``, ``world_size``,
        ``local_rank`` of this process."""
        state = self.state
        return SimpleNamespace(
            rank=state.rank, world_size=state.world_size, local_rank=state.local_rank
        )

    @property
    def is_lm(self) -> bool:
        """Whether this trainer runs the LM loop."""
        return isinstance(self.loop, LMLoop)

    def stop_training(self) -> bool:
        """Whether a stop was asked (by a callback, ``_stop_training``, or the run)."""
        return bool(int(self._stop_training.max()) > 0 or self.state.should_stop)

    # ----------------------------------------------------------------- set-up
    @contextmanager
    def enable_grad_opt(self, optimizer: Any = None) -> Iterator[None]:
        """Within the block: gradient-based training with ``optimizer`` (default: the
        trainer's); the mode and optimizer are restored after it."""
        with self._grad_mode(True, optimizer):
            yield

    @contextmanager
    def disable_grad_opt(self, optimizer: Any = None) -> Iterator[None]:
        """Within the block: gradient-free training with the nevergrad ``optimizer``."""
        with self._grad_mode(False, optimizer):
            yield

    @contextmanager
    def _grad_mode(self, use_grad: bool, optimizer: Any) -> Iterator[None]:
        had_own = "_use_grad" in self.__dict__
        original_mode, original_optimizer = self.use_grad, self._optimizer
        try:
            self.use_grad = use_grad
            self.optimizer = optimizer if optimizer is not None else original_optimizer
            yield
        finally:
            if had_own:
                self.use_grad = original_mode
            else:
                self.__dict__.pop("_use_grad", None)
            self.optimizer = original_optimizer

    def run_context(self) -> RunContext:
        """This process's `RunContext` of the run (the parts get it, not the Trainer)."""
        loop = self._require_loop()
        return RunContext(
            config=self.config,
            state=self.state,
            loop=loop,
            callbacks=list(self.config.callbacks),
            owner=self,
            schedule=LRSchedule(self.scheduler, self.config),
            loss_fn=self.loss_fn,
            compute=self.compute,
            launcher=self.environment.name,
            max_batches=self.max_batches,
        )

    def _attach(self, context: RunContext, train_loader: Any, val_loader: Any) -> None:
        """In the training process, before the first stage: what callbacks read."""
        self._context = context
        self._run_optimizer = context.loop.optimizer
        self.callback_manager = context.stages.manager
        if train_loader is not None:
            self.train_dataloader = train_loader
        if val_loader is not None:
            self.val_dataloader = val_loader
        self.config.log_folder = context.folder
        self.opt_result = OptimizeResult(self.state.current_epoch, self.model, self.optimizer)

    def _require_loop(self) -> Loop:
        if self.loop is None:
            raise ConfigError(
                "Trainer: no optimizer. HINT: pass one to Trainer(model, optimizer, ...) or "
                "train inside `with trainer.enable_grad_opt(optimizer):`"
            )
        return self.loop

    def _check_resume(self, plan: RunPlan) -> None:
        """The planned checkpoint fits this run, before any process or step starts."""
        if plan.resume is not None:
            loop = self._require_loop()
            path = Path(plan.resume)
            check_checkpoint(
                ckpt.read_checkpoint(path),
                path,
                self.model,
                loop.kind,
                loop.optimizer_name,
                self.config.callbacks,
            )

    # ----------------------------------------------------------------- fit, test
    def fit(
        self,
        train_dataloader: Any = None,
        val_dataloader: Any = None,
        *,
        train_dataset: Any = None,
        val_dataset: Any = None,
        batch_size: int | None = None,
        num_workers: int = 0,
        shuffle: bool = True,
        drop_last: bool = False,
    ) -> tuple[nn.Module, Any]:
        """Train; return the trained model and optimizer (in this process, also after a spawn).

        Data: the loaders given here, else the trainer's own (``Trainer(...,
        train_dataloader=...)``), else none (``loss_fn(None, model)``: a model that computes
        its own loss). Ours beside: datasets with loader settings (``fit(train_dataset=ds,
        val_dataset=vs, batch_size=32, num_workers=1)``; ``batch_size`` defaults to
        ``config.batch_size``), from which each process builds its loaders, the training one
        with a ``DistributedSampler``, or dataset factories (``train_dataset=make_dataset``,
        a callable taking no argument), called inside each training process.

        After SIGTERM the run writes a checkpoint and this call exits the program with
        status 0 (``SystemExit``); a restart with ``resume_from="latest"`` continues it.
        """
        loop = self._require_loop()
        if train_dataloader is not None:
            self.train_dataloader = as_loader(
                train_dataloader, self.config.batch_size, "train_dataloader"
            )
        if val_dataloader is not None:
            self.val_dataloader = as_loader(
                val_dataloader, self.config.batch_size, "val_dataloader"
            )
        by_dataset = train_dataset is not None
        data = DataSource.from_fit(
            None if by_dataset else self.train_dataloader,
            None if by_dataset else self.val_dataloader,
            train_dataset,
            val_dataset,
            self.config.batch_size if by_dataset and batch_size is None else batch_size,
            num_workers,
            shuffle,
            drop_last,
        )
        if self.config.val_every and data.val is None:
            raise ConfigError(
                f"TrainConfig(val_every={self.config.val_every}) but there is no validation "
                "data. HINT: pass val_dataloader=... (to Trainer or fit), or set val_every=0"
            )
        self._stop_training.fill_(0)
        if self.state.step or self.state.epoch:
            # fit again: epochs 0..max_iter once more from the model and optimizer as they
            # are (perceptrain's meaning), in a run of its own
            self.state = TrainerState()
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
        self.training_stage = TrainingStage.IDLE
        return self.model, loop.optimizer

    def test(self, test_dataloader: Any = None) -> list[LossMetrics]:
        """Evaluate the model on every batch of ``test_dataloader`` (default: the trainer's),
        in this process, with the ``test_batch_*`` hooks and callbacks; the batches'
        ``(loss, {"test_loss": ..., "test_<metric>": ...})``."""
        if test_dataloader is not None:
            self.test_dataloader = as_loader(
                test_dataloader, self.config.batch_size, "test_dataloader"
            )
        stages = StageDispatch(
            self, CallbacksManager(self.config.callbacks, self.config, None), self.state
        )
        try:
            device = next(self.model.parameters()).device
        except StopIteration:
            device = torch.device("cpu")
        dtype = self.config.torch_dtype if self.loop is None else self.loop.dtype
        return run_test(
            stages, self.loss_fn, self.model, self.test_dataloader, device, dtype, self.max_batches
        )

    def _fit_spawn(
        self, env: LaunchEnvironment, layouts: list[Any], plan: RunPlan, data: DataSource
    ) -> None:
        """Spawn the training processes; the caller's objects get rank 0's trained state."""
        loop = self._require_loop()
        spec = WorkerSpec(
            trainer_class=type(self),
            model=self.model,
            optimizer=loop.portable_optimizer(),
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
            use_grad=self.use_grad,
            max_batches=self.max_batches,
            threads=choose_threads(
                layouts[0].local_world_size, self.config.threads_per_process, env.name
            ),
        )
        result = train_spawned(spec, layouts, loop, self.scheduler, self.state)
        self.config.log_folder = Path(plan.folder)
        if result is not None:
            self.opt_result = result
