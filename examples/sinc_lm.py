"""Fit y = sinc(10x) with the Levenberg-Marquardt algorithm (the tutorial, as a script).

This is the sine-cardinal tutorial of the cuPyLMA seed with its import lines changed:
``get_available_gpus`` comes from ``marquardt.devices``, ``LMA`` from ``marquardt.solver``
and the Legate-aware microsecond clock ``time`` from ``marquardt.solver.timing`` (it calls
``legate.timing.time`` when Legate is running, ``perf_counter`` otherwise). Two further
difference, explained where it happens: host memory is pinned only when CUDA is present.
The LMA call is the seed's, ``LMA(model, devices, residual_fn)``, with LMA's defaults
(Nielsen's gain-ratio damping, Marquardt's scaling); ``--damping fixed --scaling
identity`` selects the classical fixed rule with D = I instead.

    python examples/sinc_lm.py                      # this machine's CPU (or GPUs)
    legate --cpus 2 examples/sinc_lm.py             # the same script under Legate
    legate --gpus 3 examples/sinc_lm.py             # solver on 3 Legate GPUs, model on the rest

It prints the loss of every step (with its time, damping and attempts), stops when the
full-dataset MSE reaches ``--target-mse`` or after ``--epochs`` epochs, saves a loss-curve
PNG and ends with a summary.
"""

from __future__ import annotations

import argparse
import os

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--epochs", type=int, default=60, help="epoch limit (default 60)")
parser.add_argument(
    "--target-mse", type=float, default=1e-5, help="stop below this full-dataset MSE"
)
parser.add_argument("--slice-size", type=int, default=5000, help="samples per Jacobian slice")
parser.add_argument("--hidden", type=int, default=64, help="tanh units in the hidden layer")
parser.add_argument("--out", default="sinc_lm_loss.png", help="where to save the loss curve")
parser.add_argument("--seed", type=int, default=0, help="random seed")
parser.add_argument(
    "--damping",
    default=None,
    choices=["fixed", "nielsen"],
    help="damping rule (default: LMA's, 'nielsen')",
)
parser.add_argument(
    "--scaling",
    default=None,
    choices=["identity", "marquardt"],
    help="damping matrix D (default: LMA's, 'marquardt')",
)
args = parser.parse_args()
torch.manual_seed(args.seed)


class SimpleDense(nn.Module):
    """The tutorial's model: 1 → hidden (tanh) → 1."""

    def __init__(self, hidden: int = 64) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(1, hidden), nn.Tanh(), nn.Linear(hidden, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


# 1. Create the dataset (the seed's lines). The seed pins host memory so batches reach
# the GPUs without an extra copy; a CPU-only torch has no pinned-memory allocator and
# torch.linspace(..., pin_memory=True) raises there, so pinning is asked for only when
# CUDA is present (DataLoader would merely warn, but is kept consistent).
pin_memory = torch.cuda.is_available()
batch_size = 10000

x_train = torch.linspace(-1, 1, 100000, dtype=torch.float32, pin_memory=pin_memory).unsqueeze(1)
y_train = torch.sinc(10 * x_train)
train_dataset = TensorDataset(x_train, y_train)
train_loader = DataLoader(train_dataset, batch_size=batch_size, shuffle=True, pin_memory=pin_memory)

# 2. Construct the model
from marquardt.devices import get_available_gpus  # noqa: E402

# Retrieve available GPUs (the CPU when there is none)
devices = get_available_gpus()
assert len(devices) != 0

# Construct the model on GPU device
model = SimpleDense(args.hidden).to(devices[0])

# 3. Instantiate the Levenberg-Marquardt training system
from marquardt.solver import LMA  # noqa: E402

residual_fn = lambda a, b: a - b  # noqa: E731
# Only the options given on the command line are passed: without them this is the seed's
# call, LMA(model, devices, residual_fn), with LMA's defaults.
options = {
    name: value
    for name, value in (("damping", args.damping), ("scaling", args.scaling))
    if value is not None
}
lma = LMA(model, devices, residual_fn, **options)

# 4. Train step
from marquardt.solver.timing import time  # noqa: E402

slice_size = args.slice_size


def full_mse() -> float:
    """MSE over all 100000 points, on the model device, without gradients."""
    total = 0.0
    with torch.no_grad():
        for lo in range(0, len(x_train), 50000):
            xs = x_train[lo : lo + 50000].to(devices[0])
            ys = y_train[lo : lo + 50000].to(devices[0])
            total += float(((model(xs) - ys) ** 2).sum())
    return total / len(x_train)


losses: list[float] = []
epoch_mse: list[tuple[int, float]] = [(0, full_mse())]
seconds = 0.0
terminated = False
reached = epoch_mse[0][1] < args.target_mse
for epoch in range(1, args.epochs + 1):
    if reached or terminated:
        break
    for x, y in train_loader:
        start_time = time()
        # Train on a batch
        loss, terminated = lma.step(x, y, slice_size)
        end_time = time()
        # Calculate one step's time in seconds
        step_time = (end_time - start_time) / 1e6
        seconds += step_time
        losses.append(loss)
        report = lma.report
        assert report is not None
        print(
            f"epoch {epoch:3d} step {len(losses):5d}  loss {loss:.3e}  time {step_time * 1e3:7.1f} ms"
            f"  damping {report.damping_used:.1e}  attempts {report.attempts}"
            + (f"  terminated: {report.reason}" if terminated else ""),
            flush=True,
        )
        if terminated:
            break
    mse = full_mse()
    epoch_mse.append((len(losses), mse))
    print(f"epoch {epoch:3d} full-dataset MSE {mse:.3e}", flush=True)
    reached = mse < args.target_mse

# Loss curve (Agg: no display needed). matplotlib is optional: without it the fit runs
# all the same (the Legate test environment has no plotting) and the summary says so.
try:
    import matplotlib
except ImportError:
    curve = "No loss curve was saved: matplotlib is not installed (pip install matplotlib)."
else:
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    ax.semilogy(range(1, len(losses) + 1), losses, lw=1, label="batch loss (after each step)")
    ax.semilogy(
        [s for s, _ in epoch_mse], [m for _, m in epoch_mse], "o-", ms=3, label="full-dataset MSE"
    )
    ax.axhline(args.target_mse, color="grey", ls="--", lw=0.8, label=f"target {args.target_mse:g}")
    ax.set_xlabel("LM step")
    ax.set_ylabel("mean squared error")
    ax.set_title(f"sinc(10x), 1-{args.hidden}-1 tanh, batch {batch_size}, slice {slice_size}")
    ax.legend()
    fig.tight_layout()
    out = os.path.abspath(args.out)
    fig.savefig(out, dpi=120)
    curve = f"The loss curve is in {out}."

final = epoch_mse[-1][1]
outcome = (
    f"reached the target MSE {args.target_mse:g}"
    if reached
    else ("stopped because the solver terminated" if terminated else "hit the epoch limit")
)
print(
    f"\nSummary: the 1-{args.hidden}-1 tanh model {outcome} with a full-dataset MSE of "
    f"{final:.3e} after {len(losses)} LM steps ({len(epoch_mse) - 1} epochs of "
    f"{len(train_loader)} batches of {batch_size}, slices of {slice_size}); the steps took "
    f"{seconds:.1f} s in total ({1e3 * seconds / max(1, len(losses)):.1f} ms per step) on "
    f"{', '.join(str(d) for d in devices)} with the {lma.backend.name} solver backend. "
    f"{curve}"
)
