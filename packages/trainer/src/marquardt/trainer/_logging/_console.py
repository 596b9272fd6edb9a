"""The console on rank 0: a progress bar on a terminal, otherwise plain lines.

The bar is tqdm's or rich's when installed and stderr is a terminal; otherwise (a batch
job, a pipe) the console prints plain lines every ``print_every`` steps, which read well in
a Slurm log.
"""

from __future__ import annotations

import sys
from typing import Any

from ._base import notice


def _format(metrics: dict[str, float]) -> str:
    return " | ".join(f"{k} {v:.6g}" for k, v in metrics.items())


class _Progress:
    """A tqdm or rich bar on a terminal, nothing otherwise."""

    def __init__(self, total: int, initial: int) -> None:
        self._bar: Any = None
        self._rich: Any = None
        if not sys.stderr.isatty():
            return
        try:
            from tqdm.auto import tqdm

            self._bar = tqdm(total=total, initial=initial, unit="step", dynamic_ncols=True)
            return
        except ImportError:
            pass
        try:
            from rich.progress import Progress

            self._rich = Progress()
            self._rich.start()
            self._task = self._rich.add_task("training", total=total, completed=initial)
        except ImportError:
            pass

    @property
    def active(self) -> bool:
        return self._bar is not None or self._rich is not None

    def update(self, step: int, metrics: dict[str, float]) -> None:
        if self._bar is not None:
            self._bar.n = step
            self._bar.set_postfix(
                {k: f"{v:.4g}" for k, v in list(metrics.items())[:3]}, refresh=False
            )
            self._bar.refresh()
        elif self._rich is not None:
            self._rich.update(self._task, completed=step)

    def write(self, line: str) -> None:
        if self._bar is not None:
            self._bar.write(line)
        elif self._rich is not None:
            self._rich.console.print(line)
        else:
            print(line, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
        if self._rich is not None:
            self._rich.stop()


class Console:
    """Progress and lines for one run (``verbose``), or only notices (quiet)."""

    def __init__(self, max_iter: int, start_step: int, verbose: bool) -> None:
        self.max_iter = max_iter
        self._progress = _Progress(max_iter, start_step) if verbose else None

    def line(self, text: str) -> None:
        if self._progress is not None:
            self._progress.write(text)

    def step_line(self, step: int, epoch: int, metrics: dict[str, float], phase: str) -> None:
        self.line(f"{phase} step {step}/{self.max_iter} | epoch {epoch} | {_format(metrics)}")

    def progress(self, step: int, metrics: dict[str, float]) -> None:
        if self._progress is not None:
            self._progress.update(step, metrics)

    def message(self, text: str) -> None:
        if self._progress is not None:
            self._progress.write(f"marquardt.trainer: {text}")
        else:
            notice(text)

    def close(self) -> None:
        if self._progress is not None:
            self._progress.close()
            self._progress = None
