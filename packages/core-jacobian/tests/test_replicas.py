"""Replicas: binding to one flat vector, steps, backup and restore on every copy."""

from __future__ import annotations

import pytest
import torch
from jacobian_problems import make_problem
from torch import nn

from marquardt.jacobian import DeviceMismatchError, NoTrainableParametersError, Replicas
from marquardt.testing.models import flat


def test_flat_vector_excludes_frozen_and_keeps_buffers() -> None:
    problem = make_problem("frozen")
    replicas = Replicas(problem.model, ["cpu", "cpu"])
    trainable = [p for p in problem.model.parameters() if p.requires_grad]
    assert replicas.num_params == sum(p.numel() for p in trainable)
    assert replicas.names == ["0.bias", "2.weight", "2.bias"]
    assert replicas.model is problem.model
    bn = make_problem("batchnorm_eval")
    copies = Replicas(bn.model, ["cpu", "cpu"])
    torch.testing.assert_close(copies[1].module.bn.running_var, bn.model.bn.running_var)


def test_add_backup_restore_apply_to_every_replica() -> None:
    problem = make_problem("mlp")
    replicas = Replicas(problem.model, ["cpu", "cpu"])
    before = replicas.flat_params()
    replicas.backup()
    delta = torch.arange(replicas.num_params, dtype=torch.float32)
    replicas.add_(delta, alpha=-0.5)
    expected = before - 0.5 * delta.double()
    for i in range(len(replicas)):
        torch.testing.assert_close(replicas[i].flat, expected)
        module_flat = flat(replicas[i].module)
        torch.testing.assert_close(module_flat, expected)
    replicas.restore()
    for i in range(len(replicas)):
        torch.testing.assert_close(replicas[i].flat, before)
    torch.testing.assert_close(
        problem.model[0].weight.detach().reshape(-1), before[: problem.model[0].weight.numel()]
    )
    replicas.set_flat_params(expected)
    torch.testing.assert_close(replicas[1].flat, expected)
    assert replicas.flat_params().data_ptr() != replicas[0].flat.data_ptr()


def test_add_rejects_bad_vectors_without_change() -> None:
    replicas = Replicas(make_problem("mlp").model, ["cpu"])
    before = replicas.flat_params()
    with pytest.raises(ValueError, match="HINT"):
        replicas.add_(torch.ones(3))
    bad = torch.ones(replicas.num_params)
    bad[0] = float("nan")
    with pytest.raises(ValueError, match="NaN"):
        replicas.add_(bad)
    assert torch.equal(replicas.flat_params(), before)
    with pytest.raises(RuntimeError, match="backup"):
        Replicas(make_problem("mlp").model, ["cpu"]).restore()


def test_model_on_device_not_listed() -> None:
    model = make_problem("mlp").model
    with pytest.raises(DeviceMismatchError, match=r"the model is on cpu.*HINT: move the model"):
        Replicas(model, ["meta"])
    with pytest.raises(DeviceMismatchError, match="empty"):
        Replicas(model, [])


def test_no_trainable_parameters() -> None:
    model = nn.Linear(2, 1).requires_grad_(False)
    with pytest.raises(NoTrainableParametersError, match=r"no trainable parameter.*HINT"):
        Replicas(model, ["cpu"])
