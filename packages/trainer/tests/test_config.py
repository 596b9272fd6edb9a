"""TrainConfig validation, backend and compute resolution, settings."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

from marquardt.trainer import (
    ConfigError,
    EarlyStopping,
    ExperimentTrackingTool,
    LaunchError,
    TrainConfig,
    _config_rules,
    _settings,
)
from marquardt.trainer._compute import resolve_compute


def test_defaults_are_perceptrains_and_serialisable() -> None:
    config = TrainConfig()
    assert config.trackers == ("tensorboard",)
    assert config.tracking_tool is ExperimentTrackingTool.TENSORBOARD
    assert (config.max_iter, config.print_every, config.write_every, config.val_every) == (
        10_000,
        0,
        0,
        0,
    )
    assert (config.compute_setup, config.backend, config.log_setup) == ("cpu", "gloo", "cpu")
    assert config.root_folder == Path("./qml_logs") and config.log_folder == Path("./")
    assert (config.val_epsilon, config.batch_size, config.plotting_functions) == (1e-5, 1, ())
    plain = config.to_dict()
    assert plain["nprocs"] == 1 and plain["callbacks"] == []


def test_a_plain_perceptrain_config_warns_nothing() -> None:
    """max_iter and the periods count epochs, as in perceptrain; setting them is no cause
    for a warning (none of ours is given for perceptrain's own fields)."""
    _config_rules._warned.clear()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        TrainConfig(max_iter=50, print_every=5, write_every=5, checkpoint_every=10, val_every=5)


@pytest.mark.parametrize("rule", _config_rules.FIELD_RULES, ids=lambda r: r.field)
def test_every_field_rule_refuses_a_foreign_value_with_its_message(rule: Any) -> None:
    """The checks of single fields are data: each rule refuses what fits no field, saying
    what was asked, what it needs and a HINT."""
    with pytest.raises(ConfigError) as caught:
        TrainConfig(**{rule.field: object()})
    assert str(caught.value).startswith(f"TrainConfig({rule.field}=<object object at ")
    assert str(caught.value).endswith(f"): {rule.need}. HINT: {rule.hint}")


@pytest.mark.parametrize(
    ("kwargs", "pattern"),
    [
        ({"nprocs": 0}, r"nprocs=0\): nprocs must be a whole number >= 1\. HINT"),
        ({"nprocs": 1.5}, r"nprocs must be a whole number"),
        ({"nprocs": True}, r"nprocs must be a whole number"),
        ({"max_iter": -1}, r"max_iter must be a whole number >= 0"),
        ({"plot_every": -1}, r"plot_every must be a whole number >= 0"),
        ({"batch_size": 0}, r"batch_size must be a whole number >= 1"),
        ({"val_epsilon": -1.0}, r"val_epsilon must be a finite number >= 0"),
        ({"validation_criterion": 3}, r"validation_criterion must be a function or None"),
        ({"log_setup": "gpu"}, r"log_setup must be one of cpu, auto"),
        ({"plotting_functions": (1,)}, r"plotting_functions must be a tuple of functions"),
        ({"print_every": -1}, r"print_every must be a whole number >= 0\. HINT: use 0"),
        ({"checkpoint_every": -5}, r"checkpoint_every must be"),
        ({"accumulate_grad_batches": 0}, r"accumulate_grad_batches must be"),
        ({"backend": "tcp"}, r"backend='tcp'\): backend must be one of auto, nccl, gloo, mpi"),
        ({"compute_setup": "tpu"}, r"compute_setup must be one of cpu, gpu, auto"),
        (
            {"backend": "nccl", "compute_setup": "cpu"},
            r"NCCL only moves CUDA tensors.*HINT: use "
            r"backend='gloo'",
        ),
        ({"dtype": torch.int32}, r"dtype must be a floating-point torch.dtype"),
        ({"dtype": "float128"}, r"a dtype name must be one of"),
        ({"tracking_tool": "wandb"}, r"unknown: 'wandb'"),
        ({"grad_clip": 0.0}, r"grad_clip must be a finite number > 0"),
        ({"grad_clip": float("nan")}, r"grad_clip must be"),
        ({"dist_timeout": 0}, r"dist_timeout must be a positive number of seconds"),
        ({"seed": -1}, r"seed must be a whole number >= 0"),
        ({"slice_size": 0}, r"slice_size must be a whole number >= 1"),
        ({"callbacks": [object()]}, r"callbacks must be a list of marquardt.trainer.Callback"),
        ({"root_folder": ""}, r"root_folder must be a non-empty path"),
        ({"resume_from": 3}, r"resume_from must be None, 'latest' or a checkpoint path"),
        ({"verbose": "yes"}, r"verbose must be True or False"),
        ({"hyperparams": {1: 2}}, r"hyperparams must be a dict with string keys"),
    ],
)
def test_bad_values_fail_at_construction(kwargs: dict[str, object], pattern: str) -> None:
    with pytest.raises(ConfigError, match=pattern):
        TrainConfig(**kwargs)  # type: ignore[arg-type]


def test_good_values_are_normalised() -> None:
    config = TrainConfig(
        dtype="float64", tracking_tool=["CSV", "tensorboard"], callbacks=(EarlyStopping(),)
    )  # type: ignore[arg-type]
    assert config.dtype is torch.float64
    assert config.trackers == ("csv", "tensorboard")
    assert isinstance(config.callbacks, list)
    assert TrainConfig(tracking_tool=None).trackers == ()


def test_auto_on_a_cpu_machine_falls_back_to_gloo_with_a_notice() -> None:
    compute = resolve_compute(TrainConfig(backend="nccl", compute_setup="auto"), gpu_count=0)
    assert (compute.use_gpu, compute.backend) == (False, "gloo")
    assert any("replaced by 'gloo'" in n for n in compute.notices)
    quiet = resolve_compute(TrainConfig(backend="gloo"), gpu_count=0)
    assert quiet.notices == () and quiet.backend == "gloo"


def test_auto_with_gpus_picks_nccl() -> None:
    compute = resolve_compute(TrainConfig(compute_setup="auto", backend="auto"), gpu_count=2)
    assert (compute.use_gpu, compute.backend) == (True, "nccl")
    assert resolve_compute(TrainConfig(compute_setup="cpu"), gpu_count=2).backend == "gloo"


@pytest.mark.parametrize("backend", ["nccl", "auto", "gloo"])
def test_gpu_without_gpus_is_an_error_with_a_hint(backend: str) -> None:
    with pytest.raises(LaunchError, match=r"compute_setup='gpu'\) but no GPU is visible.*HINT"):
        resolve_compute(TrainConfig(compute_setup="gpu", backend=backend), gpu_count=0)


def test_early_stopping_arguments() -> None:
    with pytest.raises(ValueError, match="patience must be a whole number >= 1"):
        EarlyStopping(patience=0)
    with pytest.raises(ValueError, match="mode must be 'min' or 'max'"):
        EarlyStopping(mode="up")


def test_settings_lists_every_variable_it_reads() -> None:
    with pytest.raises(KeyError):
        _settings.get("HOME", {})
    assert _settings.get("SLURM_PROCID", {"SLURM_PROCID": " 3 "}) == "3"
    assert _settings.get("SLURM_PROCID", {"SLURM_PROCID": ""}) is None
    assert _settings.dist_timeout_override({"MARQUARDT_TRAINER_DIST_TIMEOUT": "12"}) == 12.0
    with pytest.raises(ValueError, match="not a positive number of seconds"):
        _settings.dist_timeout_override({"MARQUARDT_TRAINER_DIST_TIMEOUT": "-1"})
