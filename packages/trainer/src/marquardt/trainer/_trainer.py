"""``Trainer``: the data-parallel (DDP) loop and the Levenberg-Marquardt loop.

DDP loop (Li et al. 2020, "PyTorch Distributed"): every process holds a replica of the
model and takes its own share of each global batch; the backward pass averages the
gradients, ḡ = (1/W) Σ_r ∇L_r(θ), so every replica takes the same optimizer step and the
replicas stay identical. With equal per-rank batches and a mean loss, ḡ is the gradient
of the mean loss over the global batch: W processes of batch b follow the same path as
one process of batch W·b.

LM loop: each batch is one Levenberg-Marquardt step (Levenberg 1944, Marquardt 1963),
δ = (JᵀJ + λD)⁻¹ Jᵀr taken by ``marquardt.solver.LMA``, whose damping, attempts and
acceptance are logged; no backward pass, and training stops when LM terminates. LM's data
parallelism lives inside ``LMA`` (slices on several devices), so the loop runs in one
process.

Both loops count optimizer steps (``max_iter``), cycling the loader over epochs; both
checkpoint, resume, validate, call callbacks and report the same way.
"""

from __future__ import annotations

import inspect
import os
import pickle
import random
import shutil
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import torch
import torch.multiprocessing as mp
from torch import nn

from . import _checkpoint as ckpt
from . import _distributed as pg
from . import _settings
from ._config import TrainConfig
from ._data import prepare_loader
from ._environments import (
    LaunchEnvironment,
    ProcessLayout,
    TorchrunEnvironment,
    detect_environment,
)
from ._errors import CheckpointMismatchError, ConfigError, WorkerFailedError
from ._logging import RunLogger, notice
from ._signals import GracefulStop, SignalForwarder, exit_with_parent
from .optimize_step import _accumulate_step, _split, optimize_step

#: Exit status of a spawned process that stopped because a peer died (not the culprit).
PEER_FAILED_EXIT = 75
_LOSSES: dict[str, Callable[[], nn.Module]] = {
    "mse": nn.MSELoss,
    "cross_entropy": nn.CrossEntropyLoss,
}


def _lma_class() -> type | None:
    """``marquardt.solver.LMA`` if the ``lm`` extra is installed (imported lazily)."""
    try:
        from marquardt.solver import LMA
    except ImportError:
        return None
    return LMA


def is_lma(obj: Any) -> bool:
    cls = _lma_class()
    return cls is not None and isinstance(obj, cls)


@dataclass
class TrainerState:
    """Where the run is; read by callbacks (``trainer.state``)."""

    step: int = 0
    epoch: int = 0
    batch_in_epoch: int = 0
    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    should_stop: bool = False
    stop_reason: str = ""
    interrupted: bool = False
    metrics: dict[str, float] = field(default_factory=dict)
    val_metrics: dict[str, float] = field(default_factory=dict)
    best_val: float | None = None
    log_folder: Path | None = None
    last_checkpoint: Path | None = None

    @property
    def is_global_zero(self) -> bool:
        return self.rank == 0


@dataclass(frozen=True)
class RunPlan:
    """What every rank must agree on before training: folder, checkpoint, sampler seed."""

    folder: str
    resume: str | None
    sampler_seed: int


@dataclass
class _OptimizerSpec:
    """A torch optimizer as class, hyper-parameters and state, rebuilt around a model copy."""

    cls: type
    defaults: dict[str, Any]
    groups: list[tuple[list[int], dict[str, Any]]]
    state: dict[str, Any]

    @classmethod
    def capture(cls, optimizer: torch.optim.Optimizer, model: nn.Module) -> _OptimizerSpec:
        index = {id(p): i for i, p in enumerate(model.parameters())}
        groups = [
            (
                [index[id(p)] for p in group["params"]],
                {k: v for k, v in group.items() if k != "params"},
            )
            for group in optimizer.param_groups
        ]
        return cls(type(optimizer), dict(optimizer.defaults), groups, optimizer.state_dict())

    def build(self, model: nn.Module) -> torch.optim.Optimizer:
        params = list(model.parameters())
        groups = [{"params": [params[i] for i in idx], **hp} for idx, hp in self.groups]
        try:
            optimizer = self.cls(groups, **self.defaults)
        except TypeError:
            optimizer = self.cls(groups)
        optimizer.load_state_dict(self.state)
        return optimizer


