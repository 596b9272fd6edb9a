"""The benchmarks' rows (``benchmarks/_rows.py``): each figure's verdict against its target,
bounds from a side that did not reach its goal, and the round trip through ``summary.json``;
and the records in ``benchmarks.toml``, which every module must serve."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))


@pytest.mark.parametrize(
    ("value", "target", "op", "bound", "verdict"),
    [
        (0.4, 0.5, "≤", "", "PASS"),
        (0.5, 0.5, "≤", "", "PASS"),
        (0.6, 0.5, "≤", "", "MISS"),
        (10.0, 10.0, "≥", "", "PASS"),
        (9.0, 10.0, "≥", "", "MISS"),
        (0.4, 0.5, "≤", "<", "PASS"),  # below a value already below the target
        (0.6, 0.5, "≤", "<", "open"),  # below a value above it: undecided
        (0.6, 0.5, "≤", ">", "MISS"),
        (0.4, 0.5, "≤", ">", "open"),
        (12.0, 10.0, "≥", ">", "PASS"),
        (9.0, 10.0, "≥", "<", "MISS"),
        (3.0, None, "≤", "", "info"),
        (None, 0.5, "≤", "", "n/a"),
        (float("nan"), 0.5, "≤", "", "n/a"),
    ],
)
def test_a_rows_verdict_follows_its_target_and_bound(
    value: float | None, target: float | None, op: str, bound: str, verdict: str
) -> None:
    from _rows import row

    assert row("x", value, target, op=op, bound=bound).verdict == verdict


def test_a_side_that_did_not_reach_the_goal_gives_a_bound_from_its_run() -> None:
    from _rows import time_ratio

    both = time_ratio("x", (2.0, 4.0), (10.0, 10.0), 0.5)
    assert (both.value, both.bound, both.verdict) == (0.5, "", "PASS")
    peer_missed = time_ratio("x", (2.0, None), (10.0, 8.0), 0.5)
    assert (peer_missed.value, peer_missed.bound, peer_missed.verdict) == (0.25, "<", "PASS")
    ours_missed = time_ratio("x", (None, 4.0), (10.0, 8.0), 0.5)
    assert (ours_missed.value, ours_missed.bound, ours_missed.verdict) == (2.5, ">", "MISS")
    assert time_ratio("x", (None, None), (1.0, 1.0), 0.5).verdict == "n/a"


def test_rows_and_runs_come_back_from_their_records_unchanged() -> None:
    from _rows import Run, row

    run = Run("step", [row("a", 0.4, 0.5, detail="ours 4 ms"), row("b", None, None)], 3.0, 0.5)
    assert Run.load(run.record()) == run
    assert "0.5 → " not in run.load_text() and "figures from its own last run" in run.load_text()


def test_every_record_names_a_module_with_its_three_functions() -> None:
    import _registry as registry

    for name in registry.MODULES:
        bench = registry.get(name)
        assert bench.name == name and set(bench.devices) <= {"cpu", "cuda"}
    assert "| `quality` | `bench_quality.py` | cpu, cuda |" in registry.index()


def test_the_gpu_plans_largest_n_is_bisected_on_the_planner_and_clipped() -> None:
    import bench_scale
    import torch

    quick = bench_scale.PLANS[("cuda", True)]
    largest = bench_scale._largest(quick, torch.device("cpu"))
    assert largest["n"] == quick.clip and "clipped" in largest["note"]
    assert bench_scale._largest(bench_scale.PLANS[("cpu", False)], torch.device("cpu")) == {}


def test_a_group_stands_for_its_members_that_run_on_the_device() -> None:
    import _registry as registry

    assert registry.expand(["pinn"]) == ["pinn", "pinn_suite"]
    assert registry.expand(["pinn", "scale"], "cuda") == ["pinn", "scale"]


def test_the_pinn_step_rows_come_from_the_step_results(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import json

    import _pinn_report as report

    monkeypatch.setattr(report, "RESULTS_DIR", tmp_path)
    assert report.step_rows() == []  # nothing recorded: no rows, no section
    shape = {
        "label": "helmholtz (suite)",
        "params": 1981,
        "rows": 1100,
        "steps": 7,
        "median_s": {"forward Laplacian": 0.06, "torch.func.hessian (earlier)": 0.1},
        "parts": {"forward Laplacian": "accumulate", "torch.func.hessian (earlier)": "accumulate"},
        "ratio": 0.6,
        "gram_floor_s": 0.04,
    }
    steps = {"machine": {"cpu": "test CPU"}, "target": 0.3, "load_before": 1.0, "load_after": 1.5}
    (tmp_path / "pinn_step.json").write_text(json.dumps({**steps, "shapes": [shape]}))
    (only,) = report.step_rows()
    assert only.verdict == "MISS" and only.value == pytest.approx(0.6)
    assert only.detail.startswith("60 ms vs 100 ms (P = 1,981, 1,100 rows)")
    # they are the CPU's figures: a GPU's report leaves them out
    assert report.summary({"rows": [], "machine": {"cpu": "test CPU"}}) == [only]
    assert report.summary({"rows": [], "machine": {"cpu": "test CPU", "gpu": "H100"}}) == []
    text = report.section(
        {
            "machine": {"cpu": "test CPU", "load_average_1min": 1.0},
            "runs": {
                "ours": {
                    "params": 5,
                    "rows": 4,
                    "trace": [[1.0, 1e-3]],
                    "steps": 2,
                    "step_median_s": 0.1,
                    "memory_mib": 3,
                }
            },
            "budget_s": 1.0,
            "adam_lr": 0.01,
            "adam_tuning": {"0.01": 1.0},
        }
    )
    assert "| helmholtz (suite) | 1,981 | 1,100 | 60 ms | 100 ms | 0.60× | 40 ms |" in text


def _results_in(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A results folder of its own under ``tmp_path``, the report showing subset_damping."""
    import _common as c
    import _results_md as report

    results = tmp_path / "results"
    results.mkdir()
    monkeypatch.setattr(c, "HERE", tmp_path)
    monkeypatch.setattr(c, "RESULTS_DIR", results)
    monkeypatch.setattr(report.Report, "shown", lambda self: ["subset_damping"])
    return results


