"""Classify scikit-learn's 8×8 digits with Levenberg-Marquardt, against Adam, for the same time.

Data: ``sklearn.datasets.load_digits`` (1797 images of 8 × 8 pixels, 10 classes), pixels
scaled to [0, 1], 1437 for training and 360 for testing (a seeded split). Model: a
64-16-10 tanh MLP (P = 1210), float32, 2 threads. Every optimizer starts from the same
parameters and trains for the same wall-clock budget (``--seconds``, evaluation excluded);
after each step (LM: one full-batch step; Adam: one minibatch of 64) the test accuracy is
recorded. LM is tried with two residuals:

* √CE: one residual per sample, rᵢ = √(CEᵢ), so that the mean of rᵢ² is the usual
  cross-entropy (R = N rows);
* one-hot: ten residuals per sample, rᵢ = softmax(zᵢ) − onehot(yᵢ), whose mean square is
  the Brier score (R = 10·N rows).

The peer, torch-levenberg-marquardt (when installed), runs with its own
``CrossEntropyLoss`` (its residuals are √CEᵢ as well) and its Cholesky solver.

    python examples/digits_lm.py [--seconds 10] [--plot digits_accuracy.png]

``--plot`` also draws every optimizer's test accuracy against its training seconds (needs
matplotlib); the tutorial's figure is made this way.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits
from torch import nn

from marquardt.solver import LMA

HIDDEN = 16
ADAM_LRS = (3e-3, 1e-2, 3e-2)
ADAM_BATCH = 64


def digits(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(x_train, y_train, x_test, y_test): 1437 / 360 images, pixels in [0, 1]."""
    data = load_digits()
    x = torch.tensor(data.data, dtype=torch.float32) / 16.0
    y = torch.tensor(data.target, dtype=torch.int64)
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(seed))
    test, train = order[:360], order[360:]
    return x[train], y[train], x[test], y[test]


def classifier(seed: int = 0) -> nn.Module:
    """The 64-16-10 tanh MLP, the same parameters for every optimizer."""
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(64, HIDDEN), nn.Tanh(), nn.Linear(HIDDEN, 10))


def sqrt_ce(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """rᵢ = √CEᵢ (one residual per sample); the tiny shift keeps √ differentiable at 0."""
    return torch.sqrt(F.cross_entropy(logits, labels, reduction="none") + 1e-12)


def one_hot(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """rᵢ = softmax(zᵢ) − onehot(yᵢ) (ten residuals per sample)."""
    return torch.softmax(logits, dim=1) - F.one_hot(labels, 10).to(logits.dtype)


@torch.no_grad()
def accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    return float((model(x).argmax(dim=1) == y).float().mean())


def run(
    step: Callable[[], None],
    model: nn.Module,
    test: tuple[torch.Tensor, torch.Tensor],
    seconds: float,
) -> list[tuple[float, float]]:
    """(training seconds, test accuracy) after each step until the budget is spent."""
    curve: list[tuple[float, float]] = []
    spent = 0.0
    while spent < seconds:
        start = time.perf_counter()
        step()
        spent += time.perf_counter() - start
        curve.append((spent, accuracy(model, *test)))
    return curve


def lm(residual: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], seconds: float) -> Any:
    x, y, xt, yt = digits()
    model = classifier()
    lma = LMA(model, ["cpu"], residual)
    return run(lambda: lma.step(x, y) and None, model, (xt, yt), seconds)


def adam(lr: float, seconds: float) -> Any:
    x, y, xt, yt = digits()
    model = classifier()
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(1))
    cursor = [0]

    def step() -> None:
        lo = cursor[0]
        if lo + ADAM_BATCH > len(x):
            order.copy_(torch.randperm(len(x)))
            lo = 0
        idx = order[lo : lo + ADAM_BATCH]
        cursor[0] = lo + ADAM_BATCH
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(model(x[idx]), y[idx]).backward()
        opt.step()

    return run(step, model, (xt, yt), seconds)


def peer(seconds: float) -> Any:
    try:
        import torch_levenberg_marquardt as tlm
    except ImportError:
        return None
    x, y, xt, yt = digits()
    model = classifier()
    module = tlm.training.LevenbergMarquardtModule(
        model, loss_fn=tlm.loss.CrossEntropyLoss(), solve_method="cholesky"
    )
    return run(lambda: module.training_step(x, y) and None, model, (xt, yt), seconds)


def first_reaching(curve: list[tuple[float, float]], level: float) -> float | None:
    """The training seconds at which the test accuracy first reached ``level``."""
    return next((t for t, acc in curve if acc >= level), None)


def describe(name: str, curve: list[tuple[float, float]] | None, level: float = 0.95) -> str:
    if not curve:
        return f"{name:<22s} not run"
    reach = first_reaching(curve, level)
    when = f"{reach:6.2f} s" if reach is not None else "   never"
    best = max(acc for _, acc in curve)
    return (
        f"{name:<22s} {len(curve):6d} steps  final {curve[-1][1]:.3f}  best {best:.3f}  "
        f"{level:.0%} after {when}"
    )


def main(seconds: float) -> dict[str, Any]:
    torch.set_num_threads(2)
    results: dict[str, Any] = {
        "LM, √CE residuals": lm(sqrt_ce, seconds),
        "LM, one-hot residuals": lm(one_hot, seconds),
    }
    for lr in ADAM_LRS:
        results[f"Adam lr={lr:g}"] = adam(lr, seconds)
    results["peer LM (√CE)"] = peer(seconds)
    return results


def plot(results: dict[str, Any], path: str, level: float = 0.95) -> None:
    """Test accuracy against training seconds, one line per optimizer, saved as ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for name, curve in results.items():
        if curve:
            seconds, acc = zip(*curve, strict=True)
            style = "-o" if name.startswith(("LM", "peer")) else "-"
            ax.plot(seconds, acc, style, ms=3, lw=1.5, label=name)
    ax.axhline(level, color="grey", lw=0.8, ls=":")
    ax.set_xscale("log")  # Adam's thousands of small steps and LM's few large ones
    ax.set_xlabel("training seconds (evaluation excluded; log scale)")
    ax.set_ylabel("test accuracy")
    ax.set_ylim(0.5, 1.0)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="budget per optimizer")
    parser.add_argument("--plot", metavar="PNG", help="also draw accuracy against time")
    args = parser.parse_args()
    results = main(args.seconds)
    for name, curve in results.items():
        print(describe(name, curve))
    if args.plot:
        plot(results, args.plot)
        print(f"accuracy against time: {args.plot}")
