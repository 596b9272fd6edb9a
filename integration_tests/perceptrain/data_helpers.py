"""``perceptrain.data``: ``to_dataloader``, ``InfiniteTensorDataset``, ``DictDataLoader`` with a
per-key loss, ``R3Dataset``, ``GenerativeIterableDataset``; batches an epoch in each case."""

from __future__ import annotations

from typing import Any

import torch
from _harness import Counters, api, full_loss, number, run, seed_everything, sine_data, small_model


def main(counters: Counters) -> dict[str, Any]:
    TrainConfig, Trainer = api().TrainConfig, api().Trainer
    data = api("data")
    x, y = sine_data()
    out: dict[str, Any] = {}

    def train(name: str, dataloader: Any, loss_fn: Any = "mse") -> dict[str, Any]:
        seed_everything()  # each run from the same start, whatever fit() drew
        model = small_model()
        optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
        steps = [0]

        def count(*_: Any) -> None:
            steps[0] += 1

        optimizer.register_step_post_hook(count)
        counters.watch_optimizer(optimizer)
        config = TrainConfig(max_iter=4, root_folder=f"runs_{name}")
        Trainer(model, optimizer, config, loss_fn=loss_fn).fit(dataloader)
        return {"steps": steps[0], "full_loss": full_loss(model, x, y)}

    finite = data.to_dataloader(x, y, batch_size=30)
    out["to_dataloader"] = {
        "type": type(finite.dataset).__name__,
        "batches": [len(b[0]) for b in finite],
        **train("finite", finite),
    }
    infinite = data.to_dataloader(x, y, batch_size=30, infinite=True)
    out["to_dataloader_infinite"] = {
        "type": type(infinite.dataset).__name__,
        **train("infinite", infinite),
    }
    dataset = data.InfiniteTensorDataset(x, y)
    out["InfiniteTensorDataset"] = [len(next(iter(dataset)))]

    # a DictDataLoader and a loss that sums one term per key
    def dict_loss(batch: dict[str, Any], model: torch.nn.Module) -> tuple[Any, dict[str, Any]]:
        terms = {
            key: torch.nn.functional.mse_loss(model(xb), yb) for key, (xb, yb) in batch.items()
        }
        return sum(terms.values()), terms

    dict_loader = data.DictDataLoader(
        {
            "left": data.to_dataloader(x[:50], y[:50], batch_size=25),
            "right": data.to_dataloader(x[50:], y[50:], batch_size=10),
        }
    )
    first = next(iter(dict_loader))
    out["DictDataLoader"] = {
        "keys": sorted(first),
        "shapes": {k: list(v[0].shape) for k, v in first.items()},
        **train("dict", dict_loader, dict_loss),
    }

    r3 = data.R3Dataset(proba_dist=lambda n: torch.rand(n, 1), n_samples=20, release_threshold=0.5)
    r3.update(torch.linspace(0, 1, 20))
    out["R3Dataset"] = {"len": len(r3), "released": r3.n_released, "retained": r3.n_retained}
    generative = data.GenerativeIterableDataset(proba_dist=lambda: torch.rand(3, 1))
    out["GenerativeIterableDataset"] = list(next(iter(generative)).shape)
    result = data.OptimizeResult(3, small_model(), None, torch.tensor(0.5), {"a": 1})
    out["OptimizeResult"] = {
        "iteration": result.iteration,
        "loss": number(result.loss),
        "metrics": result.metrics,
        "extra": result.extra,
        "rank": result.rank,
        "device": result.device,
    }
    return out


if __name__ == "__main__":
    run(main)
