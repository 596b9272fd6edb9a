"""What a run reports: progress on rank 0, CSV metrics, TensorBoard when installed.

Only rank 0 prints and writes (``enabled``); the metrics it reports are rank 0's own, or
the mean over ranks when ``TrainConfig.all_reduce_metrics`` is set (the reduction happens
in the loop, in every rank, before this module sees the numbers). The progress bar is
tqdm's or rich's when installed and the output is a terminal; otherwise (a batch job, a
pipe) plain lines every ``print_every`` steps, which read well in a Slurm log.
"""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path
from typing import Any

from ._config import TrainConfig

CSV_NAME = "metrics.csv"
_FIXED = ["step", "epoch", "phase"]


def notice(message: str) -> None:
    """A one-line notice for the user, on stderr."""
    sys.stderr.write(f"marquardt.trainer: {message}\n")
    sys.stderr.flush()


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


class RunLogger:
    """Rank 0's reporter for one run folder (does nothing on other ranks)."""

    def __init__(
        self, config: TrainConfig, folder: Path, enabled: bool, start_step: int, describe: str
    ) -> None:
        self.config = config
        self.folder = folder
        self.enabled = enabled
        self.csv_path = folder / CSV_NAME
        self._columns: list[str] = []
        self._tb: Any = None
        self._progress: _Progress | None = None
        if not enabled:
            return
        folder.mkdir(parents=True, exist_ok=True)
        if "csv" in config.trackers:
            self._prepare_csv(start_step)
        if "tensorboard" in config.trackers:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self._tb = SummaryWriter(log_dir=str(folder / "tensorboard"), purge_step=start_step)
            except ImportError:
                notice(
                    "tracking_tool 'tensorboard' asked for but tensorboard is not installed; "
                    "metrics go to the CSV only (pip install marquardt-trainer[tensorboard])"
                )
        with open(folder / "hparams.json", "w") as handle:
            json.dump(
                {"config": config.to_dict(), "hyperparams": config.hyperparams},
                handle,
                indent=2,
                default=str,
            )
        if config.verbose:
            self._progress = _Progress(config.max_iter, start_step)
            self._progress.write(f"marquardt.trainer: {describe}; run folder {folder}")

    def _prepare_csv(self, start_step: int) -> None:
        """Keep rows up to ``start_step`` (a resumed run rewrites what came after)."""
        if not self.csv_path.exists():
            return
        with open(self.csv_path, newline="") as handle:
            reader = csv.DictReader(handle)
            columns = list(reader.fieldnames or [])
            rows = [
                r for r in reader if r.get("step", "").isdigit() and int(r["step"]) <= start_step
            ]
        self._columns = columns
        self._rewrite(rows)

    def _rewrite(self, rows: list[dict[str, Any]]) -> None:
        tmp = self.csv_path.with_suffix(".csv.tmp")
        with open(tmp, "w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=self._columns, extrasaction="ignore")
            writer.writeheader()
            writer.writerows(rows)
        tmp.replace(self.csv_path)

    def _append_csv(self, row: dict[str, Any]) -> None:
        new = [k for k in row if k not in self._columns]
        if new or not self.csv_path.exists():
            # A metric seen for the first time widens the table: rewrite it with the column.
            old_rows: list[dict[str, Any]] = []
            if self.csv_path.exists():
                with open(self.csv_path, newline="") as handle:
                    old_rows = list(csv.DictReader(handle))
            base = self._columns or list(_FIXED)
            self._columns = base + [k for k in row if k not in base]
            self._rewrite(old_rows)
        with open(self.csv_path, "a", newline="") as handle:
            csv.DictWriter(handle, fieldnames=self._columns, extrasaction="ignore").writerow(row)

    def print_line(
        self, step: int, epoch: int, metrics: dict[str, float], phase: str = "train"
    ) -> None:
        if not self.enabled or not self.config.verbose or self._progress is None:
            return
        self._progress.write(
            f"{phase} step {step}/{self.config.max_iter} | epoch {epoch} | {_format(metrics)}"
        )

    def progress(self, step: int, metrics: dict[str, float]) -> None:
        if self.enabled and self._progress is not None:
            self._progress.update(step, metrics)

    def write(self, step: int, epoch: int, metrics: dict[str, float], phase: str = "train") -> None:
        if not self.enabled:
            return
        if "csv" in self.config.trackers:
            self._append_csv({"step": step, "epoch": epoch, "phase": phase, **metrics})
        if self._tb is not None:
            for key, value in metrics.items():
                self._tb.add_scalar(f"{phase}/{key}", value, step)

    def message(self, text: str) -> None:
        if not self.enabled:
            return
        if self._progress is not None:
            self._progress.write(f"marquardt.trainer: {text}")
        else:
            notice(text)

    def close(self) -> None:
        if self._progress is not None:
            self._progress.close()
            self._progress = None
        if self._tb is not None:
            self._tb.close()
            self._tb = None
