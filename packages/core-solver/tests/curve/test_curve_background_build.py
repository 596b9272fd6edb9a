"""Kernels built without blocking the call (``_curve.kernel_cache.background``, ``build_lock``):
a default call without a kept kernel runs eagerly and leaves the kernel for the next
process; two processes never build one key; a killed build leaves no corrupt artifact and
no stale lock. The lock tests drive ``artifacts.keep`` with a stand-in build; one test
compiles a tiny model for real and waits for its builds."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import marquardt.solver._curve.compiled_lm as compiled
import marquardt.solver._curve.kernel_cache.artifacts as artifacts
from marquardt.solver import cache, curve_fit_batch
from marquardt.solver._curve.kernel_cache import background, build_lock, progress

FITS, POINTS = 500, 12  # M·N·P = 12,000: above COMPILE_WORK, far below an inline compile


@pytest.fixture
def builds_on(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Any:
    """A fresh cache folder with background builds on; every build ended afterwards."""
    monkeypatch.setenv("MARQUARDT_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("MARQUARDT_SOLVER_BACKGROUND_BUILD", "1")
    compiled.forget()
    yield tmp_path / "compiled"
    background.cancel()
    compiled.forget()


def _decays() -> dict[str, Any]:
    rng = np.random.default_rng(5)
    t = np.linspace(0.0, 3.0, POINTS)
    a, k = rng.uniform(1, 2, (FITS, 1)), rng.uniform(0.5, 1.5, (FITS, 1))
    y = a * np.exp(-k * t) + rng.normal(0, 0.01, (FITS, POINTS))
    return {"xdata": t, "ydata": y, "p0": np.c_[a, k] * 1.2}


NEXT_PROCESS = r"""
import json, sys
import numpy as np
from compiled_models import decay
from marquardt.solver import curve_fit_batch
from marquardt.solver._curve.kernel_cache import artifacts
problem = {k: np.asarray(v) for k, v in json.loads(sys.stdin.read()).items()}
popt, pcov, info = curve_fit_batch(decay, **problem, full_output=True)
print(json.dumps({"stats": artifacts.STATS, "popt": popt.tolist(), "compiled": info["compiled"]}))
"""


def test_a_default_call_runs_eagerly_now_and_leaves_its_kernels_for_the_next_process(
    builds_on: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from compiled_models import decay

    traced_here: list[int] = []  # the builder's appends stay in the builder
    make_fx = compiled.make_fx

    def counted(*args: Any, **kwargs: Any) -> Any:
        traced_here.append(os.getpid())
        return make_fx(*args, **kwargs)

    monkeypatch.setattr(compiled, "make_fx", counted)
    problem = _decays()
    eager = curve_fit_batch(decay, **problem, full_output=True, compile=False)
    started = time.perf_counter()
    first = curve_fit_batch(decay, **problem, full_output=True)
    seconds = time.perf_counter() - started
    # Eager now: nothing compiled in the call, whose time is far below one compile's.
    assert not first[2]["compiled"] and first[2]["compile_seconds"] == 0
    assert seconds < 0.5 * compiled.COMPILE_SECONDS
    np.testing.assert_array_equal(first[0], eager[0])
    assert background.wait(timeout=background.BUILD_SECONDS)
    # Nothing was traced in the calling process: the forked builder traced the kernels.
    assert traced_here == []
    kinds = sorted(e["description"]["kind"] for e in cache.entries())
    # The model's kernel serves the start state and each trial; the attempt's, the
    # decision's and the covariance's are of no model (one per parameter count).
    assert kinds == ["attempt", "covariance", "decide", "evaluation"], cache.entries()
    assert build_lock.builds(builds_on) == [] and not list(builds_on.glob(".tmp-*"))
    tests = str(Path(__file__).resolve().parents[1])
    done = subprocess.run(
        [sys.executable, "-c", NEXT_PROCESS],
        env={
            **os.environ,
            "PYTHONPATH": os.pathsep.join([tests, os.environ.get("PYTHONPATH", "")]),
        },
        input=json.dumps({k: np.asarray(v).tolist() for k, v in problem.items()}),
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    got = json.loads(done.stdout.splitlines()[-1])
    assert got["compiled"] and got["stats"]["loaded"] == 4 and got["stats"]["compiled"] == 0
    assert "compiling" not in done.stderr
    # Compiled and eager answers agree in float64.
    np.testing.assert_allclose(got["popt"], eager[0], rtol=1e-8, atol=1e-10)


def test_a_call_with_other_tolerances_queues_its_own_attempt_and_decision(
    builds_on: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from compiled_models import decay

    queued: list[list[str]] = []

    def start(jobs: list[background.Job]) -> bool:
        queued.append(sorted(str(job.description["kind"]) for job in jobs))
        return False  # nothing is built: the test asks what each call queues

    monkeypatch.setattr(background, "start", start)
    problem = _decays()
    curve_fit_batch(decay, **problem)
    # The model's kernel was queued by the first call: the second, with other tolerances,
    # still queues the attempt and the decision its tolerances bake in.
    curve_fit_batch(decay, **problem, ftol=1e-4, max_nfev=11)
    assert len(queued) == 2, queued
    assert queued[0] == ["attempt", "covariance", "decide", "evaluation"], queued
    assert queued[1] == ["attempt", "decide"], queued


BUILDER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    import marquardt.solver._curve.kernel_cache.artifacts as artifacts
    folder, value, pause = Path(sys.argv[1]), sys.argv[2], float(sys.argv[3])
    def build(path):
        with open(folder.parent / "builds.log", "a") as log:
            log.write(value + "\\n")
        Path(path).write_text(value * 1000)  # half made ...
        time.sleep(pause)                     # ... while the builder holds the key
    kept = artifacts.keep(folder, "shared", {"name": "m", "kind": "iteration"}, build, 60.0)
    print(kept)
    """
)


