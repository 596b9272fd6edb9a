"""``fit()`` with no data: the model computes its own loss (qadence's VQE examples)."""

from __future__ import annotations

from typing import Any

import torch
from _harness import Counters, api, number, run


class Energy(torch.nn.Module):
    """A stand-in for a variational energy: a smooth function of the parameters alone."""

    def __init__(self) -> None:
        super().__init__()
        self.theta = torch.nn.Parameter(torch.tensor([0.3, -1.2, 2.0]))

    def forward(self) -> torch.Tensor:
        t = self.theta
        return torch.cos(t[0]) + torch.sin(t[1]) * torch.cos(t[2]) + 0.1 * (t**2).sum()


def loss_fn(batch: Any, model: torch.nn.Module) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    energy = model()
    return energy, {"energy": energy}


def main(counters: Counters) -> dict[str, Any]:
    TrainConfig, Trainer = api().TrainConfig, api().Trainer
    model = Energy()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
    counters.watch_optimizer(optimizer)
    counters.watch_model(model)
    seen_batches: list[Any] = []

    class Recording(Trainer):  # type: ignore[misc, valid-type]
        def on_train_batch_start(self, batch: Any) -> None:
            seen_batches.append(batch)

    config = TrainConfig(max_iter=20, print_every=5, write_every=10)
    trainer = Recording(model, optimizer, config, loss_fn=loss_fn)
    trainer.fit()
    return {
        "batches": [repr(b) for b in seen_batches[:2]],
        "batch_count": len(seen_batches),
        "theta": number(model.theta),
        "energy": float(model().detach()),
    }


if __name__ == "__main__":
    run(main)
