"""The three levels of data control in a real spawn of 2 processes (gloo, CPU): loaders,
datasets with loader settings, and a dataset factory called inside each process."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ..conftest import SCRIPTS, Processes, read_json

pytestmark = pytest.mark.multiprocess

LEVELS = str(SCRIPTS / "levels.py")


def _run(
    tmp_path: Path, procs: Processes, *args: str
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    code, _, err = procs.run([LEVELS, *args], cwd=tmp_path, timeout=180)
    assert code == 0, err
    ranks = [read_json(tmp_path / f"levels_{rank}.json") for rank in (0, 1)]
    return ranks, read_json(tmp_path / "parent.json")


def _check_shares(ranks: list[dict[str, Any]]) -> None:
    """Each rank trained 6 batches of 4 of its own items; together, every item once."""
    items = [[i for batch in r["seen"] for i in batch] for r in ranks]
    assert [len(r["seen"]) for r in ranks] == [6, 6]
    assert all(len(batch) == 4 for r in ranks for batch in r["seen"])
    assert not set(items[0]) & set(items[1])
    assert sorted(items[0] + items[1]) == list(range(48))
    assert items[0] != sorted(items[0])  # shuffled (the default of the dataset levels too)


def test_datasets_with_loader_settings_are_split_over_the_ranks(
    tmp_path: Path, procs: Processes
) -> None:
    # Level 1 (loaders) is what test_multiprocess.py runs throughout.
    ranks, _ = _run(tmp_path, procs, "--level", "2", "--workers", "1")
    _check_shares(ranks)


def test_a_dataset_factory_runs_in_each_rank_and_its_data_stays_there(
    tmp_path: Path, procs: Processes
) -> None:
    ranks, parent = _run(tmp_path, procs, "--level", "3")
    _check_shares(ranks)
    # The factory ran once in each training process, which read its own rank there; the
    # spawning parent never built a dataset, and the dataset (which holds a lock, so it
    # cannot be pickled) never left the process that built it.
    assert parent["built"] == []
    for rank, seen in enumerate(ranks):
        assert seen["built"] == [{"pid": seen["pid"], "rank": rank}]
    assert len({r["pid"] for r in ranks} | {parent["pid"]}) == 3
