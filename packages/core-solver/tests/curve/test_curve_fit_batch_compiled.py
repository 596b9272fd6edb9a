"""``curve_fit_batch(..., compile=...)``: the compiled iteration against the eager one, its
caches (in the process and kept on disk: a new process loads the kernels, a corrupt one
is rebuilt), and the eager fallbacks (a model that cannot be compiled, no compiler, a call
too small to repay a compile). Compiles are tens of seconds on a small CPU, so one tiny
problem is compiled once for the module and every compiled check reuses it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from compiled_models import spot

import marquardt.solver._curve.compiled_lm as compiled
import marquardt.solver._curve.kernel_cache.artifacts as artifacts
import marquardt.solver._curve.kernel_cache.held as held
from marquardt.devices import UntrustedCacheWarning, trust
from marquardt.solver import cache, curve_fit_batch
from marquardt.solver._errors import CompileWarning

FITS = 40


def branchy(t: torch.Tensor, a: Any, k: Any) -> torch.Tensor:
    # Python control flow on a tensor's value: traceable by vmap (t is shared), not by
    # the compiler's tracer.
    if t.sum() > 0:
        return a * torch.exp(-k * t)
    return a * torch.exp(k * t)


def decay(t: torch.Tensor, a: Any, k: Any) -> torch.Tensor:
    return a * torch.exp(-k * t)


def _spots(fits: int) -> dict[str, Any]:
    rng = np.random.default_rng(3)
    grid = np.stack(np.meshgrid(np.arange(4.0), np.arange(4.0), indexing="ij")).reshape(2, 16)
    true = np.c_[
        rng.uniform(80, 120, fits),
        1.5 + rng.uniform(-0.4, 0.4, (fits, 2)),
        rng.uniform(0.8, 1.2, fits),
        rng.uniform(5, 15, fits),
    ]
    x0, y0 = true[:, 1:2], true[:, 2:3]
    clean = true[:, :1] * np.exp(
        -0.5 * ((grid[0] - x0) ** 2 + (grid[1] - y0) ** 2) / true[:, 3:4] ** 2
    )
    y = clean + true[:, 4:] + rng.normal(0, 1.0, (fits, 16))
    p0 = true * rng.uniform(0.9, 1.1, true.shape)
    # Bounds hold some fits' parameters on the way, so the active set is exercised too.
    lower = np.array([0.0, 0.0, 0.0, 0.5, 0.0])
    upper = np.array([np.inf, 3.0, 3.0, 2.0, np.inf])
    return {"xdata": grid, "ydata": y, "p0": np.clip(p0, lower, upper), "bounds": (lower, upper)}


def _decays(fits: int) -> dict[str, Any]:
    rng = np.random.default_rng(4)
    t = np.linspace(0.0, 3.0, 12)
    a, k = rng.uniform(1, 2, (fits, 1)), rng.uniform(0.5, 1.5, (fits, 1))
    y = a * np.exp(-k * t) + rng.normal(0, 0.01, (fits, 12))
    return {"xdata": t, "ydata": y, "p0": np.c_[a, k] * 1.2}


@pytest.fixture(scope="module")
def spots() -> dict[str, Any]:
    problem = _spots(FITS)
    eager = curve_fit_batch(spot, **problem, full_output=True, compile=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error", CompileWarning)
        first = curve_fit_batch(spot, **problem, full_output=True, compile=True)
    return {"problem": problem, "eager": eager, "first": first}


def _agree(got: tuple[Any, ...], want: tuple[Any, ...]) -> None:
    np.testing.assert_allclose(got[0], want[0], rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(got[1], want[1], rtol=1e-7, atol=1e-12)
    for name in ("status", "nfev", "njev"):
        np.testing.assert_array_equal(got[2][name], want[2][name])


def test_the_compiled_iteration_gives_the_eager_results(spots: dict[str, Any]) -> None:
    first = spots["first"]
    assert first[2]["compiled"] and first[2]["compile_seconds"] > 0
    assert not spots["eager"][2]["compiled"] and spots["eager"][2]["compile_seconds"] == 0
    assert np.all(first[2]["status"] > 0)
    _agree(first, spots["eager"])


def test_a_second_call_reuses_the_kernel_and_fewer_fits_are_padded(
    spots: dict[str, Any],
) -> None:
    problem = spots["problem"]
    again = curve_fit_batch(spot, **problem, full_output=True, compile=True)
    assert again[2]["compiled"] and again[2]["compile_seconds"] == 0
    _agree(again, spots["eager"])
    # 30 of the 40 fits: padded up to the compiled 40 (at least PAD_SHARE of them); a
    # small call under "auto" uses the kernel this process already holds.
    fewer = {**problem, "ydata": problem["ydata"][:30], "p0": problem["p0"][:30]}
    part = curve_fit_batch(spot, **fewer, full_output=True)
    assert part[2]["compiled"] and part[2]["compile_seconds"] == 0
    want = curve_fit_batch(spot, **fewer, full_output=True, compile=False)
    _agree(part, want)
    # Chunks of 35 and 5: the first padded to 40, the second (under PAD_SHARE) eager.
    split = curve_fit_batch(spot, **problem, full_output=True, chunk_size=35)
    assert split[2]["compiled"] and split[2]["compile_seconds"] == 0
    _agree(split, spots["eager"])


def test_a_model_that_cannot_be_compiled_runs_eagerly_with_one_warning() -> None:
    problem = _decays(8)
    eager = curve_fit_batch(branchy, **problem, full_output=True, compile=False)
    with pytest.warns(CompileWarning, match="branchy") as caught:
        got = curve_fit_batch(branchy, **problem, full_output=True, compile=True)
    assert len([w for w in caught if w.category is CompileWarning]) == 1
    assert not got[2]["compiled"]
    _agree(got, eager)
    with warnings.catch_warnings():
        warnings.simplefilter("error", CompileWarning)
        again = curve_fit_batch(branchy, **problem, full_output=True, compile=True)
    _agree(again, eager)


def test_a_small_call_runs_eagerly_and_silently() -> None:
    problem = _decays(6)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = curve_fit_batch(decay, **problem, full_output=True)
    assert not got[2]["compiled"] and got[2]["compile_seconds"] == 0
    assert compiled.COMPILE_WORK > 6 * 12 * 2


def test_without_a_compiler_the_eager_path_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(compiled, "compiler_available", lambda device: False)
    problem = _decays(6)
    eager = curve_fit_batch(decay, **problem, full_output=True, compile=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        quiet = curve_fit_batch(decay, **problem, full_output=True, compile="auto")
    _agree(quiet, eager)

    def other(t: torch.Tensor, a: Any, k: Any) -> torch.Tensor:
        return a * torch.exp(-k * t)

    with pytest.warns(CompileWarning, match="no compiler"):
        forced = curve_fit_batch(other, **problem, full_output=True, compile=True)
    assert not forced[2]["compiled"]
    _agree(forced, eager)


def test_the_compile_keyword_is_checked_before_any_work() -> None:
    calls = []

    def counted(t: torch.Tensor, a: Any, k: Any) -> torch.Tensor:
        calls.append(1)
        return a * torch.exp(-k * t)

    with pytest.raises(ValueError, match="compile must be 'auto', True or False"):
        curve_fit_batch(counted, **_decays(4), compile="yes")
    assert calls == []


@pytest.mark.parametrize(
    ("fits", "size"),
    [(16_384, 16_384), (7_000, 16_384), (6_000, 6_554), (2_700, 6_554), (2_500, 0), (20_000, 0)],
)
def test_the_kernel_sizes_are_the_chunk_and_its_tail(fits: int, size: int) -> None:
    assert held.size_for(16_384, fits) == size
    # A small chunk has no tail kernel: its late fits run eagerly.
    assert held.size_for(40, 10) == 0 and held.size_for(40, 16) == 40


@pytest.mark.parametrize(
    ("fits", "background", "later"),
    [(16_384, "1", True), (40_000, "1", False), (16_384, "0", False)],
)
def test_only_a_call_of_one_chunk_leaves_its_tail_kernel_for_later(
    monkeypatch: pytest.MonkeyPatch, fits: int, background: str, later: bool
) -> None:
    monkeypatch.setenv("MARQUARDT_SOLVER_BACKGROUND_BUILD", background)
    cpu = torch.device("cpu")
    made = compiled.iterations(spot, True, cpu, fits * 49 * 5, 16_384, fits)
    assert made is not None and made.may_compile and made.tail_later is later


NEW_PROCESS = r"""
import json, sys
import numpy as np
from compiled_models import spot
from marquardt.solver import curve_fit_batch
from marquardt.solver._curve.kernel_cache import artifacts
problem = json.loads(sys.stdin.read())
problem = {k: np.asarray(v) if k != "bounds" else tuple(map(np.asarray, v)) for k, v in problem.items()}
popt, pcov, info = curve_fit_batch(spot, **problem, full_output=True)
print(json.dumps({"stats": artifacts.STATS, "popt": popt.tolist(), "compiled": info["compiled"]}))
"""


def test_a_new_process_loads_the_kept_kernels_without_compiling(spots: dict[str, Any]) -> None:
    problem = spots["problem"]
    sent = {k: np.asarray(v).tolist() for k, v in problem.items() if k != "bounds"}
    sent["bounds"] = [b.tolist() for b in problem["bounds"]]
    tests = str(Path(__file__).resolve().parents[1])
    path = os.pathsep.join([tests, os.environ.get("PYTHONPATH", "")])
    done = subprocess.run(
        [sys.executable, "-c", NEW_PROCESS],
        env={**os.environ, "PYTHONPATH": path},
        input=json.dumps(sent),
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    got = json.loads(done.stdout.splitlines()[-1])
    # Under "auto" this call is far too small to compile: it ran compiled because the
    # kernels kept by the first call were loaded.
    # the model's kernel (f, J and the normal equations: the start state and each trial),
    # the attempt's, the decision's and the covariance's (these three of no model)
    assert got["stats"]["loaded"] == 4, (got["stats"], done.stderr[-2000:])
    assert got["compiled"] and got["stats"]["compiled"] == 0
    assert "compiling" not in done.stderr
    np.testing.assert_allclose(got["popt"], spots["eager"][0], rtol=1e-10, atol=1e-12)


def test_a_corrupt_kept_kernel_is_rebuilt_with_one_warning(
    spots: dict[str, Any], capfd: pytest.CaptureFixture[str]
) -> None:
    iteration = [e for e in cache.entries() if e["description"]["kind"] == "evaluation"]
    assert len(iteration) == 1
    package = Path(cache.folder()) / iteration[0]["package"]
    package.write_bytes(package.read_bytes()[: package.stat().st_size // 2])
    compiled.forget()
    rebuilt = artifacts.STATS["rebuilt"]
    with pytest.warns(CompileWarning, match="cannot be used") as caught:
        got = curve_fit_batch(spot, **spots["problem"], full_output=True)
    assert len([w for w in caught if w.category is CompileWarning]) == 1
    assert artifacts.STATS["rebuilt"] == rebuilt + 1
    assert got[2]["compiled"] and got[2]["compile_seconds"] > 0
    err = capfd.readouterr().err
    assert "compiling curve_fit_batch's evaluation for the model spot" in err
    assert f"expected ~{compiled.COMPILE_SECONDS:.0f} s" in err and "compiled in" in err
    _agree(got, spots["eager"])
    kernel, bad = artifacts.load(iteration[0]["key"], torch.device("cpu"))
    assert kernel is not None and not bad


@pytest.mark.parametrize("kind", ["folder 0777", "package 0666", "folder of another user"])
def test_kernels_others_could_have_written_are_not_loaded_and_the_fit_runs_eagerly(
    spots: dict[str, Any], monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    folder = Path(cache.folder())
    packages = sorted(folder.glob("*.pt2"))
    assert packages, "the module's compile kept its kernels"
    if kind == "folder of another user" and os.geteuid() != 0:
        pytest.skip("chown to another user needs root (the CI containers run as root)")
    monkeypatch.setattr(trust, "_WARNED", set())
    compiled.forget()
    loaded = artifacts.STATS["loaded"]
    try:
        if kind == "folder 0777":
            folder.chmod(0o777)
        elif kind == "package 0666":
            for package in packages:
                package.chmod(0o666)
        else:
            os.chown(folder, 12345, 12345)
        with pytest.warns(UntrustedCacheWarning, match="HINT: chmod go-w"):
            got = curve_fit_batch(spot, **spots["problem"], full_output=True)
    finally:
        folder.chmod(0o700)
        os.chown(folder, os.geteuid(), os.getegid())
        for package in packages:
            package.chmod(0o600)
        compiled.forget()
    assert artifacts.STATS["loaded"] == loaded and not got[2]["compiled"]
    _agree(got, spots["eager"])
    np.testing.assert_allclose(got[0], spots["first"][0], rtol=1e-8, atol=1e-10)


def test_a_load_change_between_two_calls_compiles_nothing_new(spots: dict[str, Any]) -> None:
    problem = spots["problem"]
    compiles = artifacts.STATS["compiled"]
    # One kernel for every thread count: the call's threads (which follow the machine's
    # load by default) choose no other kernel.
    calls = [curve_fit_batch(spot, **problem, full_output=True, threads=n) for n in (1, 2)]
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    try:
        time.sleep(1.0)  # a neighbour busy on every core between two default calls
        calls.append(curve_fit_batch(spot, **problem, full_output=True))
    finally:
        for loop in busy:
            loop.kill()
            loop.wait()
    for got in calls:
        assert got[2]["compiled"] and got[2]["compile_seconds"] == 0
        np.testing.assert_array_equal(got[0], calls[0][0])
    assert artifacts.STATS["compiled"] == compiles