@dataclass
class _SpawnPayload:
    model: nn.Module
    optimizer: _OptimizerSpec
    config: TrainConfig
    loss_fn: Any
    optimize_step: Any
    train_loader: Any
    val_loader: Any
    plan: RunPlan
    result_path: str
    use_gpu: bool
    backend: str
    gpu_count: int
    environment_name: str


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)
    try:
        import numpy as np

        np.random.seed(seed)
    except ImportError:
        pass


def _run_name() -> str:
    job = _settings.get("SLURM_JOB_ID")
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return f"run_{stamp}" + (f"_job{job}" if job else "")


def plan_run(config: TrainConfig) -> RunPlan:
    """Choose the run folder and the checkpoint to resume from (raises if it is missing)."""
    root = Path(config.root_folder)
    if config.log_folder is not None:
        folder = Path(config.log_folder)
    elif config.create_subfolder_per_run:
        folder = root / _run_name()
    else:
        folder = root
    resume = config.resume_from
    restarts = _settings.get_int("SLURM_RESTART_COUNT") or 0
    if resume is None and restarts > 0:
        notice(
            f"Slurm requeued this job ({restarts} restart(s)): resuming from the latest "
            "checkpoint (resume_from=None means 'latest' in a requeued job)"
        )
        resume = "latest"
    path: Path | None = None
    if resume == "latest":
        path = ckpt.find_latest(folder, root)
        if path is not None and config.log_folder is None and config.create_subfolder_per_run:
            folder = path.parent.parent  # continue in the run folder that was interrupted
    elif resume is not None:
        path = Path(resume)
        ckpt.read_checkpoint(path)  # missing or unreadable: fail now, before any work
    seed = config.seed if config.seed is not None else random.SystemRandom().randrange(2**31)
    return RunPlan(str(folder), None if path is None else str(path), seed)


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

    @classmethod
    def set_use_grad(cls, value: bool) -> None:
        """``True``: gradient loop with a torch optimizer; ``False``: the LM loop (an LMA)."""
        if not isinstance(value, bool):
            raise ConfigError(f"Trainer.set_use_grad({value!r}): expected True or False")
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
                f"Trainer(model=...): expected a torch.nn.Module, got {type(model).__name__}"
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
            raise ConfigError("Trainer(optimize_step=...): expected a callable")
        self.optimize_step = optimize_step
        self._check_optimizer()
        self.gpu_count = pg.visible_gpu_count()
        self.compute = pg.resolve_compute(config, self.gpu_count)
        self.environment: LaunchEnvironment | None = detect_environment(
            os.environ, config.nprocs, self.gpu_count, self.compute.use_gpu
        )
        self.environment.validate()
        if self.is_lm and self.environment.world_size > 1:
            raise ConfigError(
                f"the LM loop runs in one process but {self.environment.name} starts "
                f"{self.environment.world_size}. HINT: LM is data-parallel inside LMA: give it "
                "several devices (LMA(model, devices, ...)) and launch one process"
            )
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
            raise ConfigError(f"Trainer(loss_fn={loss_fn!r}): expected a name or a callable")
        return loss_fn

    def _check_optimizer(self) -> None:
        cfg = self.config
        if self.is_lm:
            if cfg.nprocs > 1:
                raise ConfigError(
                    f"TrainConfig(nprocs={cfg.nprocs}) with an LMA: the LM loop runs in one "
                    "process. HINT: set nprocs=1; LM is data-parallel inside LMA (pass several "
                    "devices to LMA(model, devices, residual_fn))"
                )
            if getattr(self.optimizer, "model", self.model) is not self.model:
                raise ConfigError(
                    "Trainer(model, lma): the LMA was built for another model object. HINT: "
                    "pass the model given to LMA(model, ...)"
                )
            return
        if not Trainer.use_grad:
            raise ConfigError(
                f"Trainer.set_use_grad(False) selects the LM loop, which needs an LMA, but the "
                f"optimizer is a {type(self.optimizer).__name__}. HINT: pass "
                "marquardt.solver.LMA(model, devices, residual_fn) (pip install "
                "marquardt-trainer[lm]), or call Trainer.set_use_grad(True)"
            )
        if not isinstance(self.optimizer, torch.optim.Optimizer):
            hint = (
                "install the lm extra (pip install marquardt-trainer[lm]) for LMA"
                if type(self.optimizer).__name__ == "LMA"
                else "e.g. torch.optim.SGD(model.parameters(), lr=0.01)"
            )
            raise ConfigError(
                f"Trainer(optimizer=...): expected a torch.optim.Optimizer or a "
                f"marquardt.solver.LMA, got {type(self.optimizer).__name__}. HINT: {hint}"
            )
        own = {id(p) for p in self.model.parameters()}
        foreign = sum(
            1 for g in self.optimizer.param_groups for p in g["params"] if id(p) not in own
        )
        if foreign:
            raise ConfigError(
                f"the optimizer holds {foreign} parameter(s) that are not the model's. HINT: "
                "build it from this model, e.g. SGD(model.parameters(), lr=0.01)"
            )
        custom_step = self.optimize_step is not optimize_step
        if cfg.accumulate_grad_batches > 1:
            if isinstance(self.optimizer, torch.optim.LBFGS):
                raise ConfigError(
                    "accumulate_grad_batches > 1 with LBFGS: L-BFGS re-evaluates the loss inside "
                    "its step, which needs every batch at once. HINT: use a larger batch_size "
                    "instead, or accumulate_grad_batches=1"
                )
            if custom_step:
                raise ConfigError(
                    "accumulate_grad_batches > 1 with a custom optimize_step: the trainer "
                    "accumulates with its own step. HINT: accumulate inside your optimize_step "
                    "and keep accumulate_grad_batches=1"
                )
        if cfg.grad_clip is not None and custom_step:
            params = inspect.signature(self.optimize_step).parameters
            if "grad_clip" not in params and not any(
                p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()
            ):
                raise ConfigError(
                    "TrainConfig.grad_clip is set but the custom optimize_step takes no "
                    "grad_clip argument. HINT: add a keyword argument grad_clip=None to it, or "
                    "clip inside it and leave grad_clip=None"
                )

    @staticmethod
    def _check_loader(loader: Any, name: str) -> None:
        if loader is None:
            return
        if not isinstance(loader, Iterable):
            raise ConfigError(
                f"fit({name}=...): expected a DataLoader or an iterable of "
                f"batches, got {type(loader).__name__}"
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
            return self._fit_spawn(env, train_loader, val_loader)
        layout = env.layouts()[0]
        if layout.rank == 0:
            for text in self.compute.notices:
                notice(text)
        plan: RunPlan | None = None
        if layout.world_size == 1:
            plan = plan_run(self.config)
            self._precheck_resume(plan)
        self._run_worker(
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

    def _precheck_resume(self, plan: RunPlan) -> None:
        """Check the checkpoint fits the model before any process or step starts."""
        if plan.resume is None:
            return
        path = Path(plan.resume)
        data = ckpt.read_checkpoint(path)
        ckpt.check_fits(data, path, self.model, self._kind, self._optimizer_class)

    @property
    def _kind(self) -> str:
        return "lm" if self.is_lm else "ddp"

    @property
    def _optimizer_class(self) -> str:
        return type(self.optimizer).__name__

    # ----------------------------------------------------------------- spawn
    def _fit_spawn(
        self, env: LaunchEnvironment, train_loader: Any, val_loader: Any
    ) -> tuple[nn.Module, Any]:
        for text in self.compute.notices:
            notice(text)
        plan = plan_run(self.config)
        self._precheck_resume(plan)
        layouts = env.layouts()
        workdir = tempfile.mkdtemp(prefix="marquardt-spawn-")
        result_path = os.path.join(workdir, "result.pt")
        payload = _SpawnPayload(
            model=self.model,
            optimizer=_OptimizerSpec.capture(self.optimizer, self.model),
            config=self.config,
            loss_fn=self.loss_fn,
            optimize_step=self.optimize_step,
            train_loader=train_loader,
            val_loader=val_loader,
            plan=plan,
            result_path=result_path,
            use_gpu=self.compute.use_gpu,
            backend=self.compute.backend,
            gpu_count=self.gpu_count,
            environment_name=env.name,
        )
        try:
            # Plain pickle copies tensors (torch's own reducer would share the caller's
            # storage with every child, which would then all write to it).
            data = pickle.dumps(payload, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as exc:
            shutil.rmtree(workdir, ignore_errors=True)
            raise ConfigError(
                f"{env.name}: the model, optimizer, loss, callbacks and loaders are sent to "
                f"{len(layouts)} new processes, but one of them cannot be pickled "
                f"({type(exc).__name__}: {exc}). HINT: define functions and classes at module "
                "level (no lambdas or local classes), and keep the training code under "
                "if __name__ == '__main__':"
            ) from exc
        try:
            self._join_spawned(data, layouts)
            result = torch.load(result_path, map_location="cpu", weights_only=True)
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
        # The caller's objects get the trained state (rank 0's, identical on every rank).
        self.model.load_state_dict(result["model"])
        self.optimizer.load_state_dict(result["optimizer"])
        self.state.step = int(result["step"])
        self.state.stop_reason = str(result.get("stop_reason", ""))
        self.state.interrupted = bool(result["interrupted"])
        if self.state.interrupted:
            notice(
                f"{env.name}: training stopped by SIGTERM at step {self.state.step}; the "
                "checkpoint is written, exiting with status 0 (resume with "
                "resume_from='latest')"
            )
            raise SystemExit(0)
        return self.model, self.optimizer

    def _join_spawned(self, data: bytes, layouts: list[ProcessLayout]) -> None:
        context = mp.start_processes(
            _spawn_entry,
            args=(data, layouts),
            nprocs=len(layouts),
            join=False,
            start_method="spawn",
        )
        forwarder = SignalForwarder(lambda: [p.pid for p in context.processes if p.is_alive()])
        forwarder.install()
        try:
            while not context.join(timeout=0.5):
                pass
        except (mp.ProcessRaisedException, mp.ProcessExitedException) as exc:
            raise self._spawn_failure(context, layouts, exc) from None
        finally:
            forwarder.uninstall()
            for process in context.processes:
                if process.is_alive():
                    process.kill()
                    process.join(5)

    @staticmethod
    def _spawn_failure(
        context: Any, layouts: list[ProcessLayout], exc: Exception
    ) -> WorkerFailedError:
        codes = {layouts[i].rank: p.exitcode for i, p in enumerate(context.processes)}
        index = getattr(exc, "error_index", 0)
        culprit = layouts[index].rank
        # Prefer a process that died on its own (a signal it did not get from us, or an
        # error) over one that only stopped because its peer was gone.
        for i, code in sorted(codes.items()):
            if code not in (0, None, PEER_FAILED_EXIT, -15):
                culprit = i
                break
        code = codes.get(culprit)
        if isinstance(code, int) and code < 0:
            import signal as _signal

            try:
                how = f"was killed by signal {_signal.Signals(-code).name}"
            except ValueError:
                how = f"was killed by signal {-code}"
        else:
            how = f"exited with status {code}"
        detail = ""
        if isinstance(exc, mp.ProcessRaisedException):
            detail = f"\n--- traceback of rank {layouts[index].rank} ---\n{exc}"
        return WorkerFailedError(
            f"spawn: rank {culprit} {how}; the other training processes were stopped "
            f"(exit statuses by rank: {codes}). HINT: rank {culprit}'s output above says why; "
            f"a kill by SIGKILL is often the out-of-memory killer{detail}",
            rank=culprit,
        )

    # ----------------------------------------------------------------- worker
    def _run_worker(
        self,
        layout: ProcessLayout,
        plan: RunPlan | None,
        result_path: str | None,
        train_loader: Any,
        val_loader: Any,
        env_init: bool,
    ) -> None:
        state = self.state
        state.rank, state.local_rank = layout.rank, layout.local_rank
        state.world_size = layout.world_size
        stop = GracefulStop(f"rank {layout.rank}")
        stop.install()
        try:
            if self.config.seed is not None:
                _seed_everything(self.config.seed)
            if self.compute.use_gpu and not self.is_lm:
                index = (
                    self.environment.device_index(layout)
                    if self.environment is not None
                    else layout.local_rank % max(self.gpu_count, 1)
                )
                torch.cuda.set_device(index)
                state.device = torch.device("cuda", index)
            elif self.is_lm:
                state.device = next(self.model.parameters()).device
            else:
                state.device = torch.device("cpu")
            if layout.world_size > 1:
                pg.init_process_group(
                    layout, self.compute.backend, pg.timeout_seconds(self.config), env_init
                )
            try:
                agreed = self._agree_plan(plan)
                self._train(layout, agreed, stop, train_loader, val_loader, result_path)
            except Exception as exc:
                if layout.world_size > 1 and pg.is_collective_failure(exc):
                    pg.abandon_after_peer_failure(layout.rank, exc, PEER_FAILED_EXIT)
                raise
        finally:
            stop.uninstall()
            pg.destroy_process_group()

    def _agree_plan(self, plan: RunPlan | None) -> RunPlan:
        """Rank 0's plan on every rank (an error on rank 0 is raised on every rank)."""
        outcome: tuple[str, Any] | None = None
        if self.state.rank == 0:
            try:
                outcome = ("ok", plan if plan is not None else plan_run(self.config))
            except Exception as exc:
                outcome = ("error", exc)
        outcome = pg.broadcast_object(outcome)
        assert outcome is not None
        if outcome[0] == "error":
            raise outcome[1]
        return outcome[1]

    def _train(
        self,
        layout: ProcessLayout,
        plan: RunPlan,
        stop: GracefulStop,
        train_loader: Any,
        val_loader: Any,
        result_path: str | None,
    ) -> None:
        cfg, state = self.config, self.state
        model = self.model
        if not self.is_lm:
            model.to(device=state.device)
            if cfg.torch_dtype is not None:
                model.to(dtype=cfg.torch_dtype)
        folder = Path(plan.folder)
        state.log_folder = folder
        data = None
        if plan.resume is not None:
            path = Path(plan.resume)
            data = ckpt.read_checkpoint(path)
            ckpt.check_fits(data, path, model, self._kind, self._optimizer_class)
            self._load_state(data)
        steps = pg.all_gather_object(state.step)
        if len(set(steps)) > 1:
            raise CheckpointMismatchError(
                f"the ranks resumed at different steps ({dict(enumerate(steps))}). HINT: every "
                "rank must see the same checkpoint folder (a shared file system), or pass "
                "resume_from=<path> explicitly"
            )
        sampler_seed = int(data["sampler_seed"]) if data is not None else plan.sampler_seed
        net: nn.Module = model
        if layout.world_size > 1:
            device_ids = [state.device.index] if state.device.type == "cuda" else None
            net = nn.parallel.DistributedDataParallel(model, device_ids=device_ids)
        loader, sampler = prepare_loader(train_loader, layout.rank, layout.world_size, sampler_seed)
        if data is not None:
            self._restore_rng(data, layout)
        logger = RunLogger(cfg, folder, layout.rank == 0, state.step, self._describe(layout))
        if data is not None:
            logger.message(
                f"resumed from {plan.resume} at step {state.step} (epoch "
                f"{state.epoch}, batch {state.batch_in_epoch})"
            )
        self._sampler_seed = sampler_seed
        try:
            self._loop(net, loader, sampler, val_loader, logger, stop, folder)
        finally:
            logger.close()
        if result_path is not None:
            ckpt.atomic_save(
                {
                    "model": ckpt.bare_state_dict(model),
                    "optimizer": self.optimizer.state_dict(),
                    "step": state.step,
                    "interrupted": state.interrupted,
                    "stop_reason": state.stop_reason,
                },
                result_path,
            )

    def _describe(self, layout: ProcessLayout) -> str:
        where = (
            self.environment.name
            if self.environment is not None
            else getattr(self, "_environment_name", "spawn")
        )
        loop = "LM loop" if self.is_lm else f"DDP loop ({self.compute.backend})"
        return (
            f"{loop}, {where}, world size {layout.world_size}, device {self.state.device}, "
            f"{self.config.max_iter} steps"
        )

    # ----------------------------------------------------------------- loop
    def _batches(self, loader: Any, sampler: Any) -> Iterator[Any]:
        """Batches forever, epoch after epoch, from the position in ``self.state``."""
        state = self.state
        batch_size = getattr(loader, "batch_size", None) or 1
        while True:
            if sampler is not None:
                sampler.set_epoch(state.epoch)
                sampler.skip_next(state.batch_in_epoch * batch_size)
            # Making an iterator draws a seed from the global RNG; fork it so the RNG stream
            # (dropout, ...) does not depend on where an epoch, or a resume, begins.
            with torch.random.fork_rng(devices=[]):
                iterator = iter(loader)
            skipped = 0
            if sampler is None:
                for _ in range(state.batch_in_epoch):  # resume without a resumable sampler
                    next(iterator, None)
                    skipped += 1
            fresh = state.batch_in_epoch == 0
            if fresh:
                self._call("on_epoch_start", state.epoch)
            produced = False
            for batch in iterator:
                produced = True
                state.batch_in_epoch += 1
                yield batch
            if fresh and not produced:
                raise ConfigError(
                    "the training loader yielded no batch in a whole epoch. HINT: check the "
                    "dataset is not empty (and, with several processes, has at least one "
                    "batch per process)"
                )
            self._call("on_epoch_end", state.epoch)
            state.epoch += 1
            state.batch_in_epoch = 0

    def _call(self, hook: str, *args: Any) -> None:
        for callback in self.config.callbacks:
            getattr(callback, hook)(self, *args)

    def _step(self, net: nn.Module, batches: Iterator[Any]) -> tuple[float, dict[str, float]]:
        cfg, state = self.config, self.state
        if self.is_lm:
            batch = next(batches)
            self._call("on_batch_start", batch)
            inputs, targets = _split(batch)
            loss, terminated = self.optimizer.step(inputs, targets, cfg.slice_size)
            report = getattr(self.optimizer, "report", None)
            metrics: dict[str, float] = {}
            for name in ("damping", "attempts", "accepted"):
                value = getattr(report, name, None)
                if isinstance(value, int | float | bool):
                    metrics[name] = float(value)
            if terminated:
                state.should_stop = True
                reason = getattr(report, "reason", "") or getattr(report, "termination", "")
                state.stop_reason = f"LM terminated: {reason}".rstrip(": ")
            return float(loss), metrics
        count = cfg.accumulate_grad_batches
        group = [next(batches) for _ in range(count)]
        self._call("on_batch_start", group[0] if count == 1 else group)
        extra = {} if cfg.grad_clip is None else {"grad_clip": cfg.grad_clip}
        if count == 1:
            loss_t, raw = self.optimize_step(
                net, self.optimizer, self.loss_fn, group[0], state.device, cfg.torch_dtype, **extra
            )
        else:
            loss_t, raw = _accumulate_step(
                net, self.optimizer, self.loss_fn, group, state.device, cfg.torch_dtype, **extra
            )
        return float(loss_t), {k: float(v) for k, v in raw.items()}

    def _loop(
        self,
        net: nn.Module,
        loader: Any,
        sampler: Any,
        val_loader: Any,
        logger: RunLogger,
        stop: GracefulStop,
        folder: Path,
    ) -> None:
        cfg, state = self.config, self.state
        batches = self._batches(loader, sampler)
        self._call("on_train_start")
        saved_at = -1
        net.train()
        while state.step < cfg.max_iter:
            loss, metrics = self._step(net, batches)
            state.step += 1
            state.metrics = {"loss": loss, **metrics}
            self._call("on_batch_end", loss, metrics)
            last = state.step == cfg.max_iter
            due_print = cfg.verbose and (
                (cfg.print_every and state.step % cfg.print_every == 0) or last
            )
            due_write = bool(cfg.write_every and state.step % cfg.write_every == 0) or last
            if due_print or due_write:
                shown = (
                    pg.mean_over_ranks(state.metrics, state.device)
                    if cfg.all_reduce_metrics
                    else state.metrics
                )
                if due_print:
                    logger.print_line(state.step, state.epoch, shown)
                if due_write:
                    logger.write(state.step, state.epoch, shown)
            logger.progress(state.step, state.metrics)
            if val_loader is not None and cfg.val_every and state.step % cfg.val_every == 0:
                self._validate(val_loader, logger, folder)
            interrupted, wants_stop = pg.flags_any(
                [stop.requested, state.should_stop], state.device
            )
            if interrupted:
                state.interrupted = True
                state.stop_reason = state.stop_reason or "SIGTERM"
            if wants_stop and not state.should_stop:
                state.should_stop = True
                state.stop_reason = state.stop_reason or "another rank asked to stop"
            if (cfg.checkpoint_every and state.step % cfg.checkpoint_every == 0) or interrupted:
                self._save(folder)
                saved_at = state.step
            if interrupted or state.should_stop:
                break
        if val_loader is not None and cfg.val_every and state.step % cfg.val_every != 0:
            self._validate(val_loader, logger, folder)
        if saved_at != state.step:
            self._save(folder)
        if state.interrupted:
            logger.message(
                f"SIGTERM: stopped after step {state.step}; checkpoint "
                f"{state.last_checkpoint} written. Restart with "
                "resume_from='latest' to continue"
            )
        elif state.should_stop:
            logger.message(f"stopped at step {state.step}: {state.stop_reason}")
        self._call("on_train_end")

    def _validate(self, val_loader: Any, logger: RunLogger, folder: Path) -> None:
        """Mean loss over the whole validation loader, on every rank (no communication)."""
        state = self.state
        self._call("on_validation_start")
        model = self.model
        was_training = model.training
        model.eval()
        device = state.device
        total, count = 0.0, 0
        extra: dict[str, float] = {}
        with torch.no_grad(), torch.random.fork_rng(devices=[]):
            for batch in val_loader:
                inputs, targets = _split(batch)
                if not self.is_lm:
                    inputs = inputs.to(device=device, dtype=self.config.torch_dtype or inputs.dtype)
                    targets = targets.to(
                        device=device,
                        dtype=(
                            self.config.torch_dtype
                            if targets.is_floating_point() and self.config.torch_dtype
                            else targets.dtype
                        ),
                    )
                else:
                    inputs, targets = inputs.to(device), targets.to(device)
                output = self.loss_fn(model(inputs), targets)
                loss, metrics = output if isinstance(output, tuple) else (output, {})
                size = int(inputs.shape[0]) if hasattr(inputs, "shape") else 1
                total += float(loss) * size
                count += size
                for key, value in metrics.items():
                    extra[f"val_{key}"] = extra.get(f"val_{key}", 0.0) + float(value) * size
        model.train(was_training)
        results = {"val_loss": total / max(count, 1)}
        results.update({k: v / max(count, 1) for k, v in extra.items()})
        state.val_metrics = results
        logger.write(state.step, state.epoch, results, phase="val")
        logger.print_line(state.step, state.epoch, results, phase="val")
        if state.best_val is None or results["val_loss"] < state.best_val:
            state.best_val = results["val_loss"]
            if state.rank == 0:
                ckpt.atomic_save(
                    self._payload([ckpt.rng_state()]), folder / ckpt.CHECKPOINT_DIR / "best.pt"
                )
        self._call("on_validation_end", results)

    # ----------------------------------------------------------------- checkpoints
    def _payload(self, rngs: list[Any]) -> dict[str, Any]:
        state = self.state
        return {
            "format": ckpt.FORMAT,
            "version": ckpt.VERSION,
            "kind": self._kind,
            "step": state.step,
            "epoch": state.epoch,
            "batch_in_epoch": state.batch_in_epoch,
            "model": ckpt.bare_state_dict(self.model),
            "model_signature": ckpt.model_signature(self.model),
            "optimizer": None if self.is_lm else self.optimizer.state_dict(),
            "lma": self.optimizer.state_dict() if self.is_lm else None,
            "optimizer_class": self._optimizer_class,
            "rng": rngs,
            "sampler_seed": getattr(self, "_sampler_seed", 0),
            "best_val": state.best_val,
            "world_size": state.world_size,
            "config": _plain(self.config.to_dict()),
            "torch_version": str(torch.__version__),
        }

    def _save(self, folder: Path) -> None:
        rngs = pg.all_gather_object(ckpt.rng_state())  # every rank's RNG, for exact resume
        if self.state.rank != 0:
            return
        directory = folder / ckpt.CHECKPOINT_DIR
        path = ckpt.atomic_save(
            self._payload(rngs), directory / ckpt.checkpoint_name(self.state.step)
        )
        ckpt.prune(directory, self.config.keep_checkpoints)
        self.state.last_checkpoint = path

    def _load_state(self, data: dict[str, Any]) -> None:
        state = self.state
        self.model.load_state_dict(ckpt.strip_prefixes(data["model"]))
        if self.is_lm:
            self.optimizer.load_state_dict(data["lma"])
            _sync_lma_replicas(self.optimizer)
        else:
            self.optimizer.load_state_dict(data["optimizer"])
        state.step = int(data["step"])
        state.epoch = int(data["epoch"])
        state.batch_in_epoch = int(data["batch_in_epoch"])
        state.best_val = data.get("best_val")

    def _restore_rng(self, data: dict[str, Any], layout: ProcessLayout) -> None:
        rngs = data.get("rng") or []
        if not rngs:
            return
        same_world = len(rngs) == layout.world_size
        ckpt.set_rng_state(rngs[layout.rank] if same_world else rngs[0])


def _sync_lma_replicas(lma: Any) -> None:
    """Copy the (just loaded) source model's parameters to LMA's other replicas.

    ``load_state_dict`` writes into the source model, whose trainable parameters are views
    of its replica's flat vector; replicas on other devices still hold the old values.
    """
    replicas = getattr(lma, "_replicas", None)
    if replicas is None or len(replicas) < 2:
        return
    source = replicas[getattr(replicas, "_source_index", 0)]
    replicas.set_flat_params(source.flat.detach().clone())
    replicas.sync_buffers()


def _plain(value: Any) -> Any:
    """Configuration values reduced to what ``torch.load(weights_only=True)`` accepts."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return repr(value)


def _spawn_entry(index: int, data: bytes, layouts: list[ProcessLayout]) -> None:
    """A spawned training process: rebuild the trainer from the payload and train."""
    exit_with_parent()
    payload: _SpawnPayload = pickle.loads(data)
    trainer = Trainer.__new__(Trainer)
    trainer.config = payload.config
    trainer.model = payload.model
    trainer.optimizer = payload.optimizer.build(payload.model)
    trainer.is_lm = False
    trainer.loss_fn = payload.loss_fn
    trainer.optimize_step = payload.optimize_step
    trainer.gpu_count = payload.gpu_count
    trainer.compute = pg.Compute(use_gpu=payload.use_gpu, backend=payload.backend)
    trainer.environment = None
    trainer.state = TrainerState()
    trainer._environment_name = payload.environment_name
    layout = layouts[index]
    # A lost peer ends this process inside _run_worker with PEER_FAILED_EXIT, which tells
    # the parent this rank is not the culprit.
    trainer._run_worker(
        layout,
        payload.plan,
        payload.result_path if index == 0 else None,
        payload.train_loader,
        payload.val_loader,
        env_init=False,
    )