def _builder(folder: Path, value: str, pause: float) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", BUILDER, str(folder), value, str(pause)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _kept(folder: Path) -> Path:
    return artifacts._verified(folder, "shared")


def test_two_processes_asking_for_one_key_build_it_once(builds_on: Path) -> None:
    folder, tmp_path = builds_on, builds_on.parent
    folder.mkdir(mode=0o700)
    builders = [_builder(folder, v, 2.0) for v in "ab"]
    outs = [b.communicate(timeout=120) for b in builders]
    assert [b.returncode for b in builders] == [0, 0], outs
    built = (tmp_path / "builds.log").read_text().split()
    assert len(built) == 1, built
    # The one that waited got the other's package.
    assert {out.strip() for out, _ in outs} == {str(_kept(folder))}
    assert _kept(folder).read_text() == built[0] * 1000
    assert not list(folder.glob(".build-*.lock")) and not list(folder.glob(".tmp-*"))


def test_a_killed_build_leaves_no_corrupt_artifact_and_no_stale_lock(builds_on: Path) -> None:
    folder = builds_on
    folder.mkdir(mode=0o700)
    victim = _builder(folder, "a", 60.0)
    deadline = time.monotonic() + 60
    while not list(folder.glob(".tmp-shared-*.pt2")) and time.monotonic() < deadline:
        time.sleep(0.1)
    listed = build_lock.builds(folder)
    assert [b["pid"] for b in listed] == [victim.pid] and listed[0]["name"] == "m"
    os.kill(victim.pid, signal.SIGKILL)
    victim.wait(timeout=30)
    # No manifest names the half-made package, and the lock died with its holder: the
    # listing shows no build and removes the file, and the next builder goes at once.
    with pytest.raises(FileNotFoundError):
        _kept(folder)
    assert build_lock.builds(folder) == [] and not list(folder.glob(".build-*.lock"))
    started = time.perf_counter()
    again = _builder(folder, "b", 0.0)
    assert again.wait(timeout=120) == 0
    assert time.perf_counter() - started < 60
    assert _kept(folder).read_text() == "b" * 1000
    assert not list(folder.glob(".tmp-*"))


def test_a_cancelled_background_build_leaves_nothing(builds_on: Path) -> None:
    def trace() -> tuple[torch.fx.GraphModule, list[torch.Tensor]]:
        return torch.fx.symbolic_trace(torch.nn.Linear(2, 1)), [torch.zeros(3, 2)]

    artifacts.writable_folder()
    job = background.Job("k-cancel", {"name": "lin", "kind": "iteration"}, trace, 1)
    assert background.start([job])
    assert not background.start([job])  # once per process and key
    deadline = time.monotonic() + 60
    while not build_lock.builds(builds_on) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert [b["key"] for b in build_lock.builds(builds_on)] == ["k-cancel"]
    assert background.cancel() == 1
    assert build_lock.builds(builds_on) == []
    assert not (builds_on / "k-cancel.json").exists() and not list(builds_on.glob(".tmp-*"))


def _doubled(x: torch.Tensor) -> torch.Tensor:
    return 2.0 * x + 1.0


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two cores")
def test_a_builder_forked_from_a_process_that_ran_on_two_threads_builds_for_two(
    builds_on: Path,
) -> None:
    # The caller's OpenMP threads are not in a forked child: a parallel region there waits
    # for them forever. The caller has run one; the kernel is built for two threads, on
    # inputs large enough that the compile's own operations run in parallel regions.
    torch.set_num_threads(2)
    assert float(torch.ones(4_000_000).sum()) == 4_000_000
    x = torch.linspace(0.0, 1.0, 400_000)

    def trace() -> tuple[torch.fx.GraphModule, list[torch.Tensor]]:
        return torch.fx.symbolic_trace(_doubled), [x]

    job = background.Job("k-threads", {"name": "doubled", "kind": "iteration"}, trace, 2)
    assert background.start([job])
    assert background.wait(timeout=180), (builds_on / "builds.log").read_text()
    kernel, bad = artifacts.load("k-threads", torch.device("cpu"))
    assert kernel is not None and not bad
    torch.testing.assert_close(kernel(x)[0], _doubled(x))
    assert not list(builds_on.glob(".tmp-*")) and build_lock.builds(builds_on) == []


