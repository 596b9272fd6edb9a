"""Smoke checks of one installed marquardt wheel, run by ``nox -s install_wheels``.

Run with the interpreter of a fresh virtual environment that holds only the wheel under
test and its declared dependencies, from a folder outside the repository, so every
import resolves to the installed files:

    python wheel_smoke.py WHEEL_FILE_NAME [EXTRA]

The checks: the package and every one of its modules import from site-packages, at the
wheel's version; ``py.typed`` is there; the ``marquardt`` namespace has no
``__init__.py``; the marquardt distributions installed are exactly the package and the
siblings its metadata requires (with EXTRA, those of that extra too); and one small piece
of real work runs: the planner's CLI, a Jacobian against its closed form, an LM step that
lowers the loss, a ``Trainer`` fit (with the ``lm`` extra, the ``Trainer``'s LM loop).
"""

from __future__ import annotations

import importlib
import importlib.metadata
import pkgutil
import re
import subprocess
import sys
import sysconfig
from pathlib import Path


def _siblings(dist: str, extra: str) -> set[str]:
    """``dist`` and the marquardt distributions its metadata requires, transitively."""
    found, todo = set(), [(dist, extra)]
    while todo:
        name, wanted = todo.pop()
        if name in found:
            continue
        found.add(name)
        for requirement in importlib.metadata.requires(name) or []:
            sibling = re.match(r"marquardt-[a-z]+", requirement)
            marker = re.search(r"extra\s*==\s*['\"]([\w-]+)['\"]", requirement)
            if sibling and (marker is None or marker.group(1) == wanted):
                todo.append((sibling.group(0), ""))
    return found


def check_installed(package: str, version: str, extra: str) -> None:
    """The package and all its modules import from this environment's site-packages."""
    site = Path(sysconfig.get_paths()["purelib"]).resolve()
    module = importlib.import_module(f"marquardt.{package}")
    where = Path(module.__file__ or "").resolve()
    assert where.is_relative_to(site), f"marquardt.{package} imported from {where}, not {site}"
    namespace = importlib.import_module("marquardt")
    assert getattr(namespace, "__file__", None) is None, (
        f"marquardt is a regular package ({namespace.__file__}); it must be a PEP 420 namespace"
    )
    assert (where.parent / "py.typed").is_file(), f"py.typed missing beside {where}"
    names = [m.name for m in pkgutil.walk_packages(module.__path__, f"marquardt.{package}.")]
    for name in names:
        importlib.import_module(name)
    dist = f"marquardt-{package}"
    got = importlib.metadata.version(dist)
    assert got == version, f"{dist} reports version {got}, the wheel is {version}"
    installed = {
        d.metadata["Name"]
        for d in importlib.metadata.distributions()
        if d.metadata["Name"].startswith("marquardt-")
    }
    expected = _siblings(dist, extra)
    assert installed == expected, f"installed {sorted(installed)}, expected {sorted(expected)}"
    print(f"{dist} {got}: {len(names) + 1} modules import from {site}; with {sorted(installed)}")


def smoke_devices() -> None:
    """The planner's command line, as the README runs it."""
    command = [str(Path(sys.executable).parent / "marquardt-devices")]
    command += ["--params", "769", "--batch", "100000"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"{command} exited {done.returncode}:\n{done.stderr}"
    assert "Plan for P=769, N=100000" in done.stdout, done.stdout
    print(done.stdout.strip().splitlines()[-2])


def smoke_jacobian() -> None:
    """J of the residual r = W x + b - y of a linear layer is [x, 1], row by row."""
    import torch
    from torch import nn

    from marquardt.jacobian import JacobianEngine, Replicas

    torch.manual_seed(0)
    model = nn.Linear(3, 1).double()
    x = torch.randn(10, 3, dtype=torch.float64)
    y = torch.randn(10, 1, dtype=torch.float64)
    engine = JacobianEngine(Replicas(model, [torch.device("cpu")]), lambda out, t: out - t)
    jacobian = torch.cat([s.jacobian for s in engine.slices(x, y, slice_size=4)])
    expected = torch.cat([x, torch.ones(10, 1, dtype=torch.float64)], dim=1)
    torch.testing.assert_close(jacobian, expected)
    print(f"J {tuple(jacobian.shape)} of a linear layer equals [x, 1]")


def smoke_solver() -> None:
    """One LM step on a linear fit is accepted and lowers the loss."""
    import torch
    from torch import nn

    from marquardt.solver import LMA

    torch.manual_seed(0)
    model = nn.Linear(1, 1)
    x = torch.linspace(-1, 1, 64).unsqueeze(1)
    y = 2 * x + 1
    lma = LMA(model, [torch.device("cpu")], residual_fn=lambda a, b: a - b)
    loss, _ = lma.step(x, y, slice_size=32)
    report = lma.report
    assert report.accepted and loss < report.loss_before, report
    print(f"one LM step: loss {report.loss_before:.3e} -> {loss:.3e} ({report.backend})")


def _loader() -> object:
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    torch.manual_seed(0)
    x = torch.linspace(0, 1, 64).reshape(-1, 1)
    return DataLoader(TensorDataset(x, 3 * x - 1), batch_size=16, shuffle=True)


def smoke_trainer() -> None:
    """A first-order ``Trainer`` fit of a few steps in this process, on the CPU."""
    import torch
    from torch import nn

    from marquardt.trainer import TrainConfig, Trainer

    model = nn.Linear(1, 1)
    before = [p.detach().clone() for p in model.parameters()]
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    config = TrainConfig(
        max_iter=1,
        write_every=1,
        tracking_tool="csv",
        compute_setup="cpu",
        backend="gloo",
        root_folder="runs",
    )
    Trainer.set_use_grad(True)
    model, _ = Trainer(model, optimizer, config, loss_fn="mse").fit(_loader())
    moved = any(not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    assert moved, "2 epochs of SGD steps left the model unchanged"
    metrics = sorted(Path("runs").rglob("metrics.csv"))
    assert metrics, "the run wrote no metrics.csv"
    print(f"Trainer fit 2 epochs of 4 SGD steps, metrics in {metrics[0]}")


def smoke_trainer_lm() -> None:
    """The ``Trainer``'s LM loop (the ``lm`` extra) for a few steps."""
    import torch
    from torch import nn

    from marquardt.solver import LMA
    from marquardt.trainer import TrainConfig, Trainer

    model = nn.Linear(1, 1)
    lma = LMA(model, [torch.device("cpu")], residual_fn=lambda a, b: a - b)
    config = TrainConfig(max_iter=0, tracking_tool="csv", root_folder="runs_lm")
    _, lma = Trainer(model, lma, config, loss_fn="mse").fit(_loader())  # one epoch: 4 steps
    assert lma.report.loss_after < 1e-6, lma.report
    print(f"Trainer LM loop: batch loss {lma.report.loss_after:.1e} after {lma.steps} steps")


def main(argv: list[str]) -> None:
    wheel, extra = argv[0], (argv[1] if len(argv) > 1 else "")
    dist, version = wheel.split("-")[:2]
    package = dist.removeprefix("marquardt_")
    check_installed(package, version, extra)
    smoke = {
        "devices": smoke_devices,
        "jacobian": smoke_jacobian,
        "solver": smoke_solver,
        "trainer": smoke_trainer,
        "trainer[lm]": smoke_trainer_lm,
    }
    smoke[f"{package}[{extra}]" if extra else package]()


if __name__ == "__main__":
    main(sys.argv[1:])
