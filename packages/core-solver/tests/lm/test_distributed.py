"""LMA in a process group: two real gloo processes against one process on the same batch.

One pair of processes (``distributed_worker.py``, file-store rendezvous, 1 torch thread
each) runs every configuration, then the agreement check, then a SIGKILL of rank 1 in
the middle of a step; the tests below read what the pair left behind.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from distributed_worker import CONFIGS, make_model, run_config

from marquardt.solver import LMA, SolverConfigError

WORKER = Path(__file__).resolve().parents[1] / "distributed_worker.py"
#: The pair's whole run (start-up, 12 configurations × 10 steps, the two fault phases).
PAIR_TIMEOUT = 240.0
#: After rank 1's SIGKILL, rank 0 must have exited within this many seconds (its process
#: group timeout is 20 s; gloo notices a closed peer at once).
EXIT_BOUND = 30.0


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("pair")
    out = str(tmp / "results.pt")
    env = dict(os.environ, OMP_NUM_THREADS="1", MARQUARDT_SOLVER_CHECK_RANKS="1")
    procs = [
        subprocess.Popen(
            [sys.executable, str(WORKER), str(rank), "2", str(tmp / "store"), out],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in range(2)
    ]
    ended: dict[int, float] = {}
    deadline = time.monotonic() + PAIR_TIMEOUT
    while len(ended) < 2 and time.monotonic() < deadline:
        for rank, proc in enumerate(procs):
            if rank not in ended and proc.poll() is not None:
                ended[rank] = time.time()
        time.sleep(0.05)
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
    logs = [proc.communicate() for proc in procs]
    killed = Path(out + ".killed")
    return {
        "results": torch.load(out) if Path(out).exists() else None,
        "codes": [proc.returncode for proc in procs],
        "stderr": [err for _, err in logs],
        "ended": ended,
        "killed_at": float(killed.read_text()) if killed.exists() else None,
    }


def _results(pair: dict[str, Any]) -> dict[str, Any]:
    assert pair["results"] is not None, "rank 0 wrote no results:\n" + pair["stderr"][0][-3000:]
    return pair["results"]  # type: ignore[no-any-return]


@pytest.mark.multiprocess
@pytest.mark.parametrize("name", list(CONFIGS))
def test_two_processes_take_the_steps_of_one(pair: dict[str, Any], name: str) -> None:
    torch.set_num_threads(1)
    two = _results(pair)[name]
    one = run_config(name, group=False)
    assert len(two["theta"]) == len(one["theta"])
    assert two["terminated"] == one["terminated"]
    assert two["strategy"] == one["strategy"]
    # The sums over ranks round differently from one process's sum; a factorisation
    # carries that to θ as is, conjugate gradients amplify it by the damped system's
    # condition number over their iterations (1e-12 after one step, up to 1e-5 after ten
    # here), far below the steps themselves (checked below).
    tol = 1e-4 if name.startswith("matrix-free") else 1e-8
    assert two["damping"] == pytest.approx(one["damping"], rel=tol)
    assert two["loss"] == pytest.approx(one["loss"], rel=tol)
    start = torch.nn.utils.parameters_to_vector(make_model().parameters())
    for k, (a, b) in enumerate(zip(two["theta"], one["theta"], strict=True)):
        rel = float((a - b).detach().norm() / b.detach().norm())
        assert rel <= tol, f"step {k}: relative difference {rel:.3g}"
    # The run moved: the comparison is not between two untouched models.
    assert float((one["theta"][-1] - start).norm()) > 1e-3


@pytest.mark.multiprocess
def test_the_configurations_cover_both_strategies(pair: dict[str, Any]) -> None:
    results = _results(pair)
    assert set(results["explicit-nielsen"]["strategy"]) == {"explicit"}
    assert set(results["accumulate-nielsen"]["strategy"]) == {"accumulate"}
    assert set(results["matrix-free"]["strategy"]) == {"matrix_free"}
    assert any(results["accumulate-tolerances"]["terminated"])


@pytest.mark.multiprocess
def test_the_agreement_check_names_the_rank_that_differs(pair: dict[str, Any]) -> None:
    text = _results(pair)["_disagreement"]
    assert "rank 1 has λ" in text and "rank 0 has" in text


@pytest.mark.multiprocess
def test_non_finite_residuals_on_one_rank_are_refused_by_both_at_once(
    pair: dict[str, Any],
) -> None:
    """Rank 1 alone holds a NaN target (refused by the data check), or a NaN residual,
    found while planning or while assembling: both
    ranks raise ResidualNotFiniteError in the same step (no collective left waiting for
    its 20 s timeout), rank 1 naming the sample and rank 0 the other rank, for both
    strategies; the next batch steps on both."""
    ranks = _results(pair)["_refused_together"]
    for strategy in ("auto", "explicit"):
        mine, other = ranks[1][f"{strategy}-data"], ranks[0][f"{strategy}-data"]
        assert mine.startswith("BatchNotFiniteError") and "finite targets" in mine, mine
        assert other.startswith("ResidualNotFiniteError") and "another rank's data" in other
    for case in ("auto-planning", "auto-assembly", "explicit-planning", "explicit-assembly"):
        mine, other = ranks[1][case], ranks[0][case]
        sample = 3 if case.endswith("planning") else 10
        assert f"first at sample {sample}" in mine, (case, mine)
        assert "finite residuals on every rank were expected" in other, (case, other)
        assert "another rank's" in other and "NaN or infinite" in other, (case, other)
        assert all(r[f"{case}-seconds"] < 10.0 for r in ranks), case
        after = [r[f"{case}-after"] for r in ranks]
        assert after[0] == after[1] and math.isfinite(after[0]), case


@pytest.mark.multiprocess
def test_a_killed_rank_ends_the_other_naming_it(pair: dict[str, Any]) -> None:
    codes, stderr = pair["codes"], pair["stderr"]
    assert codes[1] == -9, stderr[1][-2000:]
    assert codes[0] not in (0, None), stderr[0][-2000:]
    assert "RankFailureError" in stderr[0], stderr[0][-2000:]
    assert "rank 0 of 2 was in the" in stderr[0]
    assert "rank(s) 1 did not answer" in stderr[0], stderr[0][-2000:]
    assert pair["killed_at"] is not None
    assert pair["ended"][0] - pair["killed_at"] < EXIT_BOUND


def test_process_group_is_checked_before_anything_is_built() -> None:
    model = make_model()
    before = [p.detach().clone() for p in model.parameters()]
    if not dist.is_initialized():
        with pytest.raises(SolverConfigError, match="not initialised"):
            LMA(model, ["cpu"], residual_fn=lambda a, b: a - b, process_group="default")
    with pytest.raises(SolverConfigError, match="'default'"):
        LMA(model, ["cpu"], residual_fn=lambda a, b: a - b, process_group="world")
    with pytest.raises(SolverConfigError, match="ProcessGroup"):
        LMA(model, ["cpu"], residual_fn=lambda a, b: a - b, process_group=3)  # type: ignore[arg-type]
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
