"""``CSVLogger``: ``metrics.csv`` in the run folder, one row per written step and phase.

Columns are ``step, epoch, phase`` and then every metric in the order first seen; a metric
seen for the first time widens the table (the file is rewritten with the new column). A
resumed run keeps the rows up to the step it resumes from and rewrites the ones after.
"""

from __future__ import annotations

import contextlib
import csv
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

CSV_NAME = "metrics.csv"
_FIXED = ["step", "epoch", "phase"]


class CSVLogger:
    """Metrics as rows of ``<run folder>/metrics.csv`` (or of ``path`` when given).

    Arguments:
        path: the CSV file; ``None``: ``metrics.csv`` in the run folder.
    """

    def __init__(self, path: str | Path | None = None) -> None:
        self._explicit = None if path is None else Path(path)
        self.path = self._explicit or Path(CSV_NAME)
        self._columns: list[str] = []

    def start(self, folder: Path, start_step: int) -> None:
        self.path = self._explicit or folder / CSV_NAME
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if not self.path.exists():
            return
        with open(self.path, newline="") as handle:
            reader = csv.DictReader(handle)
            columns = list(reader.fieldnames or [])
            rows = [
                r for r in reader if r.get("step", "").isdigit() and int(r["step"]) <= start_step
            ]
        self._columns = columns
        self._rewrite(rows)

    def files(self, folder: Path) -> Path:
        """The CSV file it writes."""
        return self.path

    def log_hyperparams(self, params: Mapping[str, Any]) -> None:
        """Parameters go to ``hparams.json`` (written for every run), not to the CSV."""

    def log_metrics(
        self, metrics: Mapping[str, float], step: int, *, epoch: int, phase: str
    ) -> None:
        row = {"step": step, "epoch": epoch, "phase": phase, **metrics}
        new = [k for k in row if k not in self._columns]
        if new or not self.path.exists():
            old_rows: list[dict[str, Any]] = []
            if self.path.exists():
                with open(self.path, newline="") as handle:
                    old_rows = list(csv.DictReader(handle))
            base = self._columns or list(_FIXED)
            self._columns = base + [k for k in row if k not in base]
            self._rewrite(old_rows)
        size = self.path.stat().st_size
        try:
            with open(self.path, "a", newline="") as handle:
                writer = csv.DictWriter(handle, fieldnames=self._columns, extrasaction="ignore")
                writer.writerow(row)
        except OSError:
            with contextlib.suppress(OSError):  # no half row: the table stays readable
                os.truncate(self.path, size)
            raise

    def log_artifact(self, path: Path) -> None:
        """The checkpoint is already in the run folder, beside the CSV."""

    def close(self) -> None:
        """Every row is written when logged."""

    def _rewrite(self, rows: list[dict[str, Any]]) -> None:
        tmp = self.path.with_suffix(".csv.tmp")
        try:
            with open(tmp, "w", newline="") as handle:
                writer = csv.DictWriter(handle, fieldnames=self._columns, extrasaction="ignore")
                writer.writeheader()
                writer.writerows(rows)
            tmp.replace(self.path)
        except BaseException:
            with contextlib.suppress(OSError):  # never in place of the error being raised
                tmp.unlink(missing_ok=True)
            raise