def _machine(stamp: dict[str, object]) -> dict[str, object]:
    """A run's machine record: ``stamp`` and placeholders for what the report reads."""
    return {
        **stamp,
        **dict.fromkeys(("cpu_flags", "memory_gib", "threads_used", "python", "platform"), "x"),
        **dict.fromkeys(("torch", "torch_blas", "numpy", "numpy_blas"), "x"),
        "torch_levenberg_marquardt": "x",
    }


def test_the_results_check_fails_on_a_hand_edit_and_passes_on_a_fresh_render(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import json
    from dataclasses import replace

    import _results_md as report
    import run_all
    from _rows import Run, row
    from _stamp import MEASURED

    results = _results_in(tmp_path, monkeypatch)
    last = {"source": "commit 1111111", "cpu": "test CPU", "cores": 2}
    # results that give no rows of their own: the run keeps its recorded rows
    data = {MEASURED: {**last, "source": "commit 0000000"}, "runs": {}, "load_before": 1.0}
    (results / "subset_damping.json").write_text(json.dumps(data))
    machine = _machine(last)
    part = replace(row("subset: part", 1.0, None), source="subset_part")  # a part run alone
    (results / "subset_part.json").write_text(json.dumps({MEASURED: {"cpu": "part CPU"}}))
    run = Run("subset_damping", [row("subset: steps", 3.0, None), part], 1.0, 0.5, 0.6)
    summary = report.Summary("2026-01-01 00:00", 60.0, machine, [run])
    (results / "summary.json").write_text(json.dumps(summary.record()))
    report.write(summary, report.CPU)
    assert run_all.check_reports() == []
    text = report.CPU.markdown.read_text()
    # every row and section says where it was measured, and that it is not the last run
    assert (
        "| subset: steps | 3× | — | info |  | 0000000, an earlier run; test CPU, 2 cores |" in text
    )
    assert "commit 0000000 (an earlier run than the last, commit 1111111)" in text
    assert "| subset: part | 1× | — | info |  | not recorded; part CPU |" in text
    assert "`results/subset_part.json` were measured at: commit not recorded; machine: part" in text
    edited = text.replace("| 3× |", "| 2.5× |")
    report.CPU.markdown.write_text(edited)
    (problem,) = run_all.check_reports()
    at = edited.split("\n").index(next(ln for ln in edited.split("\n") if "2.5×" in ln)) + 1
    assert f"RESULTS.md is not what its data render to: line {at}:" in problem
    report.CPU.markdown.write_text(text + "\n")  # a byte more: still a difference
    assert "the file has" in run_all.check_reports()[0]
    report.write(summary, report.CPU)
    assert run_all.check_reports() == []


def test_the_results_check_fails_on_rows_the_data_do_not_give_and_render_rebuilds_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import json

    import _results_md as report
    import run_all
    from _rows import Run, row
    from _stamp import MEASURED

    results = _results_in(tmp_path, monkeypatch)
    runs = {"shared 0": {"mse": 2.0, "rejected": 1}, "per-block 0": {"mse": 1.0, "rejected": 0}}
    data = {MEASURED: {"source": "commit 0000000", "cpu": "test CPU", "cores": 2}, "runs": runs}
    (results / "subset_damping.json").write_text(json.dumps(data))
    what = "subset_damping: per-block λ / shared λ, final MSE (0)"
    machine = _machine(data[MEASURED])
    # rows recorded from an older form of the results: 0.25 where the data now give 0.5
    run = Run("subset_damping", [row(what, 0.25, None)], 1.0, 0.5, 0.6)
    summary = report.Summary("2026-01-01 00:00", 60.0, machine, [run])
    (results / "summary.json").write_text(json.dumps(summary.record()))
    report.write(summary, report.CPU)
    problems = run_all.check_reports()
    assert (
        problems
        and "rows are not what results/*.json give (first: subset_damping)" in (problems[0])
    )
    fresh = report.rebuilt(summary, report.CPU)
    assert [r.value for r in fresh.runs[0].rows] == [0.5]
    assert [r.value for r in summary.runs[0].rows] == [0.25]  # the recorded summary untouched
    (results / "summary.json").write_text(json.dumps(fresh.record()))
    report.write(fresh, report.CPU)
    assert run_all.check_reports() == []
    # a run that did not complete keeps its failure, whatever older results say
    failed = Run("subset_damping", [row("subset_damping: did not complete", None, None)])
    failed.error = "exit code 1"
    kept = report.rebuilt(report.Summary("x", 1.0, machine, [failed]), report.CPU)
    assert [r.what for r in kept.runs[0].rows] == ["subset_damping: did not complete"]


def test_the_results_check_fails_on_a_shown_benchmark_missing_from_the_summary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import json

    import _results_md as report
    import run_all
    from _stamp import MEASURED

    results = _results_in(tmp_path, monkeypatch)
    data = {MEASURED: {"source": "commit 0000000", "cpu": "test CPU", "cores": 2}, "runs": {}}
    (results / "subset_damping.json").write_text(json.dumps(data))
    summary = report.Summary("2026-01-01 00:00", 60.0, _machine(data[MEASURED]), [])
    (results / "summary.json").write_text(json.dumps(summary.record()))
    report.write(summary, report.CPU)
    (problem,) = run_all.check_reports()
    assert "summary.json holds the runs [], where the report shows ['subset_damping']" in problem


def test_a_benchmark_run_when_named_on_both_devices_stays_in_the_cpu_report(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import json

    import _common as c
    import _registry as registry
    import _results_md as report

    named = [n for n in registry.MODULES if n not in registry.defaults()]
    both = next(n for n in named if registry.get(n).devices == ("cpu", "cuda"))
    results = tmp_path / "results"
    results.mkdir()
    monkeypatch.setattr(c, "RESULTS_DIR", results)
    assert both not in report.CPU.shown()  # no results recorded: not shown
    (results / f"{both}.json").write_text(json.dumps({"rows": []}))
    assert both in report.CPU.shown()


def test_a_stamp_says_not_recorded_for_what_an_older_result_lacks() -> None:
    from _rows import Row, row
    from _stamp import MEASURED, stamp, stamp_record

    assert stamp(None).cell("commit 1", "") == "not recorded; not recorded"
    assert stamp({"machine": "AMD EPYC"}).cell("commit 1", "") == "not recorded; AMD EPYC"
    edited = {"machine": {"source": "commit 351b946 with uncommitted edits in 1 files"}}
    assert stamp(edited).cell("commit 1", "") == "351b946 + edits, an earlier run; not recorded"
    ours = stamp_record({"source": "commit 2", "cpu": "C", "cores": 2, "torch": "x"}, "2026-01-02")
    assert stamp({MEASURED: ours}).cell("commit 2", "2026-01-01") == "2; C, 2 cores"
    assert stamp({MEASURED: ours}).cell("commit 1", "2026-01-01") == "2, another run; C, 2 cores"
    recorded = row("x", 1.0, None).record()
    del recorded["source"]  # a row of a summary.json written before rows named their source
    assert Row.load(recorded) == row("x", 1.0, None)