def test_the_listing_shows_builds_in_progress(
    builds_on: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    builds_on.mkdir(mode=0o700, parents=True)
    builder = _builder(builds_on, "a", 60.0)
    try:
        deadline = time.monotonic() + 60
        while not build_lock.builds(builds_on) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert cache.main(["list"]) == 0
        out = capsys.readouterr().out
        assert f"building m iteration (pid {builder.pid}" in out
    finally:
        builder.kill()
        builder.wait()


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_an_inline_compile_says_what_it_compiles_that_it_is_alive_and_how_long(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(progress, "TICK", 0.02)
    screen = _Terminal()
    line = progress.CompileProgress("spot", "2 threads", 60.0, stream=screen)
    with line.alive("start"):
        time.sleep(0.1)
    with line.alive("iteration"):
        time.sleep(0.1)
    line.finish(False, 12.3)
    text = screen.getvalue()
    # Rewritten in place while it runs, naming each kernel, the expected time ...
    assert text.count("\r") >= 4 and "start for the model spot" in text
    assert "iteration for the model spot (on 2 threads; expected ~60 s)" in text
    assert text.endswith("compiled in 12.3 s\n")
    # ... and in a log, one line per call.
    log = io.StringIO()
    line = progress.CompileProgress("spot", "1 thread", 60.0, stream=log)
    with line.alive("start"):
        pass
    with line.alive("iteration"):
        pass
    line.finish(False, 4.0)
    assert log.getvalue().count("\n") == 1 and "\r" not in log.getvalue()
    assert "start for the model spot" in log.getvalue() and "iteration ... " in log.getvalue()


def test_compile_true_on_one_chunk_builds_its_tail_kernel_after_the_call(
    builds_on: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from compiled_models import decay

    from marquardt.solver._curve.kernel_cache import held

    monkeypatch.setattr(held, "TAIL_FITS", 64)  # a tail kernel for 200 of the 500 fits
    problem = _decays()
    # Starts far apart: the fits stop over many iterations, the last ones in the tail.
    problem["p0"] = problem["p0"] * np.random.default_rng(6).uniform(0.25, 2.5, (FITS, 2))
    eager = curve_fit_batch(decay, **problem, full_output=True, compile=False)
    compiles = artifacts.STATS["compiled"]
    first = curve_fit_batch(decay, **problem, full_output=True, compile=True)
    # Inline: the chunk's kernels (the model's, the attempt's and the decision's) and the
    # covariance's only.
    assert first[2]["compiled"] and artifacts.STATS["compiled"] == compiles + 4
    assert background.wait(timeout=background.BUILD_SECONDS)
    fits = sorted(e["description"]["fits"] for e in cache.entries())
    # The tail's three, built after the call.
    assert fits == [200] * 3 + [FITS] * 4, cache.entries()
    again = curve_fit_batch(decay, **problem, full_output=True, compile=True)
    assert again[2]["compile_seconds"] == 0 and artifacts.STATS["compiled"] == compiles + 4
    for got in (first, again):
        np.testing.assert_allclose(got[0], eager[0], rtol=1e-8, atol=1e-10)


@pytest.mark.parametrize(
    ("err", "said"),
    [
        (RuntimeError(), "RuntimeError"),
        (ValueError("shapes differ\nin the second line"), "ValueError: shapes differ"),
        (TypeError("x" * 400), "TypeError: " + "x" * 300),
    ],
)
def test_a_failure_is_logged_as_its_type_and_the_first_line_of_its_message(
    err: Exception, said: str
) -> None:
    assert background._failure("spot iteration 0123456789ab", err) == (
        f"failed spot iteration 0123456789ab: {said}"
    )
    assert background._failure("", err) == f"failed: {said}"


def test_a_build_failing_with_an_empty_message_is_logged(
    builds_on: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def keep(*args: Any) -> None:
        raise RuntimeError()

    monkeypatch.setattr(background.artifacts, "keep", keep)
    work = {
        "threads": torch.get_num_threads(),  # the builder sets it: left as it is
        "key": "0123456789abcdef",
        "description": {"name": "spot", "kind": "iteration"},
        "program": b"",
    }
    assert background._build(builds_on, work) == 1
    assert capsys.readouterr().err.endswith("failed spot iteration 0123456789ab: RuntimeError\n")
