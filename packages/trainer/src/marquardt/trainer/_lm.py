"""The LM loop's own parts: recognising an LMA, one LM step per batch, checks, replicas.

Each batch is one Levenberg-Marquardt step (Levenberg 1944, Marquardt 1963),
δ = (JᵀJ + λD)⁻¹ Jᵀr, taken by ``marquardt.solver.LMA``: no backward pass, and the step
report's damping λ, attempts and acceptance become the step's metrics. The run stops when
LM terminates (the MINPACK tests ``gtol``, ``ftol``, ``xtol`` of Moré 1978, or the
damping at ``damping_max``), with the report's reason. LM's data parallelism lives inside
``LMA`` (slices on several devices), so the loop runs in one process.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from torch import nn

from ._callbacks import run_hook
from ._config import TrainConfig
from ._errors import ConfigError
from .optimize_step import _split

if TYPE_CHECKING:
    from ._trainer import Trainer


def _lma_class() -> type | None:
    """``marquardt.solver.LMA`` if the ``lm`` extra is installed (imported lazily)."""
    try:
        from marquardt.solver import LMA
    except ImportError:
        return None
    return LMA


def is_lma(obj: Any) -> bool:
    """Whether ``obj`` is a ``marquardt.solver.LMA`` (False when the solver is absent)."""
    cls = _lma_class()
    return cls is not None and isinstance(obj, cls)


def check_lma(lma: Any, model: nn.Module, config: TrainConfig) -> None:
    """The LM loop runs in one process, on the model the LMA was built for."""
    if config.nprocs > 1:
        raise ConfigError(
            f"TrainConfig(nprocs={config.nprocs}) with an LMA: the LM loop runs in one "
            "process. HINT: set nprocs=1; LM is data-parallel inside LMA (pass several "
            "devices to LMA(model, devices, residual_fn))"
        )
    if getattr(lma, "model", model) is not model:
        raise ConfigError(
            "Trainer(model, lma): the LMA was built for another model object. HINT: "
            "pass the model given to LMA(model, ...)"
        )


def check_single_process(launcher: str, world_size: int) -> None:
    """A launcher that started several processes cannot run the LM loop."""
    if world_size > 1:
        raise ConfigError(
            f"the LM loop runs in one process but {launcher} starts "
            f"{world_size}. HINT: LM is data-parallel inside LMA: give it "
            "several devices (LMA(model, devices, ...)) and launch one process"
        )


def lm_step(trainer: Trainer, batches: Iterator[Any]) -> tuple[float, dict[str, float]]:
    """One LM step on the next batch; sets ``should_stop`` when LM terminates."""
    state = trainer.state
    batch = next(batches)
    run_hook(trainer, "on_batch_start", batch)
    inputs, targets = _split(batch)
    slice_size = trainer.config.slice_size
    if slice_size is not None:
        # A loader's last batch may be shorter than the configured slice; LMA refuses a
        # slice larger than its batch, so the slice shrinks to that batch.
        slice_size = min(slice_size, len(inputs))
    loss, terminated = trainer.optimizer.step(inputs, targets, slice_size)
    report = getattr(trainer.optimizer, "report", None)
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


def sync_lma_replicas(lma: Any) -> None:
    """Copy the (just loaded) source model's parameters to LMA's other replicas.

    ``load_state_dict`` writes into the source model, whose trainable parameters are views
    of its replica's flat vector; replicas on other devices still hold the old values.
    """
    lma.sync_replicas()
